"""Error statistics of the suites and the one entry point, `run_validation`.

`summarize(df)` gives INTERFACE's `llmsim validate --json` object: per suite n, mean / median /
p90 / worst absolute percentage error, whether the suite's rows were used to fit parameters,
and the same statistics per device. `iteration` is the union of its two held-out sub-suites;
`iteration_engine_fit` holds the rows the engine's overheads were fitted to, `gemm_library_fit`
the GEMMs this project timed (the `cublas-13.1` library was fitted to them), `layers_fit` the
rows the GEMM library of Vidur's profiles was fitted to (`layers` holds the rest out), and
`elementwise_fit` the rows the one-block-per-token kernels' launch factors were fitted to,
`e2e_energy_fit` the ML.ENERGY power rows H100's power shape was fitted to, `moe_fit` the
fused-MoE kernel timings the `vllm` profile's fused_moe_fraction was fitted to (`moe` holds the
rest out), `sampler_fit` the H100 sampler timings the `vllm` profile's sampler passes were
fitted to (`sampler` holds the H200's out), `ops_amd_fit` the MI300X 8-bit GEMMs (AMD aiter's,
Llama 3.1 405B shapes) its 8-bit GEMM factors were fitted to (`ops_amd` holds 70B's out),
`ops_nvfp4_fit` the B200 NVFP4 GEMMs (vLLM's sweep of one shape) its fp4 GEMM factors were fitted
to (`ops_nvfp4` holds helion's m-1 timings of other shapes out).
`e2e_serving_curve`'s entry also holds its TTFT and ITL statistics with their signed medians
(`by_kind`) and each curve's knee (`knees`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import SpecError
from simulator.validate import store
from simulator.validate.amd import FIT_SUITE as AMD_FIT
from simulator.validate.amd import SUITE as AMD
from simulator.validate.amd import amd_suite
from simulator.validate.e2e import (
    LATENCY,
    SERVING,
    THROUGHPUT,
    e2e_latency_suite,
    e2e_serving_suite,
    e2e_throughput_suite,
)
from simulator.validate.elementwise import FIT as ELEMENTWISE_FIT
from simulator.validate.elementwise import SUITE as ELEMENTWISE
from simulator.validate.elementwise import elementwise_suite
from simulator.validate.energy import FIT_SUITE as ENERGY_FIT
from simulator.validate.energy import SUITE as ENERGY
from simulator.validate.energy import e2e_energy_suite
from simulator.validate.frame import COLUMNS
from simulator.validate.gemm_library import SUITE as GEMM_LIBRARY_FIT
from simulator.validate.gemm_library import gemm_library_suite
from simulator.validate.iteration import DECODE, ENGINE_FIT, PREFILL, iteration_suite
from simulator.validate.layers import FIT as LAYERS_FIT
from simulator.validate.layers import SUITE as LAYERS
from simulator.validate.layers import layers_suite
from simulator.validate.moe import FIT_SUITE as MOE_FIT
from simulator.validate.moe import SUITE as MOE
from simulator.validate.moe import moe_suite
from simulator.validate.names import SUITE_NAMES, UNIONS
from simulator.validate.nvfp4 import FIT_SUITE as NVFP4_FIT
from simulator.validate.nvfp4 import SUITE as NVFP4
from simulator.validate.nvfp4 import nvfp4_suite
from simulator.validate.operators import ops_suite
from simulator.validate.power import POWER, POWER_FIT, power_suite
from simulator.validate.sampler import FIT_SUITE as SAMPLER_FIT
from simulator.validate.sampler import SUITE as SAMPLER
from simulator.validate.sampler import sampler_suite
from simulator.validate.serving_curve import SUITE as SERVING_CURVE
from simulator.validate.serving_curve import curve_section, e2e_serving_curve_suite

# `names` holds SUITE_NAMES and UNIONS (light to import: the CLI's help lists them).
STAT_KEYS = ("mape_pct", "median_ape_pct", "p90_ape_pct", "worst_ape_pct")


def members(name: str) -> tuple[str, ...]:
    """The row-level suites (`suite` column values) a suite name covers."""
    return UNIONS.get(name, (name,))


def error_stats(ape_pct: np.ndarray | pd.Series) -> dict[str, Any]:
    """n, mean (MAPE), median, p90 and worst of absolute percentage errors."""
    a = np.asarray(ape_pct, dtype=float)
    if a.size == 0:
        return {"n": 0, **dict.fromkeys(STAT_KEYS, float("nan"))}
    return {
        "n": int(a.size),
        "mape_pct": float(a.mean()),
        "median_ape_pct": float(np.median(a)),
        "p90_ape_pct": float(np.percentile(a, 90)),
        "worst_ape_pct": float(a.max()),
    }


def suite_entry(rows: pd.DataFrame) -> dict[str, Any]:
    """One suite's JSON entry: error_stats, `fitted`, and error_stats per device."""
    return {
        **error_stats(rows["ape_pct"]),
        "fitted": bool(rows["fitted"].astype(bool).any()),
        "by_device": {
            str(device): error_stats(g["ape_pct"])
            for device, g in rows.groupby("device", sort=True)
        },
    }


def summarize(df: pd.DataFrame, names: list[str] | None = None) -> dict[str, Any]:
    """`{"suites": {name: entry}}` for each of `names` (default: every suite with rows; a
    union only when all its parts have rows)."""
    present = set(df["suite"].unique())
    if names is None:
        names = [n for n in SUITE_NAMES if set(members(n)) <= present]
        names += sorted(present - set(SUITE_NAMES))
    suites = {}
    for name in names:
        rows = df[df["suite"].isin(members(name))]
        if not rows.empty:
            suites[name] = suite_entry(rows)
    out: dict[str, Any] = {"suites": suites}
    e2e = [n for n in suites if n.startswith("e2e_") and not suites[n]["fitted"]]
    if e2e:
        out["end_to_end"] = end_to_end_entry(df[df["suite"].isin(e2e)])
    return out


def end_to_end_entry(rows: pd.DataFrame) -> dict[str, Any]:
    """The held-out end-to-end rows together: how many, their signed median error
    (predicted / measured - 1 of the row's quantity, a time or an energy: negative means
    llmsim predicts faster or cheaper than the hardware ran), the share predicted on that
    optimistic side, and the share within 25%."""
    signed = (rows["predicted_s"] / rows["measured_s"] - 1.0) * 100.0
    return {
        "suites": sorted(rows["suite"].unique()),
        "n": len(rows),
        "signed_median_pct": float(np.median(signed)),
        "optimistic_pct": float((signed < 0).mean() * 100.0),
        "within_25_pct": float((rows["ape_pct"] <= 25.0).mean() * 100.0),
    }


def resolve_suites(suites: list[str] | None) -> list[str]:
    """The suite names to report, in output order; a union brings its parts.
    Raises SpecError (field "suite") for an unknown name."""
    if not suites:
        return list(SUITE_NAMES)
    for name in suites:
        if name not in SUITE_NAMES:
            raise SpecError(f"unknown suite {name!r} ({', '.join(SUITE_NAMES)})", field="suite")
    wanted = {part for name in suites for part in (name, *UNIONS.get(name, ()))}
    return [n for n in SUITE_NAMES if n in wanted]


def _members_of(df: pd.DataFrame, needed: set[str]) -> pd.DataFrame:
    """The rows of a frame of several suites (fitted and held out) whose suite is `needed`."""
    return df[df["suite"].isin(needed)]


# The suites that simulate (or price tens of thousands of kernels), longest first, by the name
# their rows are kept under (store.py) and the function computing them: seconds of CPU on a
# 2-core machine of 2026, e2e_energy 74, e2e_throughput 73, e2e_serving_curve 18, ops 14,
# e2e_latency 2, e2e_serving 2; the others take under one second each.
SIMULATED: dict[str, Callable[[], pd.DataFrame]] = {
    ENERGY: e2e_energy_suite,
    THROUGHPUT: e2e_throughput_suite,
    SERVING_CURVE: e2e_serving_curve_suite,
    "ops": ops_suite,
    LATENCY: e2e_latency_suite,
    SERVING: e2e_serving_suite,
}


def run_suites(names: list[str], *, jobs: int = 1) -> pd.DataFrame:
    """The rows of the row-level suites `names` cover (each suite computed once; with
    `jobs` > 1, the simulated ones not yet at hand in a process each, up to `jobs` at once).
    `attrs["skipped"]` lists the cases left out, with the reason."""
    needed = {part for name in names for part in members(name)}
    simulated = needed | ({ENERGY} if ENERGY_FIT in needed else set())  # one run gives both
    store.prefetch(SIMULATED, [n for n in SIMULATED if n in simulated], jobs=jobs)
    frames, skipped, knees = [], [], []
    if "ops" in needed:
        frames.append(ops_suite())
    if GEMM_LIBRARY_FIT in needed:
        frames.append(gemm_library_suite())
    if needed & {AMD, AMD_FIT}:
        frames.append(_members_of(amd_suite(), needed))
    if needed & {NVFP4, NVFP4_FIT}:
        frames.append(_members_of(nvfp4_suite(), needed))
    if needed & {MOE, MOE_FIT}:
        frames.append(_members_of(moe_suite(), needed))
    if needed & {SAMPLER, SAMPLER_FIT}:
        frames.append(_members_of(sampler_suite(), needed))
    if needed & {LAYERS, LAYERS_FIT}:
        frames.append(_members_of(layers_suite(), needed))
    if needed & {ELEMENTWISE, ELEMENTWISE_FIT}:
        frames.append(_members_of(elementwise_suite(), needed))
    if needed & {PREFILL, DECODE, ENGINE_FIT}:
        it = iteration_suite()
        skipped += list(it.attrs.get("skipped", []))
        frames.append(_members_of(it, needed))
    if THROUGHPUT in needed:
        frames.append(e2e_throughput_suite())
    if SERVING in needed:
        frames.append(e2e_serving_suite())
    if SERVING_CURVE in needed:
        curves = e2e_serving_curve_suite()
        knees = list(curves.attrs.get("knees", []))
        frames.append(curves)
    if LATENCY in needed:
        lat = e2e_latency_suite()
        skipped += list(lat.attrs.get("skipped", []))
        frames.append(lat)
    if needed & {ENERGY, ENERGY_FIT}:
        frames.append(_members_of(e2e_energy_suite(), needed))
    if needed & {POWER, POWER_FIT}:
        pw = power_suite()
        skipped += list(pw.attrs.get("skipped", []))
        frames.append(_members_of(pw, needed))
    df = pd.concat(frames, ignore_index=True)
    df.attrs["skipped"] = list(dict.fromkeys(skipped))  # suites may skip the same case
    df.attrs["knees"] = knees
    return df


def run_validation(
    suites: list[str] | None = None, *, jobs: int = 1
) -> tuple[dict[str, Any], pd.DataFrame]:
    """Predict every case of the named suites (default: all) against the bundled
    measurements; returns (summarize's dict, the rows). Unknown name: SpecError. `jobs` > 1
    simulates the end-to-end suites (and `ops`) in that many processes at most: spawned
    processes, so a script calling it with jobs > 1 needs `if __name__ == "__main__":`."""
    names = resolve_suites(suites)
    df = run_suites(names, jobs=jobs)
    summary = summarize(df, names)
    if SERVING_CURVE in summary["suites"]:
        summary["suites"][SERVING_CURVE].update(curve_section(df))
    return summary, df


def worst_cases(df: pd.DataFrame, name: str, k: int = 5) -> pd.DataFrame:
    """The `k` rows of suite `name` with the largest error."""
    rows = df[df["suite"].isin(members(name))]
    return rows.nlargest(k, "ape_pct")


def write_rows(df: pd.DataFrame, path: str) -> None:
    """Every case of `df` (run_validation's rows) as CSV at `path`: the columns every suite
    has (`frame.COLUMNS`), then the suites' own (GEMM shape, batch, engine, source, ...),
    blank on other suites' rows. Power rows hold fractions of TDP in predicted_s /
    measured_s."""
    first = [c for c in COLUMNS if c in df]
    df[first + [c for c in df.columns if c not in first]].to_csv(path, index=False)


def kind_stats(df: pd.DataFrame) -> pd.DataFrame:
    """error_stats per (suite, device, kind): e.g. the ops suite split into GEMM, attention
    and collectives."""
    rows = [
        {"suite": s, "device": d, "kind": k, **error_stats(g["ape_pct"])}
        for (s, d, k), g in df.groupby(["suite", "device", "kind"], sort=True)
    ]
    return pd.DataFrame(rows)
