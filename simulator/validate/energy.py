"""The `e2e_energy` suite: ML.ENERGY Benchmark v3.0 runs of vLLM 0.11.1 on H100 and B200, held
out.

Each published run (`simulator/data/measured/e2e/energy.csv`, provenance in the README there)
sends all its requests at t = 0 to one `vllm serve` with --max-num-seqs B and
--async-scheduling, and reports three steady-state figures, each a row here (`kind`):

- `itl`: the median inter-token latency over every decode gap of every request of the run
  (the summary's `median_itl_ms`), in seconds;
- `throughput`: output tokens per second in the steady-state window, compared as seconds per
  output token (1 / throughput, as `e2e_throughput`);
- `power`: average GPU power in that window per GPU, as a fraction of the TDP (as the `power`
  suite).

The window is the benchmark's (`steady_window`): from the moment B requests have received
their first token to the moment all but B + 1 have finished. Output lengths are the published
run's own histogram (`output_lengths`); prompt lengths are not published per run, so they
are drawn from a lognormal with the mean the benchmark's post gives for the task and the
spread of ShareGPT's prompts (`prompt_lengths`), an assumption the README states.
No parameter was fitted to these rows (`fitted` is False).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pandas as pd

from simulator import runner
from simulator.engine_args import EngineArgs
from simulator.power import GroupAccount, step_power_w
from simulator.serving.datasets import SHAREGPT_PROMPT_LOGNORMAL
from simulator.serving.workload import RequestTable, WorkloadSpec
from simulator.validate import data
from simulator.validate.e2e import _optional
from simulator.validate.frame import finish

SUITE = "e2e_energy"
COLUMNS = [
    "source",
    "harness",
    "engine",
    "engine_version",
    "hardware",
    "model",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "tensor_parallel",
    "enable_expert_parallel",
    "max_num_seqs",
    "max_num_batched_tokens",
    "async_scheduling",
    "num_prompts",
    "output_len_min",
    "output_len_max",
    "output_len_counts",
    "median_itl_ms",
    "output_tokens_per_s",
    "avg_power_w",
    "avg_batch_size",
]
# lm-arena-chat prompts: mean tokens per request (ML.ENERGY's v3.0 post: "mean 634 vs. 224",
# Problem Solving vs Text Conversation, in its table's column order; see the data README); the
# spread is ShareGPT's prompts' (sigma of ln tokens), a chat workload's shape.
PROMPT_MEAN_TOKENS = 224.0
PROMPT_SIGMA = SHAREGPT_PROMPT_LOGNORMAL[1]
# --max-model-len 20480 with outputs up to 4096 tokens: prompts are at most the difference.
MAX_PROMPT_TOKENS = 20480 - 4096
SEED = 0
# The benchmark's sampling parameters (its driver's defaults; repetition penalty 1.1 is not
# priced).
SAMPLING = {"temperature": 0.8, "top_p": 0.95}
# The runs simulated: every published run whose max_num_seqs is one of these (a sweep of each
# model and GPU by factors of 4, ~60 of the 130 rows, ~30 s); the CSV keeps them all.
SIMULATED_BATCHES = (8, 32, 128, 512, 2048)


def output_lengths(row: pd.Series) -> np.ndarray:
    """The run's output lengths from its published histogram (50 equal bins from
    `output_len_min` to `output_len_max`, `output_len_counts`): each bin's count spread evenly
    over the bin, as whole tokens."""
    counts = np.array(str(row["output_len_counts"]).split(), dtype=int)
    edges = np.linspace(float(row["output_len_min"]), float(row["output_len_max"]), len(counts) + 1)
    lengths = [
        lo + (np.arange(c) + 0.5) / c * (hi - lo)
        for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True)
        if c
    ]
    return np.maximum(np.rint(np.concatenate(lengths)), 1).astype(np.int64)


def prompt_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` prompt lengths: lognormal with mean PROMPT_MEAN_TOKENS and sigma PROMPT_SIGMA,
    clipped to [1, MAX_PROMPT_TOKENS]."""
    mu = math.log(PROMPT_MEAN_TOKENS) - PROMPT_SIGMA**2 / 2
    drawn = rng.lognormal(mu, PROMPT_SIGMA, size=n)
    return np.clip(np.rint(drawn), 1, MAX_PROMPT_TOKENS).astype(np.int64)


def run_requests(row: pd.Series) -> RequestTable:
    """Every request of the run at t = 0: the published output lengths in a random order,
    each with a drawn prompt length."""
    rng = np.random.default_rng(SEED)
    output = rng.permutation(output_lengths(row))
    if len(output) != int(row["num_prompts"]):
        raise ValueError(f"histogram holds {len(output)} requests, not {row['num_prompts']}")
    return RequestTable(
        arrival_s=np.zeros(len(output)),
        prompt_len=prompt_lengths(len(output), rng),
        output_len=output,
    )


def steady_window(requests: pd.DataFrame, batch: int) -> tuple[float, float]:
    """The benchmark's steady state: from the time `batch` requests have their first token to
    the time all but `batch` + 1 have finished."""
    first = np.sort(requests["first_token_s"].to_numpy(dtype=float))
    done = np.sort(requests["finish_s"].to_numpy(dtype=float))
    last = len(done) - batch - 2  # the finish that ends it
    if last < 0 or batch > len(first) or not done[last] > first[batch - 1]:
        raise ValueError(f"no steady state: batch {batch} of {len(done)} requests")
    return float(first[batch - 1]), float(done[last])


def window_figures(result: runner.RunResult, batch: int) -> dict[str, float]:
    """Output tokens per second and average power per GPU (W) in the steady window, and the
    window's length (s)."""
    start, end = steady_window(result.sim.requests, batch)
    steps, requests = result.sim.steps, result.sim.requests
    stamps = steps["end_s"].to_numpy(dtype=float)
    tokens = steps["decode_tokens"].to_numpy(dtype=float)[(stamps >= start) & (stamps <= end)].sum()
    first = requests["first_token_s"].to_numpy(dtype=float)
    tokens += float(np.count_nonzero((first >= start) & (first <= end)))
    # energy of one GPU (every GPU of the replica runs the same steps): steps clipped to the
    # window at their modelled power, the rest of it at idle
    dep, plan = result.deployments[0], result.memory[0]
    group = GroupAccount(deployment=dep, count=1, block_size=plan.block_size, usd_per_gpu_hour=0.0)
    watts = step_power_w(steps, group)
    lo = np.clip(steps["start_s"].to_numpy(dtype=float), start, end)
    hi = np.clip(stamps, start, end)
    busy = hi - lo
    span = end - start
    energy = float(np.sum(busy * watts)) + dep.hardware.power.idle_w * (span - float(busy.sum()))
    return {"output_tokens_per_s": tokens / span, "power_w": energy / span, "window_s": span}


def simulate(row: pd.Series) -> dict[str, float]:
    """Median ITL (ms), steady output tokens/s and power per GPU (W) of one published run."""
    batch = int(row["max_num_seqs"])
    placeholder = WorkloadSpec.model_validate(  # the run's own requests replace its lengths
        {
            "dataset": {"name": "random", "input_len": 1, "output_len": 1},
            "num_prompts": 1,
            "sampling": SAMPLING,
        }
    )
    scenario = runner.bench_scenario(
        model=str(row["model"]),
        hardware=str(row["hardware"]),
        workload=placeholder,
        engine_args=EngineArgs(
            engine=str(row["engine"]),
            tensor_parallel_size=int(row["tensor_parallel"]),
            dtype=str(row["dtype"]),
            quantization=_optional(row["quantization"]),
            kv_cache_dtype=str(row["kv_cache_dtype"]),
            enable_expert_parallel=str(row["enable_expert_parallel"]).lower() == "true",
            async_scheduling=str(row["async_scheduling"]).lower() == "true",
            max_num_seqs=batch,
            max_num_batched_tokens=int(row["max_num_batched_tokens"]),
        ),
        seed=SEED,
    )
    result = runner.run(scenario, requests=run_requests(row))
    return {
        "median_itl_ms": float(result.summary["median_itl_ms"]),
        **window_figures(result, batch),
    }


def _case(row: pd.Series) -> str:
    quant = f" {row['quantization']}" if isinstance(row["quantization"], str) else ""
    return f"{row['model']} tp{row['tensor_parallel']}{quant} b{row['max_num_seqs']}"


def energy_cases(measured: pd.DataFrame) -> pd.DataFrame:
    """Three rows per published run (`kind` itl, throughput, power): see the module doc."""
    from simulator.specs import load_hardware

    rows = []
    for _, row in measured.iterrows():
        got = simulate(row)
        gpus = int(row["tensor_parallel"])
        tdp = load_hardware(str(row["hardware"])).power.tdp_w
        pairs = {
            "itl": (got["median_itl_ms"] / 1e3, float(row["median_itl_ms"]) / 1e3),
            "throughput": (
                1.0 / got["output_tokens_per_s"],
                1.0 / float(row["output_tokens_per_s"]),
            ),
            "power": (got["power_w"] / tdp, float(row["avg_power_w"]) / gpus / tdp),
        }
        for kind, (predicted, measured_value) in pairs.items():
            rows.append(
                {
                    "device": row["hardware"],
                    "kind": kind,
                    "case": f"{_case(row)} {kind}",
                    "predicted_s": predicted,
                    "measured_s": measured_value,
                    "simulated_prompts": int(row["num_prompts"]),
                    "window_s": got["window_s"],
                    **{c: row[c] for c in ("source", "engine", "engine_version", "model")},
                    **{c: row[c] for c in ("tensor_parallel", "max_num_seqs")},
                }
            )
    return finish(pd.DataFrame(rows), suite=SUITE, fitted=False)


@cache
def _suite() -> pd.DataFrame:
    runs = data.read_measured("e2e/energy.csv", COLUMNS)
    return energy_cases(runs[runs["max_num_seqs"].isin(SIMULATED_BATCHES)])


def e2e_energy_suite() -> pd.DataFrame:
    """The `e2e_energy` suite on the bundled ML.ENERGY runs (simulated once per process; a
    fresh copy each call)."""
    return _suite().copy()
