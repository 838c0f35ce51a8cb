"""The only place that reads spec files. Every failure becomes a SpecError naming the file,
the field and the reason, so the CLI can print one line and exit 2."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from simulator.errors import SpecError, did_you_mean
from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import EfficiencySpec, HardwareSpec, HostCpu
from simulator.specs.hf import ConfigKeyError, from_hf_config
from simulator.specs.model import ModelSpec

_PACKAGE_DIR = Path(__file__).resolve().parent
MODELS_DIR = _PACKAGE_DIR / "models"
HF_IDS_FILE = MODELS_DIR / "hf_ids.yaml"
ENGINES_DIR = _PACKAGE_DIR / "engines"
HOST_CPUS_FILE = _PACKAGE_DIR / "host_cpus.yaml"
FUSED_MOE_CONFIGS_FILE = _PACKAGE_DIR / "fused_moe_configs.yaml"
NO_MOE_CONFIGS = "none"  # a `fused_moe_configs` release that ships no configuration
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


# The most a spec file (hardware, engine profile, model config, scenario, sweep, plan, golden)
# may hold: the largest bundled one is under 1 MiB, so this is far above any real spec, and a
# device or a wrong file (`--hardware /dev/zero`, a checkpoint) is refused after reading this
# much instead of read until memory runs out.
MAX_SPEC_BYTES = 16 * 2**20
# Data files read whole into memory (request traces, ShareGPT JSON): ShareGPT's file, the
# largest such dataset vLLM's bench reads, is about 0.7 GB.
MAX_DATA_BYTES = 4 * 2**30


def too_large(limit: int, what: str) -> str:
    """The reason a file over `limit` bytes is refused."""
    return f"larger than {limit / 2**20:,.0f} MiB, the most {what} may be"


def check_data_file(path: Path, *, source: str, field: str = "") -> None:
    """A data file read whole (a trace, a ShareGPT file) must be a regular file of at most
    MAX_DATA_BYTES: a device or a pipe (`/dev/zero`) would be read until memory runs out.
    A missing file is left to the reader, which names it its own way."""
    try:
        st = path.stat()
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise SpecError("not a regular file", source=source, field=field)
    if st.st_size > MAX_DATA_BYTES:
        raise SpecError(too_large(MAX_DATA_BYTES, "a data file"), source=source, field=field)


def read_text(path: Path, *, limit: int = MAX_SPEC_BYTES) -> str:
    """A UTF-8 text file's contents; a file that cannot be read, is not UTF-8 text or is larger
    than `limit` bytes is a SpecError naming it (at most `limit` + 1 bytes are read, so a device
    that never ends is refused too)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"cannot read file ({exc.strerror})", source=str(path)) from None
    if len(data) > limit:
        raise SpecError(too_large(limit, "a spec file"), source=str(path))
    try:
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})",
            source=str(path),
        ) from None


# libyaml's parser where PyYAML was built with it (its wheels are): the same documents and
# marks, several times faster than the pure-Python one (start-up reads dozens of spec files)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# YAML aliases may repeat what an anchor holds; a document whose aliases expand it beyond
# both numbers below is refused (a "billion laughs": nine nested lists of nine aliases are 9**9
# values written in nine lines, which a sweep's grid would multiply out). Real spec files use
# aliases to repeat a replica group or a curve a few times, far below either bound.
MAX_ALIAS_GROWTH = 10  # expanded nodes per node written
MAX_ALIAS_NODES = 10_000  # expanded nodes allowed whatever the growth


def read_yaml(path: Path) -> Any:
    """safe_load a YAML file; errors name the file and the line. A mapping that sets one key
    twice is an error (PyYAML would keep the last silently), and so are aliases that expand
    the document past MAX_ALIAS_GROWTH times its size (and MAX_ALIAS_NODES nodes), and nesting
    deeper than the parser or Python's stack takes."""
    loader = SAFE_LOADER(read_text(path))  # safe_load's own steps, the node checked between
    try:
        node = loader.get_single_node()
        _check_nodes(node)
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise SpecError(f"malformed YAML: {problem}", source=str(path), field=where) from None
    except RecursionError:
        raise SpecError("malformed YAML: nested too deeply", source=str(path)) from None
    finally:
        loader.dispose()


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_nodes(node: yaml.Node | None) -> None:
    """Raise a YAML error at the second occurrence of a key in any mapping under `node`, or
    when aliases expand the document past the bounds above (an alias of an anchor it is inside
    expands without end)."""
    if node is None:
        return
    _refuse_duplicate_keys(node)
    expanded: dict[int, int] = {}  # node -> nodes it stands for, aliases expanded
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, done = stack.pop()
        key = id(current)
        if done:
            on_path.discard(key)
            expanded[key] = 1 + sum(expanded[id(c)] for c in _children(current))
            continue
        if key in expanded:
            continue
        if key in on_path:
            raise yaml.MarkedYAMLError(
                problem="an alias inside its own anchor (a recursive document)",
                problem_mark=current.start_mark,
            )
        on_path.add(key)
        stack.append((current, True))
        stack += [(c, False) for c in _children(current) if id(c) not in expanded]
    total = expanded[id(node)]
    if total > max(MAX_ALIAS_NODES, MAX_ALIAS_GROWTH * len(expanded)):
        raise yaml.MarkedYAMLError(
            problem=f"aliases expand {len(expanded):,} written values to {total:,} (more "
            f"than {MAX_ALIAS_GROWTH}x and {MAX_ALIAS_NODES:,}): write the values out",
            problem_mark=node.start_mark,
        )


def _refuse_duplicate_keys(node: yaml.Node) -> None:
    """Raise a YAML error at the second occurrence of a key in any mapping under `node`."""
    stack = [node]
    seen_nodes: set[int] = set()  # anchors make a graph; visit each node once
    while stack:
        current = stack.pop()
        if id(current) in seen_nodes:
            continue
        seen_nodes.add(id(current))
        if isinstance(current, yaml.MappingNode):
            keys: set[str] = set()
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in keys:
                        raise yaml.MarkedYAMLError(
                            problem=f"duplicate key '{key.value}'", problem_mark=key.start_mark
                        )
                    keys.add(key.value)
                stack += [key, value]
        elif isinstance(current, yaml.SequenceNode):
            stack += current.value


UNKNOWN_FIELD = "unknown field (check the spelling)"


def validation_error(exc: ValidationError, *, source: str) -> SpecError:
    """The first pydantic error as a SpecError with a dotted field path."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = UNKNOWN_FIELD
    return SpecError(msg, source=source, field=loc)


def validate(model: type[T], data: Any, *, source: str) -> T:
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", source=source)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, source=source) from None


def beside(folder: Path, ref: str, known: Iterable[str]) -> str:
    """`ref` read from a file in `folder`: a relative path to a file or folder there is joined
    to `folder`; an id in `known`, an absolute path and anything not found there stay as they
    are (ids, and paths from the working directory)."""
    if not ref or ref in known or Path(ref).is_absolute() or not (folder / ref).exists():
        return ref
    return str(folder / ref)


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
    known = list_hardware()
    raise SpecError(
        f"unknown hardware id{did_you_mean(hw, known)} (known: {', '.join(known)})",
        source=hw,
        field="hardware",
    )


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
COLLECTIVE_FROM = "collective_from"
BASE = "base"
# What a sibling device lends (`efficiency.<key>_from: ID`): the efficiency keys it carries.
SIBLING_KEYS = {
    ATTENTION_FROM: ("attention", "attention_kernels"),
    COLLECTIVE_FROM: ("collective",),
}


def _check_chain(path: Path, chain: tuple[Path, ...], what: str) -> None:
    if path in chain:
        cycle = " -> ".join(p.stem for p in (*chain, path))
        raise SpecError(f"base {what} form a cycle ({cycle})", source=str(path), field=BASE)


def _base_data(
    data: dict[str, Any],
    path: Path,
    *,
    what: str,
    find: Callable[[str], Path],
    load: Callable[[Path], dict[str, Any]],
    model: type[BaseModel],
) -> dict[str, Any] | None:
    """Pop `base:` (an id, or a path to a YAML file relative to `path`'s folder) from `data`
    and return what that file holds, resolved by `load` and valid on its own (an error in it
    names its file), or None where `data` names no base. `find` turns an id into its file."""
    base = data.pop(BASE, None)
    if base is None:
        return None
    if not isinstance(base, str):
        raise SpecError(
            f"expected {what} id or a path to a YAML file", source=str(path), field=BASE
        )
    if base.endswith((".yaml", ".yml")) or os.sep in base:
        base_path = (path.parent / base).resolve()
    else:
        try:
            base_path = find(base).resolve()
        except SpecError as exc:
            raise SpecError(exc.reason, source=str(path), field=BASE) from None
    if not base_path.is_file():
        raise SpecError(f"no such file: {base_path}", source=str(path), field=BASE)
    base_data = load(base_path)
    validate(model, base_data, source=str(base_path))
    return base_data


def calibration_beside(path: Path) -> Path:
    """Where the calibration of the spec file `path` lives: `calibration/<file name>` beside it
    (the file the loader lays over the spec when it exists)."""
    return path.parent / CALIBRATION_DIR / path.name


def _calibration(
    path: Path, calibrated: bool, fitted: Any, key: str
) -> tuple[dict[str, Any] | None, str]:
    """The calibration laid over the spec in `path` and the name its errors go under: `fitted`
    (a refit, named "<id> (refit)") when given, else `calibration/<file name>` beside the file
    when `calibrated` and it exists, else None. It must hold only the `key` mapping."""
    source = str(calibration_beside(path))
    if fitted is None and calibrated and Path(source).is_file():
        fitted = read_yaml(Path(source))
    elif fitted is not None:
        source = f"{path.stem} (refit)"
    if fitted is not None and (not isinstance(fitted, dict) or set(fitted) != {key}):
        raise SpecError(f"expected only an '{key}' mapping", source=source)
    return fitted, source


def hardware_provenance(hw: str) -> dict[str, Any]:
    """Where the spec of `hw` (an id or a path) comes from: its file, the spec it starts from
    (`base`), the devices whose attention and collectives it takes (`attention_from`,
    `collective_from`), the calibration file laid over it (None where there is none; a
    base's comes with the base), and which of those lent parts that file fits anew
    (`calibrated_over`: the `*_from` keys whose parts it holds, their lender then a prior)."""
    path = _hardware_path(hw).resolve()
    raw = read_yaml(path)
    raw = raw if isinstance(raw, dict) else {}
    eff = raw.get("efficiency")
    eff = eff if isinstance(eff, dict) else {}
    calibration = calibration_beside(path)
    overlay, _ = _calibration(path, True, None, "efficiency")
    fitted = (overlay or {}).get("efficiency") or {}
    return {
        "file": str(path),
        "base": str(raw[BASE]) if BASE in raw else None,
        **{key: str(eff[key]) if key in eff else None for key in SIBLING_KEYS},
        "calibration": str(calibration) if calibration.is_file() else None,
        "calibrated_over": [
            key for key, parts in SIBLING_KEYS.items() if key in eff and parts[0] in fitted
        ],
    }


def forget_loaded_specs() -> None:
    """Drop the specs this process has loaded (each file is read once), so that the next load
    reads the files again: after a calibration file was written, say."""
    _load_hardware_file.cache_clear()
    _load_engine_file.cache_clear()


@cache
def _load_hardware_file(path: Path, calibrated: bool) -> HardwareSpec:
    data, source = _hardware_data(path, calibrated)
    hw = validate(HardwareSpec, data, source=source)
    if hw.host.cpu is not None:
        host_cpu(hw.host.cpu, source=source, field="host.cpu")
    return hw


def _hardware_data(
    path: Path, calibrated: bool, *, fitted: Any = None, chain: tuple[Path, ...] = ()
) -> tuple[dict[str, Any], str]:
    """The spec in `path` as a mapping, before validation, and the file its errors name.
    A `base:` (a hardware id, or a path relative to this file) starts it from that spec as
    it loads, calibration included when `calibrated`: this file's keys are laid over it,
    mappings key by key, and say only what differs. The attention is taken from a sibling
    where the spec says so (`_sibling_attention`); then this file's own calibration
    (`fitted`, else `calibration/<name>` beside it when `calibrated`) is laid over all."""
    _check_chain(path, chain, "specs")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", source=str(path))
    base = _base_data(
        data,
        path,
        what="a hardware",
        find=_hardware_path,
        load=lambda p: _hardware_data(p, calibrated, chain=(*chain, path))[0],
        model=HardwareSpec,
    )
    if base is not None:
        eff = data.get("efficiency")
        if isinstance(eff, dict):
            # This file names its own donor of a part: the base's part goes with it.
            lent = {k for key, keys in SIBLING_KEYS.items() if key in eff for k in keys}
            inherited = base.get("efficiency") or {}
            base = {**base, "efficiency": {k: v for k, v in inherited.items() if k not in lent}}
        data = _merge(base, data)
    data = _sibling_attention({**data, "id": path.stem}, path, calibrated=calibrated)
    data = _sibling_collective(data, path, calibrated=calibrated)
    fitted, source = _calibration(path, calibrated, fitted, "efficiency")
    if fitted is None:
        return data, str(path)
    return _merge(data, fitted), source


def _sibling_attention(data: dict[str, Any], path: Path, *, calibrated: bool) -> dict[str, Any]:
    """`efficiency.attention_from: ID` (a device of the same die running the same kernels,
    e.g. H200 from H100 SXM): the attention efficiency as that device's spec has it (fitted
    to its operator data when `calibrated`), as fractions of this device's own peak and
    bandwidth, and its `attention_kernels` unless this file gives its own; likewise the
    activation-quantisation kernel before W8A8 GEMMs (`gemm.quant_fraction` and its size
    curve), the other engine kernel timed with them, unless this file gives its own."""
    eff = data.get("efficiency")
    if not isinstance(eff, dict) or ATTENTION_FROM not in eff:
        return data
    if "attention" in eff:
        raise SpecError(
            f"give either 'attention' or '{ATTENTION_FROM}', not both",
            source=str(path),
            field=f"efficiency.{ATTENTION_FROM}",
        )
    sibling = _sibling(eff, ATTENTION_FROM, path, calibrated=calibrated)
    eff = {k: v for k, v in eff.items() if k != ATTENTION_FROM}
    eff["attention"] = sibling.attention.model_dump()
    if "attention_kernels" not in eff and sibling.attention_kernels:
        eff["attention_kernels"] = {
            name: kernel.model_dump() for name, kernel in sibling.attention_kernels.items()
        }
    gemm = eff.get("gemm")
    if isinstance(gemm, dict) and "quant_fraction" not in gemm and sibling.gemm.quant_fraction:
        eff["gemm"] = {
            **gemm,
            "quant_fraction": dict(sibling.gemm.quant_fraction),
            "quant_size_curve": sibling.gemm.quant_size_curve.model_dump(),
        }
    return {**data, "efficiency": eff}


def _sibling_collective(data: dict[str, Any], path: Path, *, calibrated: bool) -> dict[str, Any]:
    """`efficiency.collective_from: ID` (a device on the same kind of fabric running the same
    collective library, e.g. H200 from H100 SXM, both NVLink4 through NVSwitch under NCCL):
    the collective efficiency as that device's spec has it (fitted to its all-reduce timings
    when `calibrated`: latency, its growth with the group, size curve, bus bandwidth fraction
    of this device's own links), with the keys this file's own `collective` gives laid over
    it (a measurement of this device's own, such as its busbw fraction)."""
    eff = data.get("efficiency")
    if not isinstance(eff, dict) or COLLECTIVE_FROM not in eff:
        return data
    sibling = _sibling(eff, COLLECTIVE_FROM, path, calibrated=calibrated)
    own = eff.get("collective") or {}
    if not isinstance(own, dict):
        raise SpecError("expected a mapping", source=str(path), field="efficiency.collective")
    eff = {k: v for k, v in eff.items() if k != COLLECTIVE_FROM}
    eff["collective"] = {**sibling.collective.model_dump(), **own}
    return {**data, "efficiency": eff}


def _sibling(eff: dict[str, Any], key: str, path: Path, *, calibrated: bool) -> EfficiencySpec:
    """The efficiency of the device `eff[key]` names (`attention_from`, `collective_from`),
    calibrated when `calibrated`. It must describe that part itself, in its own file (no
    `<key>`, no `base`)."""
    field = f"efficiency.{key}"
    sibling_id = eff[key]
    if not isinstance(sibling_id, str):
        raise SpecError("expected a hardware id", source=str(path), field=field)
    try:
        sibling_path = _hardware_path(sibling_id).resolve()
    except SpecError as exc:
        raise SpecError(exc.reason, source=str(path), field=field) from None
    raw = read_yaml(sibling_path)
    sibling_eff = raw.get("efficiency") if isinstance(raw, dict) else None
    if (
        sibling_path == path
        or (isinstance(raw, dict) and BASE in raw)
        or (isinstance(sibling_eff, dict) and key in sibling_eff)
    ):
        part = {ATTENTION_FROM: "attention", COLLECTIVE_FROM: "collectives"}[key]
        raise SpecError(
            f"{sibling_id} takes its {part} from another device: name one that describes its own",
            source=str(path),
            field=field,
        )
    return _load_hardware_file(sibling_path, calibrated).efficiency


def calibrated_hardware(hw: str, fitted: Any) -> HardwareSpec:
    """The hand-written spec of `hw` with `fitted` (what a `calibration/<id>.yaml` holds)
    laid over it, as `load_hardware` lays the committed file: `python -m simulator.calibrate
    --check` builds the refit's spec with it."""
    data, source = _hardware_data(_hardware_path(hw).resolve(), True, fitted=fitted)
    return validate(HardwareSpec, data, source=source)


def load_hardware(hw: str | os.PathLike[str], *, calibrated: bool = True) -> HardwareSpec:
    """A hardware spec by id (`h100_sxm`) or by path to a YAML file of the same schema, which
    may start from another spec (`base: h100_sxm`) and give only what differs.

    Where `calibration/<id>.yaml` sits beside the file (written by `python -m
    simulator.calibrate`), its fitted efficiency factors replace the hand-written ones (a
    base's come with it); `calibrated=False` gives the hand-written spec alone."""
    _an_id(hw, "hardware")
    return _load_hardware_file(_hardware_path(os.fspath(hw)).resolve(), calibrated)


def _an_id(value: object, field: str) -> None:
    """An id or path must be text (a path object is one too): None, a number or a list is a
    SpecError naming `field`, not an AttributeError from deep inside."""
    if not isinstance(value, str | os.PathLike):
        raise SpecError(f"expected an id or a path, got {value!r}", field=field)


# -- models -----------------------------------------------------------------------------------
def list_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


@cache
def _load_model_file(path: Path, model_id: str) -> ModelSpec:
    try:
        cfg = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"malformed JSON: {exc.msg}", source=str(path), field=f"line {exc.lineno}"
        ) from None
    except RecursionError:
        raise SpecError("malformed JSON: nested too deeply", source=str(path)) from None
    if not isinstance(cfg, dict):
        raise SpecError("expected a JSON object", source=str(path))
    try:
        spec = from_hf_config(cfg, name=model_id)
    except ConfigKeyError as exc:
        raise SpecError(exc.reason, source=str(path), field=exc.key) from None
    except ValidationError as exc:
        raise validation_error(exc, source=str(path)) from None
    return spec.model_copy(update={"id": model_id})


def load_model(model: str | os.PathLike[str]) -> ModelSpec:
    """A model by catalogue id (`llama-3.1-8b`) or by path to a Hugging Face config.json."""
    _an_id(model, "model")
    model = os.fspath(model)
    builtin = MODELS_DIR / f"{model}.json"
    if builtin.is_file():
        return _load_model_file(builtin, model)
    path = Path(model)
    if model and (path.suffix == ".json" or path.is_file() or path.is_dir()):
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise SpecError("no such file", source=str(path), field="model")
        return _load_model_file(path.resolve(), str(path))
    hf = _hugging_face_config(model)
    if hf is not None:
        return hf
    known = list_models()
    raise SpecError(
        f"unknown model id{did_you_mean(model, [*known, *hf_repos()])} (known: {', '.join(known)}; "
        "a Hugging Face id of one of them; or a path to config.json)",
        source=model,
        field="model",
    )


@cache
def hf_repos() -> dict[str, str]:
    """Hugging Face repository ids of the bundled configs (`models/hf_ids.yaml`) to their
    catalogue ids."""
    return {str(k): str(v) for k, v in read_yaml(HF_IDS_FILE).items()}


def hf_ids() -> dict[str, str]:
    """`hf_repos` with the repository ids lower-cased (Hugging Face ids ignore case)."""
    return {k.lower(): v for k, v in hf_repos().items()}


def hf_cache_dirs() -> list[Path]:
    """Where a local Hugging Face cache may hold model configs: HF_HUB_CACHE, HF_HOME/hub,
    ~/.cache/huggingface/hub (what huggingface_hub reads, in its order)."""
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def _hugging_face_config(repo: str) -> ModelSpec | None:
    """A model named by its Hugging Face id (`org/name`): the bundled config it maps to, else
    its config.json in a local Hugging Face cache (the newest snapshot); None when neither.
    A repo id that is neither is a SpecError saying what to pass."""
    if repo.count("/") != 1 or repo.startswith(("/", ".")) or repo.endswith("/"):
        return None
    bundled = hf_ids().get(repo.lower())
    if bundled is not None:
        return _load_model_file(MODELS_DIR / f"{bundled}.json", bundled)
    folder = "models--" + repo.replace("/", "--")
    for hub in hf_cache_dirs():
        configs = sorted(
            (hub / folder / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime
        )
        if configs:
            return _load_model_file(configs[-1].resolve(), repo)
    raise SpecError(
        "no bundled config for this Hugging Face id and none in a local Hugging Face cache "
        f"({', '.join(str(d) for d in hf_cache_dirs())}): download its config.json and pass "
        f"--model path/to/config.json{did_you_mean(repo, hf_repos())}",
        source=repo,
        field="model",
    )


# -- host CPUs --------------------------------------------------------------------------------
@cache
def load_host_cpus() -> dict[str, HostCpu]:
    """The table of host CPUs (`simulator/specs/host_cpus.yaml`), by id."""
    data = read_yaml(HOST_CPUS_FILE)
    cpus = data.get("cpus") if isinstance(data, dict) else None
    if not isinstance(cpus, dict):
        raise SpecError("expected a mapping", source=str(HOST_CPUS_FILE), field="cpus")
    return {
        str(key): validate(HostCpu, value, source=f"{HOST_CPUS_FILE}: cpus.{key}")
        for key, value in cpus.items()
    }


def host_cpu(cpu_id: str, *, source: str = "", field: str = "host_cpu") -> HostCpu:
    """The host CPU `cpu_id`; an unknown id is a SpecError naming it and the known ids."""
    cpus = load_host_cpus()
    if not isinstance(cpu_id, str) or cpu_id not in cpus:
        hint = did_you_mean(cpu_id, cpus) if isinstance(cpu_id, str) else ""
        raise SpecError(
            f"unknown host CPU {cpu_id!r}{hint} (known: {', '.join(sorted(cpus))})",
            source=source,
            field=field,
        )
    return cpus[cpu_id]


# -- engines ----------------------------------------------------------------------------------
def list_engines() -> list[str]:
    return sorted(p.stem for p in ENGINES_DIR.glob("*.yaml"))


@cache
def _load_engine_file(path: Path, calibrated: bool = True) -> EngineSpec:
    engine = validate(EngineSpec, _engine_data(path, calibrated), source=str(path))
    if engine.host_cpu is not None:
        host_cpu(engine.host_cpu, source=str(path), field="host_cpu")
    if engine.fused_moe_configs is not None:
        check_moe_release(engine.fused_moe_configs, source=str(path))
    return engine


@cache
def _fused_moe_configs() -> dict[str, Any]:
    data = read_yaml(FUSED_MOE_CONFIGS_FILE)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping", source=str(FUSED_MOE_CONFIGS_FILE))
    return data


def check_moe_release(release: str, *, source: str = "", field: str = "fused_moe_configs") -> None:
    """A SpecError naming the known releases unless `release` is one of
    `simulator/specs/fused_moe_configs.yaml` or `NO_MOE_CONFIGS`."""
    table = _fused_moe_configs()
    if release != NO_MOE_CONFIGS and release not in table:
        known = [NO_MOE_CONFIGS, *sorted(table)]
        raise SpecError(
            f"unknown vLLM release {release!r}{did_you_mean(release, known)} "
            f"(known: {', '.join(known)})",
            source=source,
            field=field,
        )


def tuned_moe_shapes(release: str, hardware: str) -> frozenset[tuple[int, int, str]]:
    """(local experts, intermediate size per shard, dtype key: bf16, fp8 or fp8_block) of the
    routed-expert shapes vLLM `release` ships a tuned fused-MoE configuration for on `hardware`
    (an id), from `simulator/specs/fused_moe_configs.yaml`; none for `NO_MOE_CONFIGS`. An
    unknown release is a SpecError (`check_moe_release`)."""
    check_moe_release(release)
    return frozenset() if release == NO_MOE_CONFIGS else _moe_shapes(release, hardware)


@cache
def _moe_shapes(release: str, hardware: str) -> frozenset[tuple[int, int, str]]:
    by_dtype = _fused_moe_configs()[release].get(hardware) or {}
    return frozenset((int(e), int(n), str(dt)) for dt, pairs in by_dtype.items() for e, n in pairs)


def _engine_path(engine: str) -> Path:
    """The file of an engine given by id or by path to a YAML file."""
    if engine.endswith((".yaml", ".yml")):
        return Path(engine).resolve()
    path = ENGINES_DIR / f"{engine}.yaml"
    if not path.is_file():
        known = list_engines()
        raise SpecError(
            f"unknown engine{did_you_mean(engine, known)} (known: {', '.join(known)})",
            source=engine,
            field="engine",
        )
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
    _check_chain(path, chain, "profiles")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", source=str(path))
    base = _base_data(
        data,
        path,
        what="an engine",
        find=_engine_path,
        load=lambda p: _engine_data(p, calibrated, chain=(*chain, path)),
        model=EngineSpec,
    )
    if base is not None:
        data = _merge(base, data)
    data["id"] = path.stem
    fitted, _ = _calibration(path, calibrated, fitted, "overhead")
    return data if fitted is None else _merge(data, fitted)


def calibrated_engine(engine: str, fitted: Any) -> EngineSpec:
    """The engine profile `engine` (an id) with `fitted` (what a `calibration/<id>.yaml`
    holds) laid over it, as `load_engine` lays the committed file."""
    path = ENGINES_DIR / f"{engine}.yaml"
    return validate(EngineSpec, _engine_data(path, True, fitted=fitted), source=str(path))


def load_engine(engine: str | os.PathLike[str], *, calibrated: bool = True) -> EngineSpec:
    """An engine profile by id (`vllm`) or by path to a YAML file of the same schema, which may
    start from another profile (`base: vllm`) and give only what differs; a
    `calibration/<id>.yaml` beside it (from `python -m simulator.calibrate`) replaces its
    CPU overheads unless `calibrated=False`."""
    _an_id(engine, "engine")
    return _load_engine_file(_engine_path(os.fspath(engine)), calibrated)
