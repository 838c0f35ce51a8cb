"""The `e2e_serving_curve` suite: published TTFT and ITL against load, through the knee.

Each curve of `simulator/data/measured/e2e/serving_curve.csv` (provenance in the README there)
is one published sweep of a serving benchmark over its load: the client's concurrency (a
closed loop: `load_kind` concurrency) or a Poisson request rate (`load_kind` rate). Every point
is simulated with the setup its source states, at the same load, and gives two rows: TTFT
(`kind` ttft) and ITL (`kind` itl), the statistic the source publishes (`statistic`: mean or
median). No parameter was ever fitted to these rows (`fitted` is False).

The knee (docs/validation.md, "The knee of a serving curve"): the load at which the served
output throughput reaches KNEE_FRACTION of the most the sweep served, linearly interpolated
between the two points around it; past it, added load buys little throughput and queues
instead. The same rule runs on the measured and on the predicted throughputs at the published
loads. A curve whose own last step still raised its throughput by SATURATED_GAIN or more has
not reached its knee inside the sweep: its knee is not defined (None), and the comparison is
skipped with that reason.

Requests: a point simulates the count its source published (`num_prompts`). Where that is
blank, a concurrency point simulates CONCURRENCY_WAVES x concurrency requests and a rate point
the first RATE_WINDOW_S seconds of arrivals.

TTFT follows the harness (HARNESS_STEADY_STATE). A closed loop's first wave is sent at once, a
burst no steady state has. Harnesses that measure the steady state leave it out, and so does
the suite: perf_analyzer (under genai-perf) "measures the throughput and latency over a time
window, and then repeats the measurements until it gets stable values" with N requests "always
outstanding" (Triton's perf_analyzer guide, concurrency mode), AIPerf runs a warm-up phase
first; there the TTFT is that of the requests after the first wave. sglang.bench_serving
averages over every request it sent, the burst included, and so does the suite. ITL and
throughput are always the whole run's (the burst moves them by up to 3% on K1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import SpecError
from simulator.runs import runner
from simulator.specs.loader import validate
from simulator.specs.workload import SamplingSpec, WorkloadSpec
from simulator.validate import data, store
from simulator.validate.e2e import optional_int, row_engine_args
from simulator.validate.frame import finish

SUITE = "e2e_serving_curve"
COLUMNS = [
    "source",
    "curve",
    "harness",
    "engine",
    "engine_version",
    "hardware",
    "gpu",
    "model",
    "checkpoint",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "tensor_parallel",
    "dataset",
    "input_len",
    "output_len",
    "length_spread",
    "num_prompts",
    "max_model_len",
    "load_kind",
    "load",
    "statistic",
    "ttft_ms",
    "itl_ms",
    "output_tokens_per_s",
]
LOAD_KINDS = ("concurrency", "rate")
# How a point's lengths are drawn: `fixed` (every request input_len / output_len tokens) or
# `uniform` (each request's input and output drawn uniformly from 1 to input_len / output_len:
# sglang.bench_serving's `--random-range-ratio 0`, whose sample_random_requests draws
# np.random.randint(max(int(len * ratio), 1), len + 1)).
LENGTH_SPREADS = ("fixed", "uniform")
STATISTICS = ("mean", "median")
# The knee: the load at which the served throughput reaches this fraction of the sweep's most.
KNEE_FRACTION = 0.9
# A sweep has reached its knee when its last step raised the throughput by less than this.
SATURATED_GAIN = 0.05
# Requests simulated per concurrency point, in waves of the concurrency, where the source does
# not publish its count (`num_prompts` blank).
CONCURRENCY_WAVES = 8
# Seconds of Poisson arrivals simulated per rate point where the count is not published (as
# `e2e.SERVING_WINDOW_S`).
RATE_WINDOW_S = 60.0
# Whether each harness's TTFT is its steady state's (True: the opening wave of a closed loop is
# left out) or the mean over every request it sent, the opening burst included (False).
# genai-perf / AIPerf: perf_analyzer "measures the throughput and latency over a time window, and
# then repeats the measurements until it gets stable values" (Triton's perf_analyzer guide,
# concurrency mode) and AIPerf runs a warm-up phase first (module docstring).
# sglang.bench_serving: one test request, then every request of `--num-prompts` through an
# asyncio semaphore of `--max-concurrency`, and the metrics over all of them
# (sgl-project/sglang python/sglang/bench_serving.py, benchmark() and calculate_metrics(); the
# same in the copy dstackai/benchmarks Deepseek-R1/bench_serving.py that D1 ran).
HARNESS_STEADY_STATE = {
    "genai-perf (NIM benchmarking)": True,
    "sglang.bench_serving": False,
}
SEED = 0


# -- the knee -------------------------------------------------------------------------------------
def knee(load: Any, throughput: Any, *, fraction: float = KNEE_FRACTION) -> float | None:
    """The load of a sweep's knee: where `throughput` (ordered by `load`) first reaches
    `fraction` of its largest value, linearly interpolated between the two points around it.
    None when the sweep has not saturated: its last step raised the throughput by
    SATURATED_GAIN or more of the step's start (the knee lies beyond the sweep). Raises
    SpecError for fewer than two points, loads that are not strictly increasing, or a
    throughput that is not positive."""
    x = np.asarray(load, dtype=float)
    y = np.asarray(throughput, dtype=float)
    if x.size < 2 or x.size != y.size:
        raise SpecError("a sweep needs two or more (load, throughput) points", field="load")
    if np.any(np.diff(x) <= 0):
        raise SpecError("loads of a sweep must be strictly increasing", field="load")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise SpecError("throughputs of a sweep must be positive", field="output_tokens_per_s")
    if y[-1] >= y[-2] * (1.0 + SATURATED_GAIN):
        return None
    target = fraction * float(y.max())
    i = int(np.argmax(y >= target))
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = float(x[i - 1]), float(x[i]), float(y[i - 1]), float(y[i])
    return x0 + (x1 - x0) * (target - y0) / (y1 - y0)


# -- simulation -----------------------------------------------------------------------------------
def _check(measured: pd.DataFrame) -> None:
    for column, allowed in (
        ("load_kind", LOAD_KINDS),
        ("statistic", STATISTICS),
        ("length_spread", LENGTH_SPREADS),
    ):
        bad = sorted(set(measured[column].astype(str)) - set(allowed))
        if bad:
            raise SpecError(
                f"unknown {column} {bad[0]!r} ({', '.join(allowed)})",
                field=column,
            )
    if (measured["dataset"].astype(str) != "random").any():
        raise SpecError("serving curves need fixed lengths (dataset random)", field="dataset")
    bad = sorted(set(measured["harness"].astype(str)) - set(HARNESS_STEADY_STATE))
    if bad:
        known = ", ".join(HARNESS_STEADY_STATE)
        raise SpecError(f"unknown harness {bad[0]!r} ({known})", field="harness")
    for column in ("num_prompts", "max_model_len"):  # whole numbers where given
        values = pd.to_numeric(measured[column], errors="coerce")
        given = measured[column].notna()
        if (given & ~(values >= 1)).any() or (values.dropna() % 1 != 0).any():
            raise SpecError(f"{column} must be a whole number >= 1 or blank", field=column)


def _published_prompts(row: pd.Series) -> int | None:
    """The request count the source published for this point, or None (blank)."""
    return optional_int(row["num_prompts"])


def random_dataset(input_len: int, output_len: int, spread: str) -> dict[str, Any]:
    """The `random` dataset of a point: fixed lengths, or for `uniform` vLLM's centred form of
    a uniform draw from 1 to each length (centre m = len // 2 and range ratio (m - 1.5) / m give
    the integers floor(1.5) = 1 to ceil(2m - 1.5) = 2m - 1: 1 ... 1023 for 1024, one token
    short of sglang.bench_serving's top for an even length, its mean 0.1% low)."""
    if spread == "fixed":
        return {"name": "random", "input_len": input_len, "output_len": output_len}
    mid_in, mid_out = input_len // 2, output_len // 2
    if min(mid_in, mid_out) < 2:
        raise SpecError("a uniform spread needs lengths of 4 tokens or more", field="input_len")
    ratio_in, ratio_out = (mid_in - 1.5) / mid_in, (mid_out - 1.5) / mid_out
    if not math.isclose(ratio_in, ratio_out):
        raise SpecError(
            "a uniform spread needs input_len and output_len of the same size (one range "
            "ratio for both, as the harness has)",
            field="output_len",
        )
    return {"name": "random", "input_len": mid_in, "output_len": mid_out, "range_ratio": ratio_in}


def _point(row: pd.Series) -> tuple[dict[str, Any], int]:
    """The simulated summary of one published point, and the requests it simulated."""
    load = float(row["load"])
    concurrency = row["load_kind"] == "concurrency"
    published = _published_prompts(row)
    if published is not None:
        prompts = published
    elif concurrency:
        prompts = CONCURRENCY_WAVES * int(load)
    else:
        prompts = max(1, math.ceil(RATE_WINDOW_S * load))
    workload = validate(
        WorkloadSpec,
        {
            "dataset": random_dataset(
                int(row["input_len"]), int(row["output_len"]), str(row["length_spread"])
            ),
            "num_prompts": prompts,
            "request_rate": math.inf if concurrency else load,
            "sampling": SamplingSpec(),
        },
        source=f"{SUITE} {row['source']}",
    )
    scenario = runner.bench_scenario(
        model=str(row["model"]),
        hardware=str(row["hardware"]),
        workload=workload,
        engine_args=row_engine_args(row, max_model_len=optional_int(row["max_model_len"])),
        max_concurrency=int(load) if concurrency else None,
        seed=SEED,
    )
    result = runner.run(scenario)
    summary = dict(result.summary)
    if concurrency and HARNESS_STEADY_STATE[str(row["harness"])]:
        summary.update(steady_ttft_ms(result.sim.requests, int(load)))
    return summary, prompts


def steady_ttft_ms(requests: pd.DataFrame, first_wave: int) -> dict[str, float]:
    """Mean and median TTFT (ms) of the completed requests after the first `first_wave` sent
    (by send time): a closed loop's steady state, without its opening burst."""
    done = requests.dropna(subset=["first_token_s"]).sort_values(["arrival_s", "request_id"])
    later = done.iloc[first_wave:]
    if later.empty:  # CONCURRENCY_WAVES > 1 leaves some unless the run failed
        raise SpecError(f"no request after the first {first_wave} completed", field="load")
    ttft_ms = 1e3 * (later["first_token_s"] - later["arrival_s"]).to_numpy(float)
    return {"mean_ttft_ms": float(ttft_ms.mean()), "median_ttft_ms": float(np.median(ttft_ms))}


def serving_curve_cases(measured: pd.DataFrame) -> pd.DataFrame:
    """Two rows per published point (`kind` ttft and itl, the source's statistic), and in
    `attrs["knees"]` one entry per curve: measured and predicted knee loads and the knee's
    error in percent (None, with `skipped` saying why, when the measured curve or the
    predicted one does not reach its knee inside the sweep)."""
    _check(measured)
    rows, knees = [], []
    for curve, points in measured.groupby("curve", sort=False):
        points = points.sort_values("load")
        predicted_tput = []
        for _, row in points.iterrows():
            summary, prompts = _point(row)
            predicted_tput.append(float(summary["output_throughput"]))
            stat = str(row["statistic"])
            load = f"{row['load_kind']}={float(row['load']):g}"
            for kind in ("ttft", "itl"):
                rows.append(
                    {
                        "device": row["hardware"],
                        "kind": kind,
                        "case": f"{curve} {load} {stat} {kind}",
                        "predicted_s": float(summary[f"{stat}_{kind}_ms"]) / 1e3,
                        "measured_s": float(row[f"{kind}_ms"]) / 1e3,
                        "curve": curve,
                        "load_kind": row["load_kind"],
                        "load": float(row["load"]),
                        "statistic": stat,
                        "simulated_prompts": prompts,
                        "predicted_tokens_per_s": predicted_tput[-1],
                        "measured_tokens_per_s": float(row["output_tokens_per_s"]),
                        **{c: row[c] for c in ("source", "engine", "engine_version", "model")},
                    }
                )
        knees.append(_knee_entry(str(curve), points, predicted_tput))
    df = finish(pd.DataFrame(rows), suite=SUITE, fitted=False)
    df.attrs["knees"] = knees
    return df


def _knee_entry(curve: str, points: pd.DataFrame, predicted: list[float]) -> dict[str, Any]:
    first = points.iloc[0]
    loads = points["load"].to_numpy(float)
    measured_knee = knee(loads, points["output_tokens_per_s"].to_numpy(float))
    predicted_knee = knee(loads, predicted)
    skipped = None
    if measured_knee is None:
        skipped = "the measured sweep does not reach its knee"
    elif predicted_knee is None:
        skipped = "the predicted sweep does not reach its knee inside the published loads"
    error = None
    if measured_knee is not None and predicted_knee is not None:
        error = 100.0 * (predicted_knee - measured_knee) / measured_knee
    return {
        "curve": curve,
        "device": str(first["hardware"]),
        "engine": str(first["engine"]),
        "source": str(first["source"]),
        "load_kind": str(first["load_kind"]),
        "points": len(points),
        "measured_knee": measured_knee,
        "predicted_knee": predicted_knee,
        "error_pct": error,
        "skipped": skipped,
    }


def signed_stats(rows: pd.DataFrame) -> dict[str, Any]:
    """Per kind (ttft, itl): n, MAPE, median APE and the signed median of
    100 x (predicted - measured) / measured (positive: llmsim pessimistic, slower)."""
    out: dict[str, Any] = {}
    for kind, g in rows.groupby("kind", sort=True):
        signed = 100.0 * (g["predicted_s"] - g["measured_s"]) / g["measured_s"]
        out[str(kind)] = {
            "n": len(g),
            "mape_pct": float(g["ape_pct"].mean()),
            "median_ape_pct": float(g["ape_pct"].median()),
            "signed_median_pct": float(signed.median()),
        }
    return out


def curve_section(df: pd.DataFrame) -> dict[str, Any]:
    """The suite's extra JSON: `by_kind` (signed_stats), `knee_fraction` (KNEE_FRACTION) and
    `knees` (one entry per curve)."""
    rows = df[df["suite"] == SUITE]
    return {
        "by_kind": signed_stats(rows),
        "knee_fraction": KNEE_FRACTION,
        "knees": list(df.attrs.get("knees", [])),
    }


def _suite() -> pd.DataFrame:
    return store.stored(
        SUITE, lambda: serving_curve_cases(data.read_measured("e2e/serving_curve.csv", COLUMNS))
    )


def e2e_serving_curve_suite() -> pd.DataFrame:
    """The `e2e_serving_curve` suite on the bundled published sweeps (simulated once per
    process; a fresh copy each call, its knees in `attrs["knees"]`)."""
    return _suite().copy()
