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
are drawn from a lognormal with the mean the benchmark's post gives for the task and an
assumed spread (`prompt_lengths`), as the README states.
The power rows of Llama 3.1 8B and 70B on H100 are what H100's power shape (hardware_specs/
h100_sxm.yaml `power`) was fitted to (`fit_power`; `python -m simulator.validate.energy --fit`
prints it): suite `e2e_energy_fit`. Everything else is held out: no other parameter was
fitted to these rows.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from functools import cache

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simulator.runs import runner
from simulator.runs.energy import PowerModel, step_utilisation
from simulator.specs.loader import hf_ids
from simulator.specs.workload import WorkloadSpec
from simulator.validate import data, store
from simulator.validate.e2e import row_engine_args
from simulator.validate.frame import finish
from simulator.workload.requests import RequestTable

SUITE, FIT_SUITE = "e2e_energy", "e2e_energy_fit"
# (hardware, checkpoint) of the power rows a device's power shape is fitted to
POWER_FIT = {
    ("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct"),
    ("h100_sxm", "meta-llama/Llama-3.1-70B-Instruct"),
}
SHAPE = ("active_fraction", "compute_fraction", "memory_fraction")
COLUMNS = [
    "source",
    "checkpoint",
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
# spread (sigma of ln tokens) is assumed: 1.2, a chat workload's shape, unclipped. (ShareGPT's
# measured prompt spread, `datasets.SHAREGPT_PROMPT_LOGNORMAL`, describes lengths inside vLLM's
# 4-1024-token filter, which these prompts do not pass through.)
PROMPT_MEAN_TOKENS = 224.0
PROMPT_SIGMA = 1.2
# --max-model-len 20480 with outputs up to 4096 tokens: prompts are at most the difference.
MAX_PROMPT_TOKENS = 20480 - 4096
SEED = 0
# The benchmark's sampling parameters (its driver's defaults).
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "repetition_penalty": 1.1}
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


@dataclasses.dataclass(frozen=True)
class Window:
    """One GPU's steps in the steady window: seconds of each inside it (`busy`), compute and
    memory utilisation of each (`power.step_work_s` over its duration), the window's length
    and the output tokens stamped in it."""

    busy: np.ndarray
    u_compute: np.ndarray
    u_memory: np.ndarray
    span: float
    tokens: float

    def power_w(self, model: PowerModel) -> float:
        """Average draw over the window: the steps at `model`'s power, the rest parked."""
        watts = model.power_w(u_compute=self.u_compute, u_memory=self.u_memory)
        busy = float(self.busy.sum())
        return (float(np.sum(self.busy * watts)) + model.parked_w * (self.span - busy)) / self.span


def steady_steps(result: runner.RunResult, batch: int) -> Window:
    """The run's steady window (`steady_window`) as one GPU sees it (every GPU of the replica
    runs the same steps)."""
    start, end = steady_window(result.sim.requests, batch)
    steps, requests = result.sim.steps, result.sim.requests
    stamps = steps["end_s"].to_numpy(dtype=float)
    tokens = steps["decode_tokens"].to_numpy(dtype=float)[(stamps >= start) & (stamps <= end)].sum()
    first = requests["first_token_s"].to_numpy(dtype=float)
    tokens += float(np.count_nonzero((first >= start) & (first <= end)))
    u_compute, u_memory = step_utilisation(
        steps,
        result.deployments[0],
        block_size=result.memory[0].block_size,
        sampling=result.scenario.workload.sampling,
    )
    starts = steps["start_s"].to_numpy(dtype=float)
    busy = np.clip(stamps, start, end) - np.clip(starts, start, end)
    return Window(
        busy=busy, u_compute=u_compute, u_memory=u_memory, span=end - start, tokens=float(tokens)
    )


def checkpoint_model(row: pd.Series) -> str:
    """The bundled model of the run's checkpoint where there is one (its config names each
    linear's weight format: Meta's FP8 405B keeps attention in bf16), else the row's model."""
    return hf_ids().get(str(row["checkpoint"]).lower(), str(row["model"]))


@dataclasses.dataclass(frozen=True)
class Simulated:
    """One published run as simulated: its median ITL (ms), steady window and deployment's
    power model."""

    median_itl_ms: float
    window: Window
    power: PowerModel


def simulate(row: pd.Series) -> Simulated:
    """One published run, simulated with its setup, requests and sampling."""
    batch = int(row["max_num_seqs"])
    placeholder = WorkloadSpec.model_validate(  # the run's own requests replace its lengths
        {
            "dataset": {"name": "random", "input_len": 1, "output_len": 1},
            "num_prompts": 1,
            "sampling": SAMPLING,
        }
    )
    scenario = runner.bench_scenario(
        model=checkpoint_model(row),
        hardware=str(row["hardware"]),
        workload=placeholder,
        engine_args=row_engine_args(
            row,
            enable_expert_parallel=str(row["enable_expert_parallel"]).lower() == "true",
            async_scheduling=str(row["async_scheduling"]).lower() == "true",
            max_num_seqs=batch,
            max_num_batched_tokens=int(row["max_num_batched_tokens"]),
        ),
        seed=SEED,
    )
    result = runner.run(scenario, requests=run_requests(row))
    return Simulated(
        median_itl_ms=float(result.summary["median_itl_ms"]),
        window=steady_steps(result, batch),
        power=PowerModel.from_hardware(result.deployments[0].hardware),
    )


def _case(row: pd.Series) -> str:
    quant = f" {row['quantization']}" if isinstance(row["quantization"], str) else ""
    return f"{row['model']} tp{row['tensor_parallel']}{quant} b{row['max_num_seqs']}"


def _fits_power(row: pd.Series) -> bool:
    return (str(row["hardware"]), str(row["checkpoint"])) in POWER_FIT


def _measured_power(row: pd.Series, tdp_w: float) -> float:
    """The run's average power per GPU, a fraction of the TDP."""
    return float(row["avg_power_w"]) / int(row["tensor_parallel"]) / tdp_w


def energy_cases(
    measured: pd.DataFrame, simulated: Sequence[Simulated] | None = None
) -> pd.DataFrame:
    """Three rows per published run (`kind` itl, throughput, power): see the module doc. The
    power rows POWER_FIT names are suite `e2e_energy_fit`, the rest `e2e_energy`. `simulated`:
    the runs as `simulate` gives them, in `measured`'s order (default: simulated here)."""
    if simulated is None:
        simulated = [simulate(row) for _, row in measured.iterrows()]
    rows = []
    for (_, row), got in zip(measured.iterrows(), simulated, strict=True):
        w, tdp = got.window, got.power.tdp_w
        pairs = {
            "itl": (got.median_itl_ms / 1e3, float(row["median_itl_ms"]) / 1e3),
            "throughput": (w.span / w.tokens, 1.0 / float(row["output_tokens_per_s"])),
            "power": (w.power_w(got.power) / tdp, _measured_power(row, tdp)),
        }
        for kind, (predicted, measured_value) in pairs.items():
            rows.append(
                {
                    "suite": FIT_SUITE if kind == "power" and _fits_power(row) else SUITE,
                    "device": row["hardware"],
                    "kind": kind,
                    "case": f"{_case(row)} {kind}",
                    "predicted_s": predicted,
                    "measured_s": measured_value,
                    "simulated_prompts": int(row["num_prompts"]),
                    "window_s": w.span,
                    **{c: row[c] for c in ("source", "engine", "engine_version", "model")},
                    **{c: row[c] for c in ("checkpoint", "tensor_parallel", "max_num_seqs")},
                }
            )
    df = pd.DataFrame(rows)
    parts = [finish(df[df["suite"] == name], suite=name, fitted=name == FIT_SUITE)
             for name in (SUITE, FIT_SUITE)]  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def simulated_runs() -> pd.DataFrame:
    """The bundled runs the suite simulates (max_num_seqs in SIMULATED_BATCHES)."""
    runs = data.read_measured("e2e/energy.csv", COLUMNS)
    return runs[runs["max_num_seqs"].isin(SIMULATED_BATCHES)].reset_index(drop=True)


@cache
def _simulated_run(index: int) -> Simulated:
    """Row `index` of `simulated_runs()`, simulated once per process (the suite and
    `fit_power` share it)."""
    return simulate(simulated_runs().iloc[index])


def _cases() -> pd.DataFrame:
    runs = simulated_runs()
    return energy_cases(runs, [_simulated_run(i) for i in range(len(runs))])


def _suite() -> pd.DataFrame:
    return store.stored(SUITE, _cases)


def e2e_energy_suite() -> pd.DataFrame:
    """The `e2e_energy` and `e2e_energy_fit` rows on the bundled ML.ENERGY runs (simulated
    once per process; a fresh copy each call)."""
    return _suite().copy()


# -- where a run's time went: the GPU's kernels or waiting -----------------------------------
@dataclasses.dataclass(frozen=True)
class DutySplit:
    """One run's seconds per output token split, by its power, into the GPU's steps and the
    GPU's waits. Simulated: the window's busy seconds over its tokens and the rest. Measured:
    the published power read as a mix of the model's draw over the simulated steps (`busy_w`)
    and the parked draw, `duty` = (measured - parked) / (busy_w - parked), clipped to [0, 1];
    `busy_s` = duty x the measured seconds per token, `wait_s` the rest."""

    sim_duty: float
    sim_busy_s: float
    sim_wait_s: float
    busy_w: float
    duty: float
    busy_s: float
    wait_s: float

    @property
    def kernel_ratio(self) -> float:
        """Measured over simulated GPU seconds per token: how much slower the device's own
        work ran than the cost model priced it (1 = exact)."""
        return self.busy_s / self.sim_busy_s

    @property
    def wait_ratio(self) -> float:
        """Measured over simulated wait (host or idle) seconds per token; inf where the
        simulation never waits."""
        return self.wait_s / self.sim_wait_s if self.sim_wait_s > 0 else math.inf


def duty_split(
    window: Window, model: PowerModel, *, measured_w: float, measured_s_per_token: float
) -> DutySplit:
    """`window`'s simulated split and the split the measured average power per GPU
    (`measured_w`) implies at the measured seconds per output token (see DutySplit). A run
    whose steps the model draws at its parked power carries no power signal: ValueError."""
    busy = float(window.busy.sum())
    if busy <= 0 or window.tokens <= 0:
        raise ValueError("the window holds no steps or no tokens")
    watts = model.power_w(u_compute=window.u_compute, u_memory=window.u_memory)
    busy_w = float(np.sum(window.busy * watts)) / busy
    if not busy_w > model.parked_w:
        raise ValueError(f"steps drawn at the parked power ({busy_w:.0f} W): no power signal")
    duty = min(max((measured_w - model.parked_w) / (busy_w - model.parked_w), 0.0), 1.0)
    sim_s = window.span / window.tokens
    return DutySplit(
        sim_duty=busy / window.span,
        sim_busy_s=busy / window.tokens,
        sim_wait_s=sim_s - busy / window.tokens,
        busy_w=busy_w,
        duty=duty,
        busy_s=duty * measured_s_per_token,
        wait_s=(1.0 - duty) * measured_s_per_token,
    )


def duty_table(hardware: str) -> pd.DataFrame:
    """Every simulated run of `hardware`, its seconds per output token split into GPU steps
    and waits, simulated and as the measured power implies (`duty_split`): one row per run,
    columns case, sim_duty, duty, sim_busy_us, busy_us, sim_wait_us, wait_us, kernel_ratio,
    busy_w. A run whose time is lost off the GPU shows a duty well under the simulated one and
    a kernel_ratio near 1; a run whose kernels are slower than priced shows the ratio above 1
    at the simulated duty."""
    runs = simulated_runs()
    picks = [i for i, h in enumerate(runs["hardware"]) if h == hardware]
    if not picks:
        raise ValueError(f"no ML.ENERGY runs on {hardware}")
    rows = []
    for i in picks:
        row, sim = runs.iloc[i], _simulated_run(i)
        split = duty_split(
            sim.window,
            sim.power,
            measured_w=_measured_power(row, sim.power.tdp_w) * sim.power.tdp_w,
            measured_s_per_token=1.0 / float(row["output_tokens_per_s"]),
        )
        rows.append(
            {
                "case": _case(row),
                "sim_duty": split.sim_duty,
                "duty": split.duty,
                "sim_busy_us": split.sim_busy_s * 1e6,
                "busy_us": split.busy_s * 1e6,
                "sim_wait_us": split.sim_wait_s * 1e6,
                "wait_us": split.wait_s * 1e6,
                "kernel_ratio": split.kernel_ratio,
                "busy_w": split.busy_w,
            }
        )
    return pd.DataFrame(rows)


# -- the power shape a device's rows fit ------------------------------------------------------
def fit_power(hardware: str) -> dict[str, float]:
    """The power shape (SHAPE: active, compute and memory fractions) that best predicts the
    steady power of `hardware`'s POWER_FIT runs, least squares on the relative error, each
    fraction bounded to [0, 5] (active to [0, 1])."""
    runs = simulated_runs()
    picks = [
        i
        for i, (_, r) in enumerate(runs.iterrows())
        if _fits_power(r) and r["hardware"] == hardware
    ]
    if not picks:
        raise ValueError(f"no power rows to fit on {hardware}")
    fit = runs.iloc[picks]
    sims = [_simulated_run(i) for i in picks]
    measured = np.array(
        [_measured_power(r, s.power.tdp_w) for (_, r), s in zip(fit.iterrows(), sims, strict=True)]
    )

    def residuals(shape: np.ndarray) -> np.ndarray:
        got = [
            s.window.power_w(dataclasses.replace(s.power, **dict(zip(SHAPE, shape, strict=True))))
            / s.power.tdp_w
            for s in sims
        ]
        return np.asarray(got) / measured - 1.0

    start = np.array([getattr(sims[0].power, name) for name in SHAPE])
    sol = least_squares(residuals, start, bounds=([0.0, 0.0, 0.0], [1.0, 5.0, 5.0]))
    return dict(zip(SHAPE, (float(v) for v in sol.x), strict=True))


def main(argv: list[str]) -> int:
    """`python -m simulator.validate.energy --fit [HARDWARE]`: print the fitted power shape;
    `--duty HARDWARE`: print each run's time split into GPU steps and waits (`duty_table`)."""
    usage = "usage: python -m simulator.validate.energy --fit [HARDWARE] | --duty HARDWARE"
    if not argv or argv[0] not in ("--fit", "--duty") or (argv[0] == "--duty" and len(argv) < 2):
        print(usage, file=sys.stderr)
        return 2
    hardware = argv[1] if len(argv) > 1 else "h100_sxm"
    known = set(simulated_runs()["hardware"])
    if hardware not in known:
        print(
            f"{data.MEASURED_DIR}/e2e/energy.csv: hardware: no runs on {hardware!r} "
            f"(runs on: {', '.join(sorted(known))})",
            file=sys.stderr,
        )
        return 2
    if argv[0] == "--duty":
        table = duty_table(hardware)
        with pd.option_context("display.width", 200, "display.max_rows", None):
            print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        return 0
    for name, value in fit_power(hardware).items():
        print(f"{name}: {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
