"""The `sampler` suites: vLLM's V1 sampler timed alone on an H100 and an H200.

Each row (`simulator/data/measured/llmsim/<device>/sampler.csv`, timed by this project with
`tools/measure_sampler.py`; method and provenance in the data README) is one call of vLLM
0.11.1's `Sampler.forward`, re-enacted op for op in PyTorch, for `batch` requests that all sample
one way (`path`) over a vocabulary of `vocab` entries: the summed GPU time of its kernels. The
model prices the same work the step timer adds to a step's sampled ops: the greedy pick (the
forward pass's `sampler` op) and the `vllm` profile's passes for that way of sampling
(`serving.steptime.sampler_passes`: the random draw, the top-p sort, the top-k, min-p, logprobs,
penalties), memory-bound kernels of their bytes per logit.

The passes' bytes per logit are fitted to the H100 rows of batch 32 and more (`fit_passes`;
`python -m simulator.validate.sampler --fit` prints them), each over the rows of its own way
of sampling with the passes before it fixed: suite `sampler_fit` (every H100 row of batch 32
and more). The H200 rows are held out: suite `sampler`. Rows of fewer than 32 sequences are
left out of both: there the calls take tens of microseconds, one-block reductions and launch
latencies the per-logit figures are not made for, a few percent of a step at most.
"""

from __future__ import annotations

import sys
from functools import cache

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from simulator.costmodel.ops import sampler_op
from simulator.costmodel.roofline import evaluate, total_time
from simulator.serving.steptime import logits_pass, sampler_passes
from simulator.specs import load_engine, load_hardware
from simulator.specs.engine import EngineSpec, LogitsPass
from simulator.specs.workload import SamplingSpec
from simulator.validate import data
from simulator.validate.frame import finish_split

SUITE, FIT_SUITE = "sampler", "sampler_fit"
DEVICES = ("h100_sxm", "h200_sxm")
FIT_HARDWARE = "h100_sxm"
MIN_BATCH = 32
COLUMNS = ["path", "batch", "vocab", "kernels", "kernel_ms", "copy_ms", "wall_ms"]
# How each path samples (tools/measure_sampler.py's parameters) and the path it adds a pass to.
PATHS: dict[str, tuple[dict[str, float], str | None]] = {
    "greedy": ({}, None),
    "random": ({"temperature": 0.7}, "greedy"),
    "top_p": ({"temperature": 0.7, "top_p": 0.9}, "random"),
    "top_k": ({"temperature": 0.7, "top_k": 50}, "random"),
    "top_k_top_p": ({"temperature": 0.7, "top_p": 0.9, "top_k": 50}, "random"),
    "min_p": ({"temperature": 0.7, "min_p": 0.1}, "random"),
    "logprobs": ({"logprobs": 5}, "greedy"),
    "penalties": ({"repetition_penalty": 1.1}, "greedy"),
}
# The pass each fitted path adds, in fitting order (a pass's rows price the passes before it).
FITTED = {
    "greedy": "greedy_pick",
    "random": "random_sample",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "logprobs": "logprobs",
    "penalties": "penalties",
}


def measured(device: str) -> pd.DataFrame:
    """The bundled sampler timings of one device, with its hardware id."""
    return data.read_measured(f"llmsim/{device}/sampler.csv", COLUMNS).assign(hardware=device)


def predict_s(rows: pd.DataFrame, engine: EngineSpec) -> np.ndarray:
    """GPU seconds of one sampler call per row (`hardware`, `path`, `batch`, `vocab`)."""
    out = np.zeros(len(rows))
    for (device, path, vocab), group in rows.groupby(["hardware", "path", "vocab"], sort=False):
        hw = load_hardware(str(device))
        seqs = group["batch"].to_numpy(dtype=float)
        seconds = np.ravel(total_time(evaluate([sampler_op(seqs, int(vocab))], hw, engine)))
        sampling = SamplingSpec.model_validate(PATHS[str(path)][0])
        for name, work in sampler_passes(engine, sampling).items():
            gpu_s, _ = logits_pass(name, work, rows=seqs, vocab=int(vocab), hw=hw, engine=engine)
            seconds = seconds + gpu_s
        out[rows.index.get_indexer(group.index)] = seconds
    return out


def _rows() -> pd.DataFrame:
    rows = pd.concat([measured(d) for d in DEVICES], ignore_index=True)
    return rows[rows["batch"] >= MIN_BATCH].reset_index(drop=True)


def sampler_cases(rows: pd.DataFrame, engine: EngineSpec) -> pd.DataFrame:
    """One row per timing: suite `sampler_fit` for the device the passes were fitted to, else
    `sampler`."""
    rows = rows.reset_index(drop=True)
    df = pd.DataFrame(
        {
            "device": rows["hardware"],
            "kind": "sampler",
            "case": [f"{r.path} {r.batch}x{r.vocab}" for r in rows.itertuples()],
            "predicted_s": predict_s(rows, engine),
            "measured_s": rows["kernel_ms"].to_numpy(dtype=float) * 1e-3,
            **{c: rows[c] for c in ("path", "batch", "vocab", "kernels")},
        }
    )
    fit = (rows["hardware"] == FIT_HARDWARE).to_numpy()
    return finish_split(df, fit, suite=SUITE, fit_suite=FIT_SUITE)


@cache
def _suite() -> pd.DataFrame:
    return sampler_cases(_rows(), load_engine("vllm"))


def sampler_suite() -> pd.DataFrame:
    """The `sampler` and `sampler_fit` rows (computed once per process; a fresh copy each
    call)."""
    return _suite().copy()


def _fit_pass(engine: EngineSpec, name: str, rows: pd.DataFrame, kernels: int) -> LogitsPass:
    """The engine's pass `name` with `kernels` kernels and the bytes per logit that best
    predict `rows` (least squares on the log of predicted / measured)."""
    seconds = rows["kernel_ms"].to_numpy(dtype=float) * 1e-3
    base = getattr(engine, name)
    cls = LogitsPass if base is None else type(base)
    extra = {} if base is None else base.model_dump()

    def priced(bytes_per_logit: float) -> LogitsPass:
        work = {**extra, "bytes_per_logit": bytes_per_logit, "kernels": kernels}
        return cls.model_validate(work)

    def loss(bytes_per_logit: float) -> float:
        trial = engine.model_copy(update={name: priced(bytes_per_logit)})
        return float(np.sum(np.log(predict_s(rows, trial) / seconds) ** 2))

    best = float(minimize_scalar(loss, bounds=(0.5, 2000.0), method="bounded").x)
    return priced(round(best, 1))


def fit_passes() -> dict[str, LogitsPass]:
    """The `vllm` profile's sampler passes fitted to the H100 rows, in FITTED's order: each
    pass's kernels, the median over its rows of the kernels its path runs beyond the path it
    adds to (greedy: beyond the generic sampler op's one); its bytes per logit fitted over its
    path's rows (`_fit_pass`), the passes fitted before it in place."""
    rows = _rows()
    rows = rows[rows["hardware"] == FIT_HARDWARE]
    keyed = rows.set_index(["path", "batch", "vocab"])
    engine = load_engine("vllm")
    fitted: dict[str, LogitsPass] = {}
    for path, name in FITTED.items():
        own = rows[rows["path"] == path].reset_index(drop=True)
        parent = PATHS[path][1]
        if parent is None:  # beyond the forward pass's generic sampler op: one kernel
            below = np.ones(len(own))
        else:
            keys = [(parent, b, v) for b, v in zip(own["batch"], own["vocab"], strict=True)]
            below = keyed.loc[keys, "kernels"].to_numpy()
        kernels = max(1, round(float(np.median(own["kernels"].to_numpy() - below))))
        fitted[name] = _fit_pass(engine, name, own, kernels)
        engine = engine.model_copy(update={name: fitted[name]})
    return fitted


def main(argv: list[str]) -> int:
    """`python -m simulator.validate.sampler --fit`: print the fitted passes."""
    if argv != ["--fit"]:
        print("usage: python -m simulator.validate.sampler --fit", file=sys.stderr)
        return 2
    for name, work in fit_passes().items():
        print(f"{name}: bytes_per_logit {work.bytes_per_logit:g}, kernels {work.kernels}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
