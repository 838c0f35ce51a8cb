"""The error bands' residuals, from the end-to-end suites' held-out rows (docs/error-bands.md).

`residuals(df)` turns the held-out rows of `e2e_throughput`, `e2e_serving`, `e2e_latency`,
`e2e_serving_curve` and `e2e_energy` into signed log residuals r = ln(measured / predicted),
labelled as `simulator.metrics.bands` groups them:

- family: `e2e_serving` ttft, `e2e_latency` first_token_ms and `e2e_serving_curve` ttft rows are
  TTFT; `e2e_serving` tpot, `e2e_serving_curve` itl and `e2e_energy` itl rows TPOT (ITL shares
  it: both are a decode step); `e2e_latency` latency_ms rows latency; `e2e_throughput` rows,
  `e2e_latency`'s output_tokens_per_s_per_gpu rows and `e2e_energy`'s throughput rows
  throughput (their time-like quantity: seconds per output token, or the batch's time).
  `e2e_energy`'s power rows have no band;
- regime: the latencies of a served run (`e2e_serving`, `e2e_serving_curve` and `e2e_energy`'s
  ITL: a server under load, from a few requests to past its knee) are online, the rest
  offline (a static batch, or every request sent at t=0: `e2e_energy`'s steady-state
  throughput);
- device family: the hardware's vendor; engine family: `bands.engine_family` of the engine;
  model family: `bands.model_family` of the simulated model.

`bands_text` is the committed file (`llmsim validate --write-bands` writes it), `check_bands`
compares the current residuals with it (`llmsim validate --check` fails on a mismatch:
predictions cannot drift away from their bands), and `coverage_section` gives the held-out coverage
of the bands: each row against the band of the other rows (leave-one-out), and against the
band of the rows of other sources (leave-one-source-out, the harder question: a publication
not yet seen).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from rich.console import Console
from rich.table import Table

from simulator.metrics.bands import (
    BANDS_PATH,
    DEFAULT_COVERAGE,
    FAMILY_LABELS,
    Band,
    Family,
    Regime,
    Residual,
    engine_family,
    group_band,
    load_residuals,
    model_family,
)
from simulator.specs import load_hardware, load_model
from simulator.validate.e2e import LATENCY, SERVING, THROUGHPUT
from simulator.validate.energy import SUITE as ENERGY
from simulator.validate.serving_curve import SUITE as SERVING_CURVE

E2E_SUITES = (THROUGHPUT, SERVING, LATENCY, SERVING_CURVE, ENERGY)
# A committed residual matches the current one within this much (0.5% of the ratio): closer
# than the golden predictions' 1% (`regress/golden.yaml`), looser than rounding.
TOLERANCE = 0.005
DIGITS = 5  # of the committed log ratios
# The held-out coverage `llmsim validate --check` accepts: the stated one +- this (75-85% for
# the 80% bands), a family's widened by one of its rows (`accepted_range`).
HALF_WIDTH = 0.05
LATENCY_FAMILIES: dict[str, Family] = {
    "first_token_ms": "ttft",
    "latency_ms": "latency",
    "output_tokens_per_s_per_gpu": "throughput",
}


def family_of(row: pd.Series) -> tuple[Family, Regime] | None:
    """The metric family and regime of one end-to-end row (None: a kind with no band, the
    energy suite's power)."""
    match row["suite"]:
        case "e2e_serving" | "e2e_serving_curve":
            family: Family = "ttft" if row["kind"] == "ttft" else "tpot"
            return family, "online"
        case "e2e_throughput":
            return "throughput", "offline"
        case "e2e_latency":
            return LATENCY_FAMILIES[str(row["metric"])], "offline"
        case "e2e_energy":
            if row["kind"] == "itl":  # a served run's decode steps, from a full batch
                return "tpot", "online"
            if row["kind"] == "throughput":  # every request sent at t=0
                return "throughput", "offline"
            return None
    raise ValueError(f"not an end-to-end suite: {row['suite']!r}")


def _unique_cases(rows: pd.DataFrame) -> pd.Series:
    """Each row's case, with its checkpoint and number of prompts added where runs of one suite
    and device share a case (`e2e_energy`: Llama 3.1 and 3.3 70B are simulated as one model,
    and some configurations ran twice, on 1,024 and 2,048 prompts)."""
    cases = rows["case"].astype(str)
    repeated = rows.duplicated(["suite", "device", "case"], keep=False)
    if repeated.any() and {"checkpoint", "simulated_prompts"} <= set(rows.columns):
        prompts = rows["simulated_prompts"].map(lambda n: f"{int(n)} prompts" if n == n else "")
        suffix = " (" + rows["checkpoint"].astype(str) + ", " + prompts + ")"
        cases = cases.where(~repeated, cases + suffix)
    return cases


def residuals(df: pd.DataFrame) -> tuple[Residual, ...]:
    """The held-out (fitted == False) rows of the end-to-end suites in `df` as residuals, in
    the order of suite, device and case."""
    rows = df[df["suite"].isin(E2E_SUITES) & ~df["fitted"].astype(bool)]
    labels = pd.Series([family_of(row) for _, row in rows.iterrows()], index=rows.index)
    rows = rows.assign(label=labels)[labels.notna()]
    rows["case"] = _unique_cases(rows)
    if rows.duplicated(["suite", "device", "case"]).any():
        raise ValueError("end-to-end rows repeat a (suite, device, case)")
    vendors = {d: load_hardware(str(d)).vendor for d in rows["device"].unique()}
    families = {m: model_family(load_model(str(m))) for m in rows["model"].unique()}
    out = []
    for _, row in rows.sort_values(["suite", "device", "case"]).iterrows():
        family, regime = row["label"]
        # throughput rows name their engine in `kind`
        engine = row["engine"] if isinstance(row.get("engine"), str) else row["kind"]
        out.append(
            Residual(
                family=family,
                regime=regime,
                suite=str(row["suite"]),
                source=str(row["source"]),
                device=str(row["device"]),
                device_family=vendors[row["device"]],
                engine_family=engine_family(str(engine)),
                case=str(row["case"]),
                log_ratio=round(math.log(row["measured_s"] / row["predicted_s"]), DIGITS),
                model_family=families[row["model"]],
            )
        )
    return tuple(out)


# -- the committed file ---------------------------------------------------------------------------
HEADER = """\
# Error bands of llmsim's predictions: the signed log residuals r = ln(measured / predicted) of
# every held-out row of `llmsim validate`'s end-to-end suites e2e_throughput, e2e_serving,
# e2e_latency, e2e_serving_curve and e2e_energy (its ITL and throughput rows), i.e. the
# published runs in simulator/data/measured/e2e/{throughput,serving,latency,serving_curve,
# energy}.csv (provenance in the README there) against today's predictions of them. A
# throughput row's r is that of seconds per output token (a rate's band inverts).
# simulator/metrics/bands.py reads it: a band at coverage c is a group's quantiles of r at
# (1-c)/2 and (1+c)/2 (rank (n+1)p, interpolated), per metric family, regime and, where a
# group has enough rows, model, device and engine family (docs/error-bands.md).
# Written by `llmsim validate --write-bands`; do not edit. `llmsim validate --check` (make
# regress) fails when a prediction moves a row's r by more than 0.005 or the rows differ:
# rewrite the file with the predictions that moved.
"""


def _cell(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def bands_text(rows: tuple[Residual, ...]) -> str:
    """The bands file of `rows`: the header, then one flow mapping per residual."""
    lines = [HEADER.rstrip("\n"), "residuals:"]
    for r in rows:
        lines.append(
            f"  - {{family: {r.family}, regime: {r.regime}, suite: {r.suite}, "
            f"source: {_cell(r.source)}, device: {r.device}, device_family: {r.device_family}, "
            f"engine_family: {r.engine_family}, model_family: {r.model_family}, "
            f"case: {_cell(r.case)}, log_ratio: {r.log_ratio:.{DIGITS}f}}}"
        )
    return "\n".join(lines) + "\n"


def write_bands(rows: tuple[Residual, ...], path: str | Path = BANDS_PATH) -> Path:
    """Write the bands file of `rows` at `path` (default: the package's)."""
    path = Path(path)
    path.write_text(bands_text(rows), encoding="utf-8")
    load_residuals.cache_clear()
    return path


def _key(r: Residual) -> tuple[str, str, str]:
    return (r.suite, r.device, r.case)


@dataclass(frozen=True)
class BandsCheck:
    """The current residuals against the committed ones: row names (suite / device / case)."""

    moved: list[tuple[str, float, float]] = field(default_factory=list)  # name, file, now
    added: list[str] = field(default_factory=list)  # rows the file does not have
    missing: list[str] = field(default_factory=list)  # committed rows no longer predicted
    relabelled: list[str] = field(default_factory=list)  # same row, other family or group

    @property
    def ok(self) -> bool:
        return not (self.missing or self.added or self.moved or self.relabelled)

    def lines(self) -> list[str]:
        """One line per problem (none when up to date)."""
        out = [
            f"moved: {name}: r {old:+.4f} in the file, {new:+.4f} now"
            for name, old, new in self.moved
        ]
        out += [f"not in the file: {name}" for name in self.added]
        out += [f"no longer predicted: {name}" for name in self.missing]
        out += [f"labelled differently: {name}" for name in self.relabelled]
        return out

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "tolerance": TOLERANCE, "problems": self.lines()}


LABELS = ("family", "regime", "source", "device_family", "engine_family")


def check_bands(current: tuple[Residual, ...], committed: tuple[Residual, ...]) -> BandsCheck:
    """Whether the committed residuals are today's: the same rows, labels and, within
    TOLERANCE, log ratios."""
    now = {_key(r): r for r in current}
    old = {_key(r): r for r in committed}
    both = sorted(now.keys() & old.keys())
    return BandsCheck(
        moved=[
            (_name(k), old[k].log_ratio, now[k].log_ratio)
            for k in both
            if abs(old[k].log_ratio - now[k].log_ratio) > TOLERANCE
        ],
        added=[_name(k) for k in now if k not in old],
        missing=[_name(k) for k in old if k not in now],
        relabelled=[
            _name(k) for k in both if any(getattr(old[k], f) != getattr(now[k], f) for f in LABELS)
        ],
    )


def _name(key: tuple[str, str, str]) -> str:
    return " / ".join(key)


# -- held-out coverage ----------------------------------------------------------------------------
Holdout = Literal["row", "source"]


def covered(
    rows: tuple[Residual, ...], *, coverage: float = DEFAULT_COVERAGE, holdout: Holdout = "row"
) -> list[bool]:
    """Whether each row falls in the band the other rows give it (its own family, regime,
    device and engine family, as a prediction on its setup would look it up): without the row
    itself (`row`), or without every row of its source (`source`; a family left with no rows
    gives no band: not covered)."""
    out = []
    for i, row in enumerate(rows):
        others = [
            r
            for j, r in enumerate(rows)
            if (j != i if holdout == "row" else r.source != row.source)
        ]
        band = group_band(
            others,
            family=row.family,
            regime=row.regime,
            device_family=row.device_family,
            engine_family=row.engine_family,
            coverage=coverage,
            model_family=row.model_family,
            hardware=row.device,
        )
        out.append(band is not None and band.low <= row.log_ratio <= band.high)
    return out


def _fraction(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else float("nan")


def accepted_range(coverage: float, n: int | None = None) -> tuple[float, float]:
    """The held-out coverage `--check` accepts: within HALF_WIDTH of the stated coverage,
    widened by one row each way for a family of `n` rows (8 rows cover in steps of 12.5%)."""
    slack = HALF_WIDTH + (1 / n if n else 0.0)
    return coverage - slack, coverage + slack


def _ratios(band: Band) -> list[float]:
    return [round(math.exp(band.low), 4), round(math.exp(band.high), 4)]


def coverage_section(
    rows: tuple[Residual, ...], *, coverage: float = DEFAULT_COVERAGE
) -> dict[str, Any]:
    """The `bands` section of `llmsim validate --json`. Per family (and `all`): its rows and
    sources, the held-out coverage leave-one-out (`loo_coverage`) and leave-one-source-out
    (`source_out_coverage`), the range `--check` accepts for the former and whether it is in
    it. Then `groups`: the band of every group a validated setup gets, as ratios of measured
    to predicted time (a rate's band is their inverse)."""
    loo = covered(rows, coverage=coverage, holdout="row")
    loso = covered(rows, coverage=coverage, holdout="source")
    families: dict[str, Any] = {}
    for family in ("all", *FAMILY_LABELS):
        idx = [i for i, r in enumerate(rows) if family in ("all", r.family)]
        if not idx:
            continue
        low, high = accepted_range(coverage, None if family == "all" else len(idx))
        held = _fraction([loo[i] for i in idx])
        families[family] = {
            "n": len(idx),
            "sources": sorted({rows[i].source for i in idx}),
            "loo_coverage": held,
            "source_out_coverage": _fraction([loso[i] for i in idx]),
            "accepted": [low, high],
            "ok": low <= held <= high,
        }
    groups: dict[str, Any] = {}
    for r in rows:
        band = group_band(
            rows,
            family=r.family,
            regime=r.regime,
            device_family=r.device_family,
            engine_family=r.engine_family,
            coverage=coverage,
            model_family=r.model_family,
            hardware=r.device,
        )
        if band is not None and band.label not in groups:
            groups[band.label] = {
                "n": len(band.rows),
                "band": _ratios(band),
                "expected_coverage": band.expected_coverage,
            }
    return {"coverage": coverage, "families": families, "groups": dict(sorted(groups.items()))}


def has_e2e(df: pd.DataFrame) -> bool:
    """Whether `df` holds every end-to-end suite (the bands need all three)."""
    return set(E2E_SUITES) <= set(df["suite"].unique())


def bands_check(
    rows: tuple[Residual, ...], committed: tuple[Residual, ...], section: dict[str, Any]
) -> dict[str, Any]:
    """`llmsim validate --check`'s verdict on the bands: the committed file matches today's
    residuals (`residuals`) and every family's held-out coverage is in range (`coverage`)."""
    residual_check = check_bands(rows, committed)
    off = [name for name, entry in section["families"].items() if not entry["ok"]]
    return {
        "ok": residual_check.ok and not off,
        "residuals": residual_check.as_json(),
        "coverage": {"ok": not off, "out_of_range": off},
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def render_bands(section: dict[str, Any], console: Console) -> None:
    """The held-out coverage per family, then the band of each group."""
    c = section["coverage"]
    table = Table(
        "family",
        "rows",
        "sources",
        "leave-one-out",
        "leave-source-out",
        "accepted",
        title=f"Error bands at {c:.0%}: held-out coverage (the share of rows inside the band "
        "the other rows give them)",
    )
    for family, e in section["families"].items():
        low, high = e["accepted"]
        verdict = _pct(e["loo_coverage"]) + ("" if e["ok"] else " OUT OF RANGE")
        table.add_row(
            FAMILY_LABELS.get(family, family),
            str(e["n"]),
            ", ".join(e["sources"]),
            verdict,
            _pct(e["source_out_coverage"]),
            f"{_pct(low)}-{_pct(high)}",
        )
    console.print(table)
    groups = Table(
        "group",
        "rows",
        "measured / predicted time",
        "expected coverage",
        title=f"Error bands at {c:.0%} of the groups the validated setups get "
        "(a rate's band is the inverse)",
    )
    for label, g in section["groups"].items():
        low, high = g["band"]
        groups.add_row(label, str(g["n"]), f"{low:.3f} - {high:.3f}", _pct(g["expected_coverage"]))
    console.print(groups)


def render_bands_check(check: dict[str, Any], console: Console) -> None:
    """The bands' verdict: up to date and in range, or what is wrong."""
    if check["ok"]:
        console.print(
            f"error bands: {BANDS_PATH.name} matches today's predictions (within "
            f"{TOLERANCE} in ln ratio) and every family's held-out coverage is in range",
            markup=False,
            highlight=False,
        )
        return
    for line in check["residuals"]["problems"]:
        console.print(f"error bands: {line}", markup=False, highlight=False)
    if not check["residuals"]["ok"]:
        console.print(
            f"error bands: FAILED, {BANDS_PATH.name} is stale: rewrite it with "
            "`llmsim validate --write-bands`",
            markup=False,
            highlight=False,
        )
    for family in check["coverage"]["out_of_range"]:
        console.print(
            f"error bands: FAILED, held-out coverage of {family} out of range",
            markup=False,
            highlight=False,
        )
