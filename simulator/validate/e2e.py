"""The end-to-end suites: whole benchmark runs against published results, held out.

- `e2e_throughput`: offline runs (every request submitted at t=0) against the published output
  tokens/s of the whole deployment (all TP GPUs). Rows compare seconds per output token
  (1 / throughput), so the error is that of the time to produce the benchmark's output.
- `e2e_serving`: median TTFT and median TPOT of a run with Poisson arrivals at a request rate.
- `e2e_latency`: static batches (one batch prefilled, then decoded to the output length, as
  `llmsim bench latency` predicts it) against the time the published figure implies: the whole
  batch from a throughput (batch x output length / tokens/s) or as timed (`benchmark_latency`),
  or the first token of one prompt.

Each row of `simulator/data/measured/e2e/*.csv` (provenance in the README there) is simulated
with the setup its source states: engine profile closest to the published version, model,
hardware, TP, precision, dataset, lengths, rate, and the scheduler flags of the published
command line. Where the harness picks settings itself, its rule is reproduced:
`trtllm-bench` sizes max_batch_size and max_num_tokens from the model, memory and lengths
(`trtllm_bench_settings`). No parameter was ever fitted to these rows (`fitted` is False).

What differs from the published runs, on purpose (see the data README):
- Fewer prompts where the metric is a steady-state rate: a fixed-length offline run simulates
  min(published, 2 x max_batch_size) prompts; a serving run simulates the first
  `SERVING_WINDOW_S` seconds of arrivals. ShareGPT offline runs keep the published count (their
  throughput includes the tail of long requests, which depends on the count).
- Without chunked prefill the simulator needs max_num_batched_tokens to hold a whole request
  (prompt + output, vLLM's rule), where TRT-LLM needs only the prompt: it is raised to that.
Not modelled: anything the engine profile does not describe for the published version
(SGLang 0.3 before its overlap scheduler, torch.compile, vLLM 0.6.0 returning a multi-step
block's tokens at its end).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from simulator.errors import SpecError
from simulator.runs import runner
from simulator.specs import HardwareSpec, ModelSpec, load_hardware, load_model
from simulator.specs.engine_args import EngineArgs
from simulator.specs.loader import validate
from simulator.specs.scenario import Scenario
from simulator.specs.workload import OFFLINE_BENCH_SAMPLING, SamplingSpec, WorkloadSpec
from simulator.units import GiB
from simulator.validate import data, store
from simulator.validate.frame import finish

THROUGHPUT, SERVING, LATENCY = "e2e_throughput", "e2e_serving", "e2e_latency"
# What every published run states: where it comes from and what ran.
RUN_COLUMNS = ["source", "harness", "engine", "engine_version", "hardware", "model", "dtype"]
SETUP_COLUMNS = [
    *RUN_COLUMNS,
    "quantization",
    "kv_cache_dtype",
    "tensor_parallel",
    "dataset",
    "num_prompts",
    "max_num_batched_tokens",
    "chunked_prefill",
    "gpu_memory_utilization",
    "num_scheduler_steps",
    "multi_step_stream_outputs",
]
THROUGHPUT_COLUMNS = [
    *SETUP_COLUMNS,
    "input_len",
    "output_len",
    "max_num_seqs",
    "output_tokens_per_s",
]
SERVING_COLUMNS = [*SETUP_COLUMNS, "request_rate", "median_ttft_ms", "median_tpot_ms"]
LATENCY_COLUMNS = [
    *RUN_COLUMNS,
    "quantization",
    "kv_cache_dtype",
    "tensor_parallel",
    "batch_size",
    "input_len",
    "output_len",
    "gpu_memory_utilization",
    "metric",
    "published",
]
# Seconds of Poisson arrivals simulated per serving row: the medians are steady-state values
# (60 s reproduce the published counts' medians within 3% on every bundled row).
SERVING_WINDOW_S = 60.0
# Offline fixed-length rows: simulate this many max_batch_size worth of prompts (at least two
# waves; 2x reproduces the published counts' throughput within 3% on average, 12% at worst).
OFFLINE_WAVES = 2
SEED = 0


# -- trtllm-bench's own settings ---------------------------------------------------------------
# Bytes per weight or KV element trtllm-bench assumes (tuning.py BYTES_PER_ELEM: FP8 1, NVFP4
# 0.5, else 2).
TRTLLM_BENCH_BYTES = {"fp8": 1.0, "fp4": 0.5}


def trtllm_bench_settings(
    model: ModelSpec,
    hw: HardwareSpec,
    *,
    tp: int,
    input_len: int,
    output_len: int,
    weight_bytes: float,
    kv_bytes: float,
) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) that `trtllm-bench throughput` picks when neither is
    given: tensorrt_llm/bench/build/tuning.py (calc_engine_setting, finetune_setting; the
    KV fraction 0.95 is that function's default) and, with chunked prefill off,
    bench/benchmark/utils/general.py get_settings raising max_num_tokens to max ISL +
    max_batch_size. Memory in GiB of the device's total (pynvml), pp = 1."""
    kv_heads = max(tp, model.attention.num_kv_heads)
    gib_per_token = 2 * model.num_layers * kv_heads * model.attention.head_dim * kv_bytes / GiB
    engine_gib = model.num_params * weight_bytes / GiB
    available_gib = hw.memory.capacity_bytes / GiB * tp - engine_gib
    requests = available_gib * 0.95 / (gib_per_token * (input_len + output_len))
    raw_bs = min(requests, 4096)
    raw_tokens = min(raw_bs * (1 + input_len / output_len), 32768)
    if raw_bs < 256:
        batch = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        batch = 128 * math.ceil(raw_bs / 128)
    else:
        batch = 256 * math.ceil(raw_bs / 256)
    if raw_tokens < 4096:
        tokens = max(2048, 256 * math.ceil(raw_tokens / 256))
    elif raw_tokens < 8192:
        tokens = 512 * math.ceil(raw_tokens / 512)
    else:
        tokens = 1024 * math.ceil(raw_tokens / 1024)
    return batch, max(tokens, input_len + batch)


# -- scenarios ------------------------------------------------------------------------------------
def _optional(value: Any) -> Any:
    """A blank CSV cell (NaN) as None."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _flag(value: Any) -> bool | None:
    value = _optional(value)
    return None if value is None else str(value).strip().lower() == "true"


def optional_int(value: Any) -> int | None:
    """A whole-number CSV cell, or None where it is blank."""
    value = _optional(value)
    return None if value is None else int(value)


def row_engine_args(row: pd.Series, **flags: Any) -> EngineArgs:
    """The engine flags every published row states (engine profile, TP, precision), and
    `flags`."""
    return EngineArgs(
        engine=str(row["engine"]),
        tensor_parallel_size=int(row["tensor_parallel"]),
        dtype=str(row["dtype"]),
        quantization=_optional(row["quantization"]),
        kv_cache_dtype=str(row["kv_cache_dtype"]),
        **flags,
    )


# Whether each harness sends ignore_eos (every request generates its full output length).
# sglang.bench_serving: on unless --disable-ignore-eos (sgl-project/sglang
# python/sglang/bench_serving.py, each request function's payload `"ignore_eos": not
# args.disable_ignore_eos`); vllm bench throughput and benchmark_latency: SamplingParams(...,
# ignore_eos=True) (vllm/benchmarks/throughput.py, latency.py); trtllm-bench and
# gptSessionBenchmark: the fixed output lengths they are given, run to the end.
HARNESS_IGNORES_EOS = {
    "sglang.bench_serving": True,
    "vllm bench throughput": True,
    "benchmark_latency": True,
    "trtllm-bench": True,
    "gptSessionBenchmark": True,
}


# Harnesses that run the engine in-process on token ids (vLLM's LLM class, trtllm-bench's
# own executor), not behind its API server: the `offline` entrypoint.
OFFLINE_HARNESSES = ("vllm bench throughput", "trtllm-bench")


def _scenario(row: pd.Series, *, num_prompts: int, rate: float) -> Scenario:
    """The scenario of one published run (its setup columns), with `num_prompts` prompts,
    sampling as its harness does (`vllm bench throughput` at temperature 1.0; the others
    greedy), at the entrypoint it ran (OFFLINE_HARNESSES in-process, the others against the
    API server, whose front-end the engine profile prices)."""
    offline = row["harness"] == "vllm bench throughput"
    if row["harness"] not in HARNESS_IGNORES_EOS:
        known = ", ".join(HARNESS_IGNORES_EOS)
        raise SpecError(f"unknown harness {row['harness']!r} ({known})", field="harness")
    workload = validate(
        WorkloadSpec,
        {
            "dataset": _dataset(row),
            "num_prompts": num_prompts,
            "request_rate": rate,
            "sampling": OFFLINE_BENCH_SAMPLING if offline else SamplingSpec(),
            "ignore_eos": HARNESS_IGNORES_EOS[row["harness"]],
        },
        source=f"e2e {row['source']}",
    )
    return runner.bench_scenario(
        model=str(row["model"]),
        hardware=str(row["hardware"]),
        workload=workload,
        engine_args=row_engine_args(
            row,
            gpu_memory_utilization=_optional(row["gpu_memory_utilization"]),
            max_num_seqs=optional_int(row.get("max_num_seqs")),
            max_num_batched_tokens=optional_int(row["max_num_batched_tokens"]),
            enable_chunked_prefill=_flag(row["chunked_prefill"]),
            num_scheduler_steps=optional_int(row["num_scheduler_steps"]),
            multi_step_stream_outputs=_flag(row["multi_step_stream_outputs"]),
        ),
        seed=SEED,
        entrypoint="offline" if row["harness"] in OFFLINE_HARNESSES else "server",
    )


def _dataset(row: pd.Series) -> dict[str, Any]:
    match row["dataset"]:
        case "random":  # fixed lengths (trtllm-bench token-norm-dist with stdev 0)
            return {
                "name": "random",
                "input_len": int(row["input_len"]),
                "output_len": int(row["output_len"]),
            }
        case "sharegpt":
            return {"name": "sharegpt"}
        case other:
            raise SpecError(f"unknown dataset {other!r} (random, sharegpt)", field="dataset")


def _offline_setup(row: pd.Series) -> tuple[pd.Series, int]:
    """The row with the harness's own settings filled in, and the prompts to simulate."""
    row = row.copy()
    published = int(row["num_prompts"])
    if row["harness"] != "trtllm-bench":
        return row, published
    model, hw = load_model(str(row["model"])), load_hardware(str(row["hardware"]))
    weight_bytes = TRTLLM_BENCH_BYTES.get(str(row["quantization"]), 2.0)
    kv_bytes = TRTLLM_BENCH_BYTES.get(str(row["kv_cache_dtype"]), 2.0)
    isl, osl = int(row["input_len"]), int(row["output_len"])
    batch, tokens = trtllm_bench_settings(
        model,
        hw,
        tp=int(row["tensor_parallel"]),
        input_len=isl,
        output_len=osl,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
    )
    row["max_num_seqs"] = batch
    row["max_num_batched_tokens"] = max(tokens, isl + osl)  # the simulator's no-chunking rule
    row["chunked_prefill"] = "false"
    return row, min(published, OFFLINE_WAVES * batch)


def _case(row: pd.Series) -> str:
    random = row["dataset"] == "random"
    lengths = f"{int(row['input_len'])}/{int(row['output_len'])}" if random else "sharegpt"
    quant = f" {row['quantization']}" if isinstance(row["quantization"], str) else ""
    return f"{row['engine']} {row['model']} tp{row['tensor_parallel']}{quant} {lengths}"


# -- suites ---------------------------------------------------------------------------------------
def throughput_cases(measured: pd.DataFrame) -> pd.DataFrame:
    """One row per published offline run: predicted and measured seconds per output token
    (1 / output tokens/s of the deployment); `kind` is the engine."""
    rows = []
    for _, published in measured.iterrows():
        row, prompts = _offline_setup(published)
        scenario = _scenario(row, num_prompts=prompts, rate=math.inf)
        predicted = float(runner.run(scenario).summary["output_throughput"])
        rows.append(
            {
                "device": row["hardware"],
                "kind": row["engine"],
                "case": _case(row),
                "predicted_s": 1.0 / predicted,
                "measured_s": 1.0 / float(row["output_tokens_per_s"]),
                "predicted_tokens_per_s": predicted,
                "measured_tokens_per_s": float(row["output_tokens_per_s"]),
                "simulated_prompts": prompts,
                **{c: row[c] for c in ("source", "engine_version", "model", "tensor_parallel")},
                "max_num_seqs": optional_int(row["max_num_seqs"]),
                "max_num_batched_tokens": optional_int(row["max_num_batched_tokens"]),
            }
        )
    return finish(pd.DataFrame(rows), suite=THROUGHPUT, fitted=False)


def serving_cases(measured: pd.DataFrame) -> pd.DataFrame:
    """Two rows per published serving run: median TTFT and median TPOT (`kind` ttft / tpot),
    from the first SERVING_WINDOW_S seconds of its arrivals."""
    rows = []
    for _, row in measured.iterrows():
        rate = float(row["request_rate"])
        prompts = min(int(row["num_prompts"]), math.ceil(SERVING_WINDOW_S * rate))
        scenario = _scenario(row, num_prompts=prompts, rate=rate)
        summary = runner.run(scenario).summary
        for metric in ("ttft", "tpot"):
            key = f"median_{metric}_ms"
            rows.append(
                {
                    "device": row["hardware"],
                    "kind": metric,
                    "case": f"{_case(row)} rate={rate:g} {metric}",
                    "predicted_s": float(summary[key]) / 1e3,
                    "measured_s": float(row[key]) / 1e3,
                    "simulated_prompts": prompts,
                    **{c: row[c] for c in ("source", "engine", "engine_version", "model")},
                }
            )
    return finish(pd.DataFrame(rows), suite=SERVING, fitted=False)


def measured_latency_s(row: pd.Series) -> float:
    """Seconds of the static batch a published figure implies: batch x output length over
    the deployment's output tokens/s (`output_tokens_per_s_per_gpu` x TP), the whole batch's
    latency as `benchmark_latency` reports it (`latency_ms`), or the first-token latency of a
    one-token run (`first_token_ms`)."""
    value = float(row["published"])
    match row["metric"]:
        case "output_tokens_per_s_per_gpu":
            tokens = int(row["batch_size"]) * int(row["output_len"])
            return tokens / (value * int(row["tensor_parallel"]))
        case "latency_ms":
            return value / 1e3
        case "first_token_ms" if int(row["output_len"]) == 1:
            return value / 1e3
        case "first_token_ms":
            raise SpecError("first_token_ms needs output_len 1", field="output_len")
        case other:
            raise SpecError(
                f"unknown metric {other!r} (output_tokens_per_s_per_gpu, latency_ms, "
                "first_token_ms)",
                field="metric",
            )


def latency_cases(measured: pd.DataFrame) -> pd.DataFrame:
    """One row per published static-batch run: the predicted latency of the whole batch
    (`simulator.estimate`: all prompts prefilled in one step, as the engine ran them, then
    output_len - 1 decode steps) against `measured_latency_s`; `kind` is `batch` (from a
    throughput) or `first_token`. A run the memory plan cannot hold is listed in
    `attrs["skipped"]` with the reason, not predicted."""
    from simulator.runs.latency import estimate  # the package's API imports this module's package

    rows, skipped = [], []
    for _, row in measured.iterrows():
        batch, isl, osl = int(row["batch_size"]), int(row["input_len"]), int(row["output_len"])
        tp = int(row["tensor_parallel"])
        quant = f" {row['quantization']}" if isinstance(row["quantization"], str) else ""
        case = f"{row['engine']} {row['model']} tp{tp}{quant} b{batch} {isl}/{osl}"
        measured_s = measured_latency_s(row)  # a bad metric fails even on a skipped row
        try:
            result = estimate(
                model=str(row["model"]),
                hardware=str(row["hardware"]),
                engine=str(row["engine"]),
                batch_size=batch,
                input_len=isl,
                output_len=osl,
                tensor_parallel_size=tp,
                dtype=str(row["dtype"]),
                quantization=_optional(row["quantization"]),
                kv_cache_dtype=str(row["kv_cache_dtype"]),
                max_num_seqs=batch,
                max_num_batched_tokens=max(batch * isl, isl + osl),
                enable_chunked_prefill=False,
                gpu_memory_utilization=_optional(row["gpu_memory_utilization"]),
                num_iters=1,
            )
        except SpecError as exc:
            if exc.field != "batch_size":
                raise
            skipped.append(f"{case}: {exc.reason}")
            continue
        rows.append(
            {
                "device": row["hardware"],
                "kind": "first_token" if row["metric"] == "first_token_ms" else "batch",
                "case": case,
                "predicted_s": result.latency_s,
                "measured_s": measured_s,
                **{c: row[c] for c in ("source", "engine", "engine_version", "model")},
                **{c: row[c] for c in ("tensor_parallel", "batch_size", "input_len")},
                "output_len": osl,
                "metric": row["metric"],
                "published": float(row["published"]),
            }
        )
    df = finish(pd.DataFrame(rows), suite=LATENCY, fitted=False)
    df.attrs["skipped"] = skipped
    return df


def _throughput_suite() -> pd.DataFrame:
    return store.stored(
        THROUGHPUT,
        lambda: throughput_cases(data.read_measured("e2e/throughput.csv", THROUGHPUT_COLUMNS)),
    )


def _serving_suite() -> pd.DataFrame:
    return store.stored(
        SERVING, lambda: serving_cases(data.read_measured("e2e/serving.csv", SERVING_COLUMNS))
    )


def _latency_suite() -> pd.DataFrame:
    return store.stored(
        LATENCY, lambda: latency_cases(data.read_measured("e2e/latency.csv", LATENCY_COLUMNS))
    )


def e2e_throughput_suite() -> pd.DataFrame:
    """The `e2e_throughput` suite on the bundled published offline runs (simulated once per
    process, a few seconds; a fresh copy each call)."""
    return _throughput_suite().copy()


def e2e_serving_suite() -> pd.DataFrame:
    """The `e2e_serving` suite on the bundled published serving runs (simulated once per
    process; a fresh copy each call)."""
    return _serving_suite().copy()


def e2e_latency_suite() -> pd.DataFrame:
    """The `e2e_latency` suite on the bundled published static-batch runs (a fresh copy each
    call; the runs it cannot hold are in `attrs["skipped"]`)."""
    return _latency_suite().copy()  # pandas copies attrs deeply: a fresh skipped list too
