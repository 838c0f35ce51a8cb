"""Error bands on predictions, from the residuals of `llmsim validate` (docs/error-bands.md).

`simulator/data/error_bands.yaml` holds one signed log residual r = ln(measured / predicted)
per held-out row of the end-to-end suites (`e2e_throughput`, `e2e_serving`, `e2e_latency`,
`e2e_serving_curve`, `e2e_energy`'s ITL and throughput), labelled with its metric family
(ttft, tpot, latency, throughput), regime (offline: a static batch or every request at t=0;
online: the latencies of a served run), hardware id, device family (the hardware's vendor),
engine family (vllm, sglang, trtllm, llamacpp) and model family (dense, moe).
`simulator.validate.bands` writes it; this module only reads it (cheap: no validation suite is
imported).

A band at coverage c is a group's residual quantiles at (1-c)/2 and (1+c)/2, each at rank
(n+1)p interpolated between order statistics (Hyndman and Fan's type 6): for a new row
exchangeable with the group's, each end is passed with probability (1-c)/2 on average. It is
the split-conformal rank made continuous: the conformal ceil((n+1)p) never covers less than c
but over-covers by up to 2/(n+1) (11 points on 18 rows). A time-like prediction p gets
[p e^lo, p e^hi]; a rate (throughput) [p e^-hi, p e^-lo].

The group is the most specific of (family, regime, model family) by hardware id and engine
family, by device and engine family, by device family, or alone, then the same without the
model family, with at least `min_group_rows(c)` rows, else the whole family; a family with
fewer rows than c needs gives its range, and `interval_caveats` says so. E2EL's band is the
hull of TTFT's and TPOT's (a request's E2EL ratio is a convex combination of its TTFT and
decode-time ratios; no validation row measures E2EL online).

A prediction is backed when held-out rows exist for its hardware id under its engine family
and of its model family (`dense`, or `moe`: routed experts); otherwise it gets no band, only
`interval_note`. (The dense rows say little of a mixture of experts: the 2025 DeepSeek-R1
serving curves of `e2e_serving_curve` ran 1.3-3.4x slower than predicted where the dense bands
are within tens of percent.) A backed setup takes its family's band even
where its own rows are of other families. Not covered: the bands are the error of the
validated setups applied to others (models, lengths, parallelism, features such as
speculative decoding or offloading); they say nothing about what those setups never
exercised.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from simulator.costmodel.deployment import Deployment
    from simulator.specs.model import ModelSpec

BANDS_PATH = Path(__file__).resolve().parents[1] / "data" / "error_bands.yaml"
DEFAULT_COVERAGE = 0.8
# Fewest rows of a split group (a device or engine family, a regime) that replaces the family's
# band; below it the split is noise.
MIN_GROUP_ROWS = 10
ENGINE_FAMILIES = ("vllm", "sglang", "trtllm", "llamacpp")
SPLITS = ("model_family", "hardware", "device_family", "engine_family")  # a group's splits
Family = Literal["ttft", "tpot", "latency", "throughput"]
Regime = Literal["offline", "online"]
FAMILY_LABELS = {
    "ttft": "TTFT",
    "tpot": "TPOT/ITL",
    "latency": "latency",
    "throughput": "throughput",
}


@dataclass(frozen=True)
class Residual:
    """One held-out validation row: r = ln(measured / predicted) of its time-like quantity
    (seconds per output token for a throughput row)."""

    family: Family
    regime: Regime
    suite: str
    source: str
    device: str
    device_family: str
    engine_family: str
    case: str
    log_ratio: float
    model_family: str = "dense"  # `model_family` of the row's model


@dataclass(frozen=True)
class Target:
    """What a prediction ran on, as the bands group it."""

    hardware: str  # hardware id
    device_family: str  # the hardware's vendor
    engine_family: str
    model_family: str = "dense"

    @property
    def label(self) -> str:
        what = "MoE models on " if self.model_family == "moe" else ""
        return f"{what}{self.hardware} under {self.engine_family}"


def model_family(model: ModelSpec) -> str:
    """`moe` for a model with routed experts, else `dense`: what the bands' backing tells
    apart."""
    return "dense" if model.moe is None else "moe"


def engine_family(engine: str) -> str:
    """`vllm-0.6` -> `vllm`, `trtllm-0.6` -> `trtllm`; an engine of no known family is its own."""
    for name in ENGINE_FAMILIES:
        if engine == name or engine.startswith(f"{name}-"):
            return name
    return engine


def target(*, hardware: str, vendor: str, engine: str, family: str = "dense") -> Target:
    """The Target of a hardware id, its vendor, an engine id and a model family."""
    return Target(hardware, vendor, engine_family(engine), family)


def deployment_target(dep: Deployment) -> Target:
    """The Target of a deployment: its hardware, the hardware's vendor, its engine and its
    model's family."""
    return target(
        hardware=dep.hardware.id,
        vendor=dep.hardware.vendor,
        engine=dep.engine.id,
        family=model_family(dep.model),
    )


@dataclass(frozen=True)
class Metric:
    """How an output key is banded: the families whose band it takes (several: their hull),
    whether it is a rate (the band inverts) and the regime whose rows it prefers (None: the
    output's)."""

    families: tuple[Family, ...]
    rate: bool = False
    regime: Regime | None = None


TIME_OF = {family: Metric((family,)) for family in ("ttft", "tpot", "latency", "throughput")}
RATE = Metric(("throughput",), rate=True)
LATENCY_METRICS: dict[str, Metric] = {
    "avg_latency": TIME_OF["latency"],
    "ttft_s": TIME_OF["ttft"],
    "tpot_s": TIME_OF["tpot"],
}
THROUGHPUT_METRICS: dict[str, Metric] = {
    "requests_per_second": RATE,
    "tokens_per_second": RATE,
    "output_tokens_per_second": RATE,
    "elapsed_time": TIME_OF["throughput"],  # the time to produce the output
}
SERVE_RATES = ("request_throughput", "output_throughput", "total_token_throughput")
_SERVE_LATENCY = re.compile(r"^(mean|median|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
# The families each served latency takes its band from (a plan's SLO metrics are the same four).
LATENCY_FAMILIES: dict[str, tuple[Family, ...]] = {
    "ttft": ("ttft",),
    "tpot": ("tpot",),
    "itl": ("tpot",),  # a decode step, as TPOT
    "e2el": ("ttft", "tpot"),
}
ONLINE_RATES_NOTE = (
    "the throughputs of a run whose requests do not all arrive at once have no band: below the "
    "knee the arrivals set them, and no validation row measures an online throughput"
)


def serve_metrics(keys: Iterable[str], *, all_at_once: bool) -> dict[str, Metric]:
    """The banded keys of a serve summary: the mean, median and percentiles of TTFT, TPOT, ITL
    and E2EL and, when every request arrives at t=0 (an offline run by another name), the
    three throughputs (offline rows)."""
    keys = list(keys)
    out = {}
    for key in keys:
        match = _SERVE_LATENCY.match(key)
        if match:
            out[key] = Metric(LATENCY_FAMILIES[match.group(2)])
        elif key in SERVE_RATES and all_at_once:
            out[key] = Metric(("throughput",), rate=True, regime="offline")
    return out


def serve_intervals(
    summary: Mapping[str, Any],
    *,
    targets: Sequence[Target],
    all_at_once: bool,
    coverage: float = DEFAULT_COVERAGE,
    note: str | None = None,
) -> dict[str, Any]:
    """`intervals` of a serve summary (`serve_metrics`): online regime for the latencies (TTFT
    and TPOT rows of runs at a request rate), the offline throughput rows for the throughputs
    of a run whose requests all arrive at t=0; a caveat says why the others have none."""
    return intervals(
        summary,
        metrics=serve_metrics(summary, all_at_once=all_at_once),
        targets=targets,
        regime="online",
        coverage=coverage,
        note=note,
        caveats=() if all_at_once else (ONLINE_RATES_NOTE,),
    )


# -- the residuals --------------------------------------------------------------------------------
def parse_residuals(data: Any, *, source: str) -> tuple[Residual, ...]:
    """The residuals of the bands file's mapping (`residuals:` rows); ValueError naming
    `source` on anything else."""
    rows = data.get("residuals") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f"{source}: expected a mapping with a `residuals` list")
    try:
        return tuple(Residual(**{**row, "log_ratio": float(row["log_ratio"])}) for row in rows)
    except (TypeError, KeyError) as exc:
        raise ValueError(f"{source}: bad residual row ({exc})") from None


@cache
def load_residuals(path: Path = BANDS_PATH) -> tuple[Residual, ...]:
    """The committed residuals (read once per process)."""
    from simulator.specs.loader import read_yaml

    return parse_residuals(read_yaml(path), source=str(path))


# -- quantiles and groups -------------------------------------------------------------------------
def quantile(values: Sequence[float], p: float) -> float:
    """The p-quantile at rank (n+1)p of the sorted values, linearly interpolated between
    order statistics and clamped to the smallest and largest (numpy's method="weibull")."""
    x = sorted(values)
    if not x:
        raise ValueError("no values")
    h = (len(x) + 1) * p
    if h <= 1:
        return x[0]
    if h >= len(x):
        return x[-1]
    k = int(h)  # 1-based rank below h
    return x[k - 1] + (h - k) * (x[k] - x[k - 1])


def min_group_rows(coverage: float) -> int:
    """Rows a group needs for its quantiles at `coverage` to lie inside its range, and at
    least MIN_GROUP_ROWS: (n+1)(1-c)/2 >= 1."""
    return max(MIN_GROUP_ROWS, math.ceil(2 / (1 - coverage) - 1 - 1e-9))


def check_coverage(coverage: float) -> float:
    if not 0 < coverage < 1:
        raise ValueError(f"coverage must lie strictly between 0 and 1, got {coverage}")
    return float(coverage)


@dataclass(frozen=True)
class Band:
    """A group's band at a coverage, as log ratios (ln(measured / predicted))."""

    label: str  # which rows: "ttft, offline, nvidia, trtllm"
    rows: tuple[Residual, ...]
    coverage: float
    low: float
    high: float

    @property
    def clamped(self) -> bool:
        """Whether the group has too few rows for the coverage (its band is then its range,
        expected to cover (n-1)/(n+1))."""
        return (len(self.rows) + 1) * (1 - self.coverage) / 2 < 1

    @property
    def expected_coverage(self) -> float:
        n = len(self.rows)
        return (n - 1) / (n + 1) if self.clamped else self.coverage


def _levels(
    rows: list[Residual],
    head: str,
    *,
    hardware: str | None,
    device_family: str | None,
    engine_family: str | None,
) -> list[tuple[str, list[Residual]]]:
    """The groups of `rows` (labelled after `head`), most specific first: the hardware id and
    engine family, the device and engine family, the device family, then `rows` themselves.
    A None hardware, device or engine family does not split."""
    levels: list[tuple[str, list[Residual]]] = []
    if hardware is not None and engine_family is not None:
        mine = [r for r in rows if r.device == hardware and r.engine_family == engine_family]
        levels.append((f"{head}, {hardware}, {engine_family}", mine))
    if device_family is not None:
        same_device = [r for r in rows if r.device_family == device_family]
        if engine_family is not None:
            both = [r for r in same_device if r.engine_family == engine_family]
            levels.append((f"{head}, {device_family}, {engine_family}", both))
        levels.append((f"{head}, {device_family}", same_device))
    levels.append((head, rows))
    return levels


def group_band(
    rows: Sequence[Residual],
    *,
    family: Family,
    regime: Regime,
    device_family: str | None,
    engine_family: str | None,
    coverage: float,
    model_family: str | None = None,
    hardware: str | None = None,
) -> Band | None:
    """The band of the most specific group with enough rows (None: the family has no rows):
    of the same model family (dense, moe), by hardware id and engine family, by device and
    engine family, by device family, then alone; then of any model family in the same order.
    A None model family, hardware, device or engine family does not split."""
    coverage = check_coverage(coverage)
    pool = [r for r in rows if r.family == family]
    if not pool:
        return None
    same_regime = [r for r in pool if r.regime == regime]
    split = {"hardware": hardware, "device_family": device_family, "engine_family": engine_family}
    levels: list[tuple[str, list[Residual]]] = []
    if model_family is not None:
        same_model = [r for r in same_regime if r.model_family == model_family]
        levels += _levels(same_model, f"{family}, {regime}, {model_family}", **split)
    levels += _levels(same_regime, f"{family}, {regime}", **split)
    need = min_group_rows(coverage)
    label, chosen = next(((lb, g) for lb, g in levels if len(g) >= need), (family, pool))
    ratios = [r.log_ratio for r in chosen]
    low, high = quantile(ratios, (1 - coverage) / 2), quantile(ratios, (1 + coverage) / 2)
    return Band(label, tuple(chosen), coverage, low, high)


def backing_note(rows: Sequence[Residual], targets: Sequence[Target]) -> str | None:
    """Why the targets get no band (None: every one has held-out rows for its hardware id
    under its engine family, of its model family)."""
    if not targets:
        return "no deployment to look up"
    backed = {(r.device, r.engine_family, r.model_family) for r in rows}
    missing = [
        t.label for t in targets if (t.hardware, t.engine_family, t.model_family) not in backed
    ]
    if missing:
        return f"no end-to-end validation rows for {', '.join(dict.fromkeys(missing))}"
    return None


# -- margins for plans -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Margin:
    """How much slower than predicted a deployment may run, at a confidence: the upper end of
    each band at coverage 2c - 1 (the one-sided c-quantile of measured / predicted time), never
    below 1. `capacity` is the larger of the offline throughput family's (seconds per output
    token) and the offline latency family's (a static batch's time): the hardware taken as that
    much slower throughout. `latency` maps each SLO metric (ttft,
    tpot, itl, e2el) to its own family's factor. `note`: why the setup is not backed (its
    factors are then those of every device and engine pooled)."""

    confidence: float
    capacity: float
    latency: Mapping[str, float]
    groups: tuple[str, ...]
    source: tuple[str, ...]
    note: str | None = None

    @property
    def backed(self) -> bool:
        return self.note is None

    def latency_factor(self, metric: str) -> float:
        """What a latency is multiplied by at the edge: its family's factor, and at least the
        capacity's (every step of a hardware that much slower is that much longer)."""
        return max(self.latency.get(metric, 1.0), self.capacity)

    def scale(self) -> dict[str, float]:
        """Each SLO metric's factor (`latency_factor`)."""
        return {metric: self.latency_factor(metric) for metric in LATENCY_FAMILIES}

    @property
    def trivial(self) -> bool:
        return self.capacity == 1.0 and all(v == 1.0 for v in self.scale().values())


NO_MARGIN = Margin(confidence=0.5, capacity=1.0, latency={}, groups=(), source=())


def worst(margins: Sequence[Margin]) -> Margin:
    """The margin of deployments run together (a fleet, a unit): each factor the largest of
    theirs (a run is as slow as its slowest part may be), the first note."""
    if not margins:
        return NO_MARGIN
    notes = [m.note for m in margins if m.note is not None]
    return Margin(
        confidence=max(m.confidence for m in margins),
        capacity=max(m.capacity for m in margins),
        latency={k: max(m.latency.get(k, 1.0) for m in margins) for k in LATENCY_FAMILIES},
        groups=tuple(dict.fromkeys(g for m in margins for g in m.groups)),
        source=tuple(sorted({s for m in margins for s in m.source})),
        note=notes[0] if notes else None,
    )


def margin(
    targets: Sequence[Target],
    *,
    confidence: float,
    note: str | None = None,
    rows: Sequence[Residual] | None = None,
) -> Margin:
    """The margin of a deployment on `targets` at `confidence` (0.5 < c < 1). An unbacked one
    (or with `note`, a reason the caller knows) takes the pooled groups of its families."""
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0.5 and 1, got {confidence}")
    rows = load_residuals() if rows is None else rows
    note = note or backing_note(rows, targets)
    split: dict[str, str | None] = {a: None for a in SPLITS}
    if note is None:
        split = {a: _common(targets, a) for a in SPLITS}
    coverage = 2 * confidence - 1
    found: dict[tuple[Family, Regime], Band] = {}

    def edge(family: Family, regime: Regime) -> float:
        if (family, regime) not in found:
            band = group_band(rows, family=family, regime=regime, coverage=coverage, **split)
            if band is None:
                return 1.0
            found[family, regime] = band
        return max(1.0, math.exp(found[family, regime].high))

    capacity = max(edge("throughput", "offline"), edge("latency", "offline"))
    latency = {
        metric: max(edge(family, "online") for family in families)
        for metric, families in LATENCY_FAMILIES.items()
    }
    return Margin(
        confidence=confidence,
        capacity=capacity,
        latency=latency,
        groups=tuple(b.label for b in found.values()),
        source=tuple(sorted({r.suite for b in found.values() for r in b.rows})),
        note=note,
    )


def backing_rows(
    *,
    hardware: str,
    engine: str,
    family: str = "dense",
    rows: Sequence[Residual] | None = None,
) -> list[Residual]:
    """The held-out rows of `hardware` under `engine`'s family, of model family `family`
    (none: it is not backed)."""
    rows = load_residuals() if rows is None else rows
    engines = engine_family(engine)
    return [
        r
        for r in rows
        if r.device == hardware and r.engine_family == engines and r.model_family == family
    ]


# -- output keys ----------------------------------------------------------------------------------
def _common(targets: Sequence[Target], attr: str) -> str | None:
    values = {getattr(t, attr) for t in targets}
    return values.pop() if len(values) == 1 else None


def intervals(
    values: Mapping[str, Any],
    *,
    metrics: Mapping[str, Metric],
    targets: Sequence[Target],
    regime: Regime,
    coverage: float = DEFAULT_COVERAGE,
    note: str | None = None,
    caveats: Sequence[str] = (),
    rows: Sequence[Residual] | None = None,
) -> dict[str, Any]:
    """The keys the contract adds to an output: `K_interval: [low, high]` for each key K of
    `values` that `metrics` bands, `interval_coverage`, `interval_source` (the validate suites
    the bands came from) and `interval_caveats` where a band rests on too few rows for the
    coverage (and the caller's `caveats`: why some keys have none). Unbacked (or with `note`:
    a reason the caller knows): only `interval_note`. `rows`: the residuals (default: the
    committed file)."""
    coverage = check_coverage(coverage)
    rows = load_residuals() if rows is None else rows
    note = note or backing_note(rows, targets)
    if note is not None:
        return {"interval_note": note}
    split = {a: _common(targets, a) for a in SPLITS}
    bands: dict[tuple[Family, Regime], Band | None] = {}
    out: dict[str, Any] = {}
    for key, metric in metrics.items():
        value = values.get(key)
        if not isinstance(value, int | float) or not math.isfinite(value):
            continue
        wanted = [(family, metric.regime or regime) for family in metric.families]
        for family, in_regime in wanted:
            if (family, in_regime) not in bands:
                bands[family, in_regime] = group_band(
                    rows, family=family, regime=in_regime, coverage=coverage, **split
                )
        used = [bands[w] for w in wanted]
        if any(b is None for b in used):
            continue  # a family without rows: no band for it
        low = min(b.low for b in used if b is not None)
        high = max(b.high for b in used if b is not None)
        lo, hi = (-high, -low) if metric.rate else (low, high)
        out[f"{key}_interval"] = [value * math.exp(lo), value * math.exp(hi)]
    used_bands = list({b.label: b for b in bands.values() if b is not None}.values())
    out["interval_coverage"] = coverage
    out["interval_source"] = sorted({r.suite for b in used_bands for r in b.rows})
    caveats = [*caveats, *(_thin(b) for b in used_bands if b.clamped)]
    if caveats:
        out["interval_caveats"] = caveats
    return out


def _thin(band: Band) -> str:
    """The caveat of a band whose group has too few rows for its coverage."""
    return (
        f"the {FAMILY_LABELS[band.rows[0].family]} band rests on {len(band.rows)} validation "
        f"rows, too few for {band.coverage:.0%}: it is their range, expected to cover "
        f"{band.expected_coverage:.0%}"
    )


def band_text(data: Mapping[str, Any], key: str, spec: str = ".2f") -> str | None:
    """`[38.00, 61.30]`: the band of `key` in `data` (None: it has none)."""
    band = data.get(f"{key}_interval")
    if band is None:
        return None
    low, high = band
    return f"[{low:{spec}}, {high:{spec}}]"


def band_suffix(data: Mapping[str, Any], key: str, spec: str = ".2f") -> str:
    """`  [38.00, 61.30] at 80%` for a key with a band in `data`, else ''."""
    text = band_text(data, key, spec)
    if text is None:
        return ""
    return f"  {text} at {float(data['interval_coverage']):.0%}"


def band_lines(data: Mapping[str, Any]) -> list[str]:
    """What the human output says once about the bands: where they come from, or why there
    are none, and any caveat."""
    if "interval_note" in data:
        return [f"Error bands: none ({data['interval_note']})"]
    if "interval_coverage" not in data:
        return []
    suites = ", ".join(data.get("interval_source", [])) or "none"
    lines = [
        f"Error bands: where {float(data['interval_coverage']):.0%} of the held-out validation "
        f"rows' measurements fell around their predictions (llmsim validate: {suites}; "
        "docs/error-bands.md)"
    ]
    lines += [f"Error bands: {caveat}" for caveat in data.get("interval_caveats", [])]
    return lines
