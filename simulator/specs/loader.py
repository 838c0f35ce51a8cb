"""The only place that reads spec files. Every failure becomes a SpecError naming the file,
the field and the reason, so the CLI can print one line and exit 2."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from simulator.errors import SpecError
from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import HardwareSpec
from simulator.specs.hf import ConfigKeyError, from_hf_config
from simulator.specs.model import ModelSpec

_PACKAGE_DIR = Path(__file__).resolve().parent
MODELS_DIR = _PACKAGE_DIR / "models"
ENGINES_DIR = _PACKAGE_DIR / "engines"
# The hardware specs live at the top of the repository (`hardware_specs/`); an installed wheel
# carries a copy inside the package (simulator/hardware_specs). LLMSIM_HARDWARE_PATH adds
# folders of the user's own.
_HARDWARE_CANDIDATES = (
    _PACKAGE_DIR.parents[1] / "hardware_specs",
    _PACKAGE_DIR.parent / "hardware_specs",
)

T = TypeVar("T", bound=BaseModel)
CALIBRATION_DIR = "calibration"


def hardware_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("LLMSIM_HARDWARE_PATH", "").split(os.pathsep) if p]
    return [d for d in (*extra, *_HARDWARE_CANDIDATES) if d.is_dir()]


def read_yaml(path: Path) -> Any:
    """safe_load a YAML file; errors name the file and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read file ({exc.strerror})", source=str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise SpecError(f"malformed YAML: {problem}", source=str(path), field=where) from None


def validation_error(exc: ValidationError, *, source: str) -> SpecError:
    """The first pydantic error as a SpecError with a dotted field path."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling)"
    return SpecError(msg, source=source, field=loc)


def validate(model: type[T], data: Any, *, source: str) -> T:
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", source=source)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, source=source) from None


# -- hardware ---------------------------------------------------------------------------------
def list_hardware() -> list[str]:
    """Ids of every hardware spec found (file names without .yaml), sorted."""
    return sorted({p.stem for d in hardware_dirs() for p in d.glob("*.yaml")})


def _hardware_path(hw: str) -> Path:
    if hw.endswith((".yaml", ".yml")) or os.sep in hw:
        return Path(hw)
    for d in hardware_dirs():
        if (d / f"{hw}.yaml").is_file():
            return d / f"{hw}.yaml"
    known = ", ".join(list_hardware())
    raise SpecError(f"unknown hardware id (known: {known})", source=hw, field="hardware")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid onto `base`, recursing into mappings."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


ATTENTION_FROM = "attention_from"


@cache
def _load_hardware_file(path: Path, calibrated: bool) -> HardwareSpec:
    overlay = path.parent / CALIBRATION_DIR / path.name
    fitted = read_yaml(overlay) if calibrated and overlay.is_file() else None
    return _overlaid_hardware(path, fitted, calibrated=calibrated, source=str(overlay))


def _overlaid_hardware(
    path: Path, fitted: Any, *, calibrated: bool = True, source: str
) -> HardwareSpec:
    """The spec in `path`, its attention taken from a sibling where it says so
    (`_sibling_attention`), with `fitted` (a calibration overlay, or None) laid over it."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", source=str(path))
    data = _sibling_attention({**data, "id": path.stem}, path, calibrated=calibrated)
    if fitted is None:
        return validate(HardwareSpec, data, source=str(path))
    if not isinstance(fitted, dict) or set(fitted) != {"efficiency"}:
        raise SpecError("expected only an 'efficiency' mapping", source=source)
    try:
        return HardwareSpec.model_validate(_merge(data, fitted))
    except ValidationError as exc:
        raise validation_error(exc, source=source) from None


def _sibling_attention(data: dict[str, Any], path: Path, *, calibrated: bool) -> dict[str, Any]:
    """`efficiency.attention_from: ID` (a device of the same die running the same kernels,
    e.g. H200 from H100 SXM): the attention efficiency as that device's spec has it (fitted
    to its operator data when `calibrated`), as fractions of this device's own peak and
    bandwidth, and its `attention_kernels` unless this file gives its own. The named device
    must describe its attention itself."""
    eff = data.get("efficiency")
    if not isinstance(eff, dict) or ATTENTION_FROM not in eff:
        return data
    field = f"efficiency.{ATTENTION_FROM}"
    sibling_id = eff[ATTENTION_FROM]
    if not isinstance(sibling_id, str):
        raise SpecError("expected a hardware id", source=str(path), field=field)
    if "attention" in eff:
        raise SpecError(
            f"give either 'attention' or '{ATTENTION_FROM}', not both",
            source=str(path),
            field=field,
        )
    try:
        sibling_path = _hardware_path(sibling_id).resolve()
    except SpecError as exc:
        raise SpecError(exc.reason, source=str(path), field=field) from None
    raw = read_yaml(sibling_path)
    sibling_eff = raw.get("efficiency") if isinstance(raw, dict) else None
    if sibling_path == path or (isinstance(sibling_eff, dict) and ATTENTION_FROM in sibling_eff):
        raise SpecError(
            f"{sibling_id} takes its attention from another device: name one that describes "
            "its own",
            source=str(path),
            field=field,
        )
    sibling = _load_hardware_file(sibling_path, calibrated).efficiency
    eff = {k: v for k, v in eff.items() if k != ATTENTION_FROM}
    eff["attention"] = sibling.attention.model_dump()
    if "attention_kernels" not in eff and sibling.attention_kernels:
        eff["attention_kernels"] = {
            name: kernel.model_dump() for name, kernel in sibling.attention_kernels.items()
        }
    return {**data, "efficiency": eff}


def calibrated_hardware(hw: str, fitted: Any) -> HardwareSpec:
    """The hand-written spec of `hw` with `fitted` (what a `calibration/<id>.yaml` holds)
    laid over it, as `load_hardware` lays the committed file: `python -m simulator.calibrate
    --check` builds the refit's spec with it."""
    path = _hardware_path(hw).resolve()
    return _overlaid_hardware(path, fitted, source=f"{hw} (refit)")


def load_hardware(hw: str, *, calibrated: bool = True) -> HardwareSpec:
    """A hardware spec by id (`h100_sxm`) or by path to a YAML file of the same schema.

    Where `calibration/<id>.yaml` sits beside the file (written by `python -m
    simulator.calibrate`), its fitted efficiency factors replace the hand-written ones;
    `calibrated=False` gives the hand-written spec alone."""
    return _load_hardware_file(_hardware_path(hw).resolve(), calibrated)


# -- models -----------------------------------------------------------------------------------
def list_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


@cache
def _load_model_file(path: Path, model_id: str) -> ModelSpec:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"cannot read file ({exc.strerror})", source=str(path)) from None
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"malformed JSON: {exc.msg}", source=str(path), field=f"line {exc.lineno}"
        ) from None
    if not isinstance(cfg, dict):
        raise SpecError("expected a JSON object", source=str(path))
    try:
        spec = from_hf_config(cfg, name=model_id)
    except ConfigKeyError as exc:
        raise SpecError(exc.reason, source=str(path), field=exc.key) from None
    except ValidationError as exc:
        raise validation_error(exc, source=str(path)) from None
    return spec.model_copy(update={"id": model_id})


def load_model(model: str) -> ModelSpec:
    """A model by catalogue id (`llama-3.1-8b`) or by path to a Hugging Face config.json."""
    builtin = MODELS_DIR / f"{model}.json"
    if builtin.is_file():
        return _load_model_file(builtin, model)
    path = Path(model)
    if path.suffix == ".json" or path.is_file() or path.is_dir():
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise SpecError("no such file", source=str(path), field="model")
        return _load_model_file(path.resolve(), str(path))
    known = ", ".join(list_models())
    raise SpecError(
        f"unknown model id (known: {known}; or a path to config.json)", source=model, field="model"
    )


# -- engines ----------------------------------------------------------------------------------
def list_engines() -> list[str]:
    return sorted(p.stem for p in ENGINES_DIR.glob("*.yaml"))


@cache
def _load_engine_file(path: Path, calibrated: bool = True) -> EngineSpec:
    return validate(EngineSpec, _engine_data(path, calibrated), source=str(path))


def _engine_path(engine: str, *, relative_to: Path | None = None) -> Path:
    """The file of an engine given by id or by path to a YAML file (a relative path is taken
    from `relative_to` when given: a `base:` names its file from the profile's folder)."""
    if engine.endswith((".yaml", ".yml")):
        path = Path(engine)
        if relative_to is not None and not path.is_absolute():
            path = relative_to / path
        return path.resolve()
    path = ENGINES_DIR / f"{engine}.yaml"
    if not path.is_file():
        known = ", ".join(list_engines())
        raise SpecError(f"unknown engine (known: {known})", source=engine, field="engine")
    return path


def _engine_data(
    path: Path, calibrated: bool, *, fitted: Any = None, chain: tuple[Path, ...] = ()
) -> dict[str, Any]:
    """The profile in `path` as a mapping, before validation. A `base:` (an engine id, or a
    path to a YAML file relative to this one) starts it from that profile, resolved the same
    way (with its calibration when `calibrated`) and valid on its own, and lays this file's
    keys over it, mappings key by key, lists and values replaced; then this profile's own
    calibration (`fitted`, else the committed `calibration/<id>.yaml` when `calibrated`)
    replaces its CPU overheads."""
    if path in chain:
        cycle = " -> ".join(p.stem for p in (*chain, path))
        raise SpecError(f"base profiles form a cycle ({cycle})", source=str(path), field="base")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", source=str(path))
    base = data.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise SpecError(
                "expected an engine id or a path to a YAML file", source=str(path), field="base"
            )
        try:
            base_path = _engine_path(base, relative_to=path.parent)
        except SpecError as exc:
            raise SpecError(exc.reason, source=str(path), field="base") from None
        if not base_path.is_file():
            raise SpecError(f"no such file: {base_path}", source=str(path), field="base")
        base_data = _engine_data(base_path, calibrated, chain=(*chain, path))
        validate(EngineSpec, base_data, source=str(base_path))  # a base is a profile of its own
        data = _merge(base_data, data)
    data["id"] = path.stem
    source = str(path.parent / CALIBRATION_DIR / path.name)
    if fitted is None and calibrated and Path(source).is_file():
        fitted = read_yaml(Path(source))
    elif fitted is not None:
        source = f"{path.stem} (refit)"
    if fitted is not None:
        if not isinstance(fitted, dict) or set(fitted) != {"overhead"}:
            raise SpecError("expected only an 'overhead' mapping", source=source)
        data = _merge(data, fitted)
    return data


def calibrated_engine(engine: str, fitted: Any) -> EngineSpec:
    """The engine profile `engine` (an id) with `fitted` (what a `calibration/<id>.yaml`
    holds) laid over it, as `load_engine` lays the committed file."""
    path = ENGINES_DIR / f"{engine}.yaml"
    return validate(EngineSpec, _engine_data(path, True, fitted=fitted), source=str(path))


def load_engine(engine: str, *, calibrated: bool = True) -> EngineSpec:
    """An engine profile by id (`vllm`) or by path to a YAML file of the same schema, which may
    start from another profile (`base: vllm`) and give only what differs; a
    `calibration/<id>.yaml` beside it (from `python -m simulator.calibrate`) replaces its
    CPU overheads unless `calibrated=False`."""
    return _load_engine_file(_engine_path(engine), calibrated)
