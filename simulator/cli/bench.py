"""`llmsim bench latency|throughput|serve`: predict what `vllm bench` measures, with its flags."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from simulator.cli.bench_flags import (
    PASS_EXTRA,
    AcrossKvOpt,
    AsyncOpt,
    ChunkedOpt,
    CpOpt,
    CpuOffloadOpt,
    DpOpt,
    DtypeOpt,
    EagerOpt,
    EnableLoraOpt,
    EngineOpt,
    EpOpt,
    GmuOpt,
    HostCpuOpt,
    KvBudgetOpt,
    KvDtypeOpt,
    KvEviction,
    KvEvictionOpt,
    KvOffloadBackendOpt,
    KvOffloadSizeOpt,
    KvPoolMode,
    KvPoolOpt,
    LoraPopularity,
    LoraPopularityOpt,
    LoraZipfAlphaOpt,
    MaxCpuLorasOpt,
    MaxLoraRankOpt,
    MaxLorasOpt,
    MaxModelLenOpt,
    MicroBatchOpt,
    ModelOpt,
    NanoOpt,
    NumLoraAdaptersOpt,
    OffloadConfigOpt,
    OutJsonOpt,
    OverlapTpOpt,
    PdPartitionOpt,
    PolicyOpt,
    PpOpt,
    PreemptOpt,
    PrefixCachingOpt,
    QuantOpt,
    ResultDirOpt,
    ResultFileOpt,
    SaveResultOpt,
    SeqsOpt,
    ShadowKvBudgetOpt,
    ShadowKvChunkOpt,
    ShadowKvOpt,
    ShadowKvRankOpt,
    SpecOpt,
    StepsOpt,
    StreamStepsOpt,
    SwapOpt,
    SwiftKvOpt,
    TokenizerOpt,
    TokensOpt,
    TpOpt,
    adapter_mix,
    engine_args,
    ignored_flags,
    kv_technique_args,
    parse_offload_flag,
    save_result,
)
from simulator.cli.common import (
    HardwareOpt,
    IntervalOpt,
    JsonOpt,
    note,
    out,
    print_json,
    write_json,
)
from simulator.errors import SpecError
from simulator.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from simulator.specs.workload import WorkloadSpec

bench_app = typer.Typer(
    help="Predict `vllm bench latency|throughput|serve`.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@bench_app.command("latency", context_settings=PASS_EXTRA)
def bench_latency_cmd(
    ctx: typer.Context,
    hardware: HardwareOpt,
    model: ModelOpt,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 8,
    input_len: Annotated[int, typer.Option("--input-len")] = 32,
    output_len: Annotated[int, typer.Option("--output-len")] = 128,
    tensor_parallel_size: TpOpt = 1,
    pipeline_parallel_size: PpOpt = 1,
    context_parallel_size: CpOpt = 1,
    data_parallel_size: DpOpt = 1,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = None,
    kv_cache_dtype: KvDtypeOpt = "auto",
    kv_budget: KvBudgetOpt = None,
    kv_eviction: KvEvictionOpt = KvEviction.snapkv,
    shadowkv_on: ShadowKvOpt = False,
    shadowkv_rank: ShadowKvRankOpt = None,
    shadowkv_budget: ShadowKvBudgetOpt = None,
    shadowkv_chunk: ShadowKvChunkOpt = None,
    swiftkv_layers: SwiftKvOpt = None,
    acrosskv: AcrossKvOpt = None,
    engine: EngineOpt = "vllm",
    enforce_eager: EagerOpt = False,
    async_scheduling: AsyncOpt = False,
    host_cpu: HostCpuOpt = None,
    overlap_tp_comm: OverlapTpOpt = False,
    nano_batches: NanoOpt = None,
    max_model_len: MaxModelLenOpt = None,
    gpu_memory_utilization: GmuOpt = None,
    max_num_seqs: SeqsOpt = None,
    max_num_batched_tokens: TokensOpt = None,
    enable_chunked_prefill: ChunkedOpt = None,
    num_iters: Annotated[int, typer.Option("--num-iters")] = 30,
    speculative_config: SpecOpt = None,
    cpu_offload_gb: CpuOffloadOpt = 0.0,
    offload_config: OffloadConfigOpt = None,
    output_json: OutJsonOpt = None,
    interval_coverage: IntervalOpt = 0.8,
    as_json: JsonOpt = False,
) -> None:
    """Latency of one batch: prefill, then decode to the output length (analytic)."""
    from simulator.runs.latency import estimate

    ignored_flags(ctx)
    if data_parallel_size != 1:
        raise SpecError(
            "bench latency runs one replica; drop --data-parallel-size", field="data_parallel_size"
        )
    result = estimate(
        model=model,
        hardware=hardware,
        batch_size=batch_size,
        input_len=input_len,
        output_len=output_len,
        engine=engine,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        context_parallel_size=context_parallel_size,
        dtype=dtype,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        kv_budget=kv_budget,
        kv_eviction=kv_eviction.value,
        enforce_eager=enforce_eager,
        async_scheduling=async_scheduling,
        host_cpu=host_cpu,
        overlap_tp_comm=overlap_tp_comm,
        nano_batches=nano_batches,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill,
        num_iters=num_iters,
        max_model_len=max_model_len,
        speculative_config=speculative_config,
        cpu_offload_gb=cpu_offload_gb,
        offload=parse_offload_flag(offload_config),
        **kv_technique_args(ctx.params),
    )
    data = result.as_json(interval_coverage=interval_coverage)
    write_json(output_json, data)
    if as_json:
        print_json(data)
        return
    _print_latency_summary(result, data)


def _print_latency_summary(result: Any, data: dict[str, Any]) -> None:
    from simulator.metrics.bands import band_lines, band_suffix
    from simulator.metrics.summary import bound_lines

    out.print(
        f"Avg latency: {result.latency_s:.6f} seconds{band_suffix(data, 'avg_latency', '.6f')}",
        markup=False,
    )
    for p, v in data["percentiles"].items():
        out.print(f"{p}% percentile latency: {v:.6f} seconds")
    out.print(
        f"TTFT (prefill of the batch): {format_seconds(result.ttft_s)}"
        f"{_seconds_band(data, 'ttft_s')}; TPOT (decode time per output token): "
        f"{format_seconds(result.tpot_s)}{_seconds_band(data, 'tpot_s')}",
        markup=False,
    )
    for line in bound_lines(data) + band_lines(data):
        out.print(line, markup=False, highlight=False)
    per_step = result.config.get("speculative_tokens_per_step")
    if per_step is not None and len(result.decode_steps):  # TPOT is then per output token
        out.print(
            f"Speculative decoding: {per_step:.2f} tokens per decode step on average; mean "
            f"decode step {format_seconds(float(result.decode_steps.mean()))}"
        )
    mem = result.memory
    out.print(
        f"Memory per device: {mem.summary()}; KV cache {format_bytes(mem.kv_cache_bytes)} "
        f"= {mem.kv_capacity_tokens:,} tokens"
    )
    engine = result.config.get("engine", "")
    title = f"Where the time goes (engine {engine}: bound 'cpu' rows are its CPU work)"
    table = Table("phase", "op", "count", "time", "share", "bound", title=title)
    for row in (
        result.breakdown().sort_values(["phase", "total_s"], ascending=[False, False]).itertuples()
    ):
        bound = row.bound
        if row.hidden_s > 0:  # launches the GPU's work covers add nothing to the step
            bound += ", hidden" if row.hidden_s >= row.total_s else ", partly hidden"
        table.add_row(
            row.phase,
            row.op,
            f"{row.count:g}",
            format_seconds(row.total_s),
            f"{row.share:.1%}",
            bound,
        )
    out.print(table)


def _seconds_band(data: dict[str, Any], key: str) -> str:
    """` [38.0 ms, 61.3 ms] at 80%` for a key in seconds with a band, else ''."""
    band = data.get(f"{key}_interval")
    if band is None:
        return ""
    low, high = band
    coverage = float(data["interval_coverage"])
    return f" [{format_seconds(low)}, {format_seconds(high)}] at {coverage:.0%}"


def sharegpt_file(path: str | None, *, tokenizer: str | None, seed: int) -> dict[str, Any]:
    """The ShareGPT dataset fields of `--dataset-path` (read as vLLM samples it), with a note
    on stderr when no tokenizer counts its tokens; SpecError when there is no such file.
    Without a path: none (the length model), and `tokenizer_unused`'s note."""
    if path is None:
        tokenizer_unused(tokenizer)
        return {}
    if Path(path).is_dir():
        raise SpecError("is a folder, not a ShareGPT JSON file", source=path)
    if not Path(path).is_file():
        raise SpecError("cannot read file (no such file)", source=path)
    if tokenizer is None:
        note(
            "token counts of the ShareGPT file are estimated from its text "
            "(about 4 bytes a token); --tokenizer PATH (a local tokenizer.json) counts them"
        )
    return {"path": path, "tokenizer": tokenizer, "seed": seed}


def tokenizer_unused(tokenizer: str | None) -> None:
    """vLLM's --tokenizer where it counts no ShareGPT file: a note that it changes nothing."""
    if tokenizer is not None:
        note("no effect on the prediction: --tokenizer (vLLM flag)")


class ThroughputDataset(str, Enum):
    random = "random"
    sharegpt = "sharegpt"


@bench_app.command("throughput", context_settings=PASS_EXTRA)
def bench_throughput_cmd(
    ctx: typer.Context,
    hardware: HardwareOpt,
    model: ModelOpt,
    input_len: Annotated[
        int | None, typer.Option("--input-len", help="random prompts' tokens [default: 1024]")
    ] = None,
    output_len: Annotated[
        int | None,
        typer.Option(
            "--output-len",
            help="output tokens [default: 128 for random, the dataset's for sharegpt]",
        ),
    ] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts")] = 1000,
    dataset_name: Annotated[
        ThroughputDataset, typer.Option("--dataset-name")
    ] = ThroughputDataset.random,
    dataset_path: Annotated[
        str | None, typer.Option("--dataset-path", help="with sharegpt: its JSON file")
    ] = None,
    tokenizer: TokenizerOpt = None,
    prefix_len: Annotated[
        int, typer.Option("--prefix-len", min=0, help="tokens every prompt shares, first")
    ] = 0,
    tensor_parallel_size: TpOpt = 1,
    pipeline_parallel_size: PpOpt = 1,
    context_parallel_size: CpOpt = 1,
    data_parallel_size: DpOpt = 1,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = None,
    kv_cache_dtype: KvDtypeOpt = "auto",
    kv_budget: KvBudgetOpt = None,
    kv_eviction: KvEvictionOpt = KvEviction.snapkv,
    shadowkv_on: ShadowKvOpt = False,
    shadowkv_rank: ShadowKvRankOpt = None,
    shadowkv_budget: ShadowKvBudgetOpt = None,
    shadowkv_chunk: ShadowKvChunkOpt = None,
    swiftkv_layers: SwiftKvOpt = None,
    acrosskv: AcrossKvOpt = None,
    engine: EngineOpt = "vllm",
    enforce_eager: EagerOpt = False,
    async_scheduling: AsyncOpt = False,
    host_cpu: HostCpuOpt = None,
    overlap_tp_comm: OverlapTpOpt = False,
    nano_batches: NanoOpt = None,
    pd_partition: PdPartitionOpt = None,
    max_model_len: MaxModelLenOpt = None,
    gpu_memory_utilization: GmuOpt = None,
    max_num_seqs: SeqsOpt = None,
    max_num_batched_tokens: TokensOpt = None,
    enable_chunked_prefill: ChunkedOpt = None,
    scheduling_policy: PolicyOpt = None,
    preemption_mode: PreemptOpt = None,
    num_scheduler_steps: StepsOpt = None,
    multi_step_stream_outputs: StreamStepsOpt = None,
    swap_space: SwapOpt = 4.0,
    enable_prefix_caching: PrefixCachingOpt = None,
    kv_offloading_size: KvOffloadSizeOpt = None,
    kv_pool: KvPoolOpt = KvPoolMode.off,
    kv_offloading_backend: KvOffloadBackendOpt = None,
    seed: Annotated[int, typer.Option("--seed", min=0)] = 0,
    speculative_config: SpecOpt = None,
    cpu_offload_gb: CpuOffloadOpt = 0.0,
    offload_config: OffloadConfigOpt = None,
    enable_expert_parallel: EpOpt = False,
    pipeline_micro_batching: MicroBatchOpt = False,
    enable_lora: EnableLoraOpt = False,
    max_loras: MaxLorasOpt = None,
    max_lora_rank: MaxLoraRankOpt = None,
    max_cpu_loras: MaxCpuLorasOpt = None,
    num_lora_adapters: NumLoraAdaptersOpt = None,
    lora_popularity: LoraPopularityOpt = LoraPopularity.uniform,
    lora_zipf_alpha: LoraZipfAlphaOpt = 1.0,
    output_json: OutJsonOpt = None,
    interval_coverage: IntervalOpt = 0.8,
    as_json: JsonOpt = False,
) -> None:
    """Offline throughput: every prompt submitted at t=0, served to completion (simulated)."""
    from simulator.metrics.summary import format_throughput_summary
    from simulator.runs import runner

    ignored_flags(ctx)
    dataset: dict[str, Any] | None = None
    if dataset_name is ThroughputDataset.sharegpt:
        if prefix_len:
            raise SpecError("applies to --dataset-name random", field="prefix_len")
        if input_len is not None:
            note("--input-len has no effect with ShareGPT (as in vLLM)")
        dataset = {"name": "sharegpt", "output_len": output_len}
        dataset |= sharegpt_file(dataset_path, tokenizer=tokenizer, seed=seed)
    else:
        if dataset_path:
            note(
                "--dataset-path is not read for --dataset-name random: llmsim draws random lengths"
            )
        tokenizer_unused(tokenizer)
    result, summary = runner.bench_throughput(
        model=model,
        hardware=hardware,
        input_len=input_len,
        output_len=output_len,
        num_prompts=num_prompts,
        prefix_len=prefix_len,
        engine_args=engine_args(ctx),
        seed=seed,
        dataset=dataset,
        adapters=adapter_mix(num_lora_adapters, lora_popularity, lora_zipf_alpha),
    )
    data = summary | runner.throughput_intervals(result, summary, coverage=interval_coverage)
    write_json(output_json, data)
    if as_json:
        print_json(data)
    else:
        sys.stdout.write(format_throughput_summary(data) + "\n")


class DatasetName(str, Enum):
    random = "random"
    sharegpt = "sharegpt"
    azure_code = "azure-code"
    azure_conv = "azure-conv"
    trace = "trace"


class EosModelName(str, Enum):
    instruct = "instruct"
    base = "base"


class RampUpStrategy(str, Enum):
    linear = "linear"
    exponential = "exponential"


def ramp_up(
    strategy: RampUpStrategy | None, start: int | None, end: int | None
) -> dict[str, object] | None:
    """vLLM's --ramp-up-* flags as the workload's `ramp_up` (None without a strategy; vLLM
    ignores the rates then, as llmsim does, with a note)."""
    if strategy is None:
        if start is not None or end is not None:
            note(
                "--ramp-up-start-rps/--ramp-up-end-rps have no effect without "
                "--ramp-up-strategy (as in vLLM)"
            )
        return None
    if start is None or end is None:
        raise SpecError(  # vLLM's words
            "When using --ramp-up-strategy, both --ramp-up-start-rps and --ramp-up-end-rps "
            "must be specified",
            field="ramp_up_strategy",
        )
    return {"strategy": strategy.value, "start_rps": start, "end_rps": end}


@bench_app.command("serve", context_settings=PASS_EXTRA)
def bench_serve_cmd(
    ctx: typer.Context,
    hardware: HardwareOpt,
    model: ModelOpt,
    dataset_name: Annotated[DatasetName, typer.Option("--dataset-name")] = DatasetName.random,
    dataset_path: Annotated[str | None, typer.Option("--dataset-path")] = None,
    tokenizer: TokenizerOpt = None,
    random_input_len: Annotated[int, typer.Option("--random-input-len")] = 1024,
    random_output_len: Annotated[int, typer.Option("--random-output-len")] = 128,
    random_range_ratio: Annotated[float, typer.Option("--random-range-ratio")] = 0.0,
    sharegpt_output_len: Annotated[
        int | None,
        typer.Option("--sharegpt-output-len", help="every ShareGPT request's output length"),
    ] = None,
    random_prefix_len: Annotated[
        int, typer.Option("--random-prefix-len", min=0, help="tokens every prompt shares, first")
    ] = 0,
    ignore_eos: Annotated[
        bool,
        typer.Option(
            "--ignore-eos",
            help="generate every request's full output length; without it ShareGPT requests "
            "stop where the model emits EOS (random ones never do, as in vLLM)",
        ),
    ] = False,
    eos_model: Annotated[
        EosModelName,
        typer.Option(
            "--eos-model",
            help="the measured stop profile when EOS is honoured: instruct or base checkpoints",
        ),
    ] = EosModelName.instruct,
    num_prompts: Annotated[int, typer.Option("--num-prompts")] = 1000,
    request_rate: Annotated[float, typer.Option("--request-rate")] = float("inf"),
    burstiness: Annotated[float, typer.Option("--burstiness")] = 1.0,
    ramp_up_strategy: Annotated[
        RampUpStrategy | None,
        typer.Option("--ramp-up-strategy", help="the rate grows from the start to the end RPS"),
    ] = None,
    ramp_up_start_rps: Annotated[int | None, typer.Option("--ramp-up-start-rps")] = None,
    ramp_up_end_rps: Annotated[int | None, typer.Option("--ramp-up-end-rps")] = None,
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0)] = 0,
    goodput: Annotated[
        list[str] | None, typer.Option("--goodput", help="ttft:MS tpot:MS e2el:MS")
    ] = None,
    percentile_metrics: Annotated[
        str | None,
        typer.Option(
            "--percentile-metrics",
            help="latencies the printed summary shows, of ttft,tpot,itl,e2el (default: all; "
            "the JSON has all)",
        ),
    ] = None,
    metric_percentiles: Annotated[
        str | None,
        typer.Option(
            "--metric-percentiles",
            help="percentiles to report besides 50, 90 and 99, e.g. 95,99.9",
        ),
    ] = None,
    router: Annotated[
        str,
        typer.Option(
            "--router",
            help="round_robin, least_outstanding, least_kv, power_of_two or prefix_affinity "
            "(SGLang's cache-aware policy) over the --data-parallel-size replicas",
        ),
    ] = "round_robin",
    temperature: Annotated[
        float, typer.Option("--temperature", min=0.0, help="sampling temperature (0: greedy)")
    ] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0)] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", min=-1, help="-1 or 0: off")] = -1,
    min_p: Annotated[float, typer.Option("--min-p", min=0.0, max=1.0, help="0: off")] = 0.0,
    logprobs: Annotated[
        int | None,
        typer.Option("--logprobs", min=0, max=20, help="top logprobs per token (default: none)"),
    ] = None,
    repetition_penalty: Annotated[
        float, typer.Option("--repetition-penalty", help="1: off (priced where the engine has it)")
    ] = 1.0,
    frequency_penalty: Annotated[
        float, typer.Option("--frequency-penalty", min=-2.0, max=2.0, help="0: off")
    ] = 0.0,
    presence_penalty: Annotated[
        float, typer.Option("--presence-penalty", min=-2.0, max=2.0, help="0: off")
    ] = 0.0,
    tensor_parallel_size: TpOpt = 1,
    pipeline_parallel_size: PpOpt = 1,
    context_parallel_size: CpOpt = 1,
    data_parallel_size: DpOpt = 1,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = None,
    kv_cache_dtype: KvDtypeOpt = "auto",
    kv_budget: KvBudgetOpt = None,
    kv_eviction: KvEvictionOpt = KvEviction.snapkv,
    shadowkv_on: ShadowKvOpt = False,
    shadowkv_rank: ShadowKvRankOpt = None,
    shadowkv_budget: ShadowKvBudgetOpt = None,
    shadowkv_chunk: ShadowKvChunkOpt = None,
    swiftkv_layers: SwiftKvOpt = None,
    acrosskv: AcrossKvOpt = None,
    engine: EngineOpt = "vllm",
    enforce_eager: EagerOpt = False,
    async_scheduling: AsyncOpt = False,
    host_cpu: HostCpuOpt = None,
    overlap_tp_comm: OverlapTpOpt = False,
    nano_batches: NanoOpt = None,
    pd_partition: PdPartitionOpt = None,
    max_model_len: MaxModelLenOpt = None,
    gpu_memory_utilization: GmuOpt = None,
    max_num_seqs: SeqsOpt = None,
    max_num_batched_tokens: TokensOpt = None,
    enable_chunked_prefill: ChunkedOpt = None,
    scheduling_policy: PolicyOpt = None,
    preemption_mode: PreemptOpt = None,
    num_scheduler_steps: StepsOpt = None,
    multi_step_stream_outputs: StreamStepsOpt = None,
    swap_space: SwapOpt = 4.0,
    enable_prefix_caching: PrefixCachingOpt = None,
    kv_offloading_size: KvOffloadSizeOpt = None,
    kv_pool: KvPoolOpt = KvPoolMode.off,
    kv_offloading_backend: KvOffloadBackendOpt = None,
    speculative_config: SpecOpt = None,
    cpu_offload_gb: CpuOffloadOpt = 0.0,
    offload_config: OffloadConfigOpt = None,
    enable_expert_parallel: EpOpt = False,
    pipeline_micro_batching: MicroBatchOpt = False,
    enable_lora: EnableLoraOpt = False,
    max_loras: MaxLorasOpt = None,
    max_lora_rank: MaxLoraRankOpt = None,
    max_cpu_loras: MaxCpuLorasOpt = None,
    num_lora_adapters: NumLoraAdaptersOpt = None,
    lora_popularity: LoraPopularityOpt = LoraPopularity.uniform,
    lora_zipf_alpha: LoraZipfAlphaOpt = 1.0,
    output_json: OutJsonOpt = None,
    save: SaveResultOpt = False,
    result_dir: ResultDirOpt = None,
    result_filename: ResultFileOpt = None,
    interval_coverage: IntervalOpt = 0.8,
    as_json: JsonOpt = False,
) -> None:
    """Online serving: requests arrive at --request-rate (simulated), vLLM's metrics out."""
    from simulator.metrics.summary import (
        format_serve_summary,
        parse_goodput,
        parse_metric_percentiles,
        parse_percentile_metrics,
    )
    from simulator.runs import runner

    ignored_flags(ctx)
    scenario = runner.bench_scenario(
        model=model,
        hardware=hardware,
        workload=serve_workload(ctx.params),
        engine_args=engine_args(ctx),
        max_concurrency=max_concurrency,
        goodput=parse_goodput(goodput) if goodput else None,
        router=router,
        seed=seed,
    )
    shown = parse_percentile_metrics(percentile_metrics)
    result = runner.run(scenario, percentiles=parse_metric_percentiles(metric_percentiles))
    data = result.summary | result.intervals(coverage=interval_coverage)
    write_json(output_json, data)
    if save:
        save_result(
            data,
            result_dir=result_dir,
            result_filename=result_filename,
            setup=saved_setup(ctx.params),
        )
    if as_json:
        print_json(data)
    else:
        text = format_serve_summary(
            data,
            metrics=shown,
            max_concurrency=max_concurrency,
            request_rate=request_rate,
        )
        sys.stdout.write(text + "\n")


# The sampling flags of `bench serve`, each the SamplingSpec field of its name.
SAMPLING_FLAGS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "logprobs",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)


def serve_workload(flags: dict[str, Any]) -> WorkloadSpec:
    """The WorkloadSpec of `bench serve`'s parsed flags (by parameter name)."""
    from simulator.specs.loader import validate
    from simulator.specs.workload import WorkloadSpec

    dataset = serve_dataset(flags)
    prefix = flags["random_prefix_len"]
    if prefix and flags["dataset_name"] is not DatasetName.random:
        raise SpecError("applies to --dataset-name random", field="random_prefix_len")
    rate_flags = ("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps")
    return validate(
        WorkloadSpec,
        {
            "dataset": dataset,
            "num_prompts": flags["num_prompts"],
            "request_rate": flags["request_rate"],
            "burstiness": flags["burstiness"],
            "ramp_up": ramp_up(*(flags[name] for name in rate_flags)),
            "prefix": {"tokens": prefix} if prefix else None,
            "sampling": {name: flags[name] for name in SAMPLING_FLAGS},
            # vLLM: --ignore-eos, or its random dataset, which sets it
            "ignore_eos": flags["ignore_eos"] or None,
            "eos_model": flags["eos_model"].value,
            "adapters": adapter_mix(
                flags["num_lora_adapters"], flags["lora_popularity"], flags["lora_zipf_alpha"]
            ),
        },
        source="bench serve",
    )


def serve_dataset(flags: dict[str, Any]) -> dict[str, Any]:
    """The workload's `dataset` of `bench serve`'s --dataset-* and --random-* flags."""
    name, path, tokenizer = flags["dataset_name"], flags["dataset_path"], flags["tokenizer"]
    dataset: dict[str, Any] = {"name": name.value}
    if name is DatasetName.random:
        dataset |= {
            "input_len": flags["random_input_len"],
            "output_len": flags["random_output_len"],
            "range_ratio": flags["random_range_ratio"],
        }
    if flags["sharegpt_output_len"] is not None:
        if name is not DatasetName.sharegpt:
            raise SpecError("applies to --dataset-name sharegpt", field="sharegpt_output_len")
        dataset["output_len"] = flags["sharegpt_output_len"]
    if name is DatasetName.trace:
        if not path:
            raise SpecError("--dataset-name trace needs --dataset-path", field="dataset_path")
        dataset["path"] = path
    elif name is DatasetName.sharegpt:  # with a path, as vLLM samples the file
        dataset |= sharegpt_file(path, tokenizer=tokenizer, seed=flags["seed"])
    elif path:  # a vllm command pasted as it is: say what stands in for the file
        stand_in = {
            DatasetName.random: "draws random lengths",
        }.get(name, "replays its bundled copy of that trace")
        note(
            f"--dataset-path is not read for --dataset-name "
            f"{name.value}: llmsim {stand_in} (--dataset-name trace reads a file)"
        )
    if name is not DatasetName.sharegpt:
        tokenizer_unused(tokenizer)
    return dataset


def saved_setup(flags: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's --save-result writes of the run's setup, from `bench serve`'s flags."""
    rate = flags["request_rate"]
    setup = {
        "backend": flags["engine"],
        "model_id": flags["model"],
        "num_prompts": flags["num_prompts"],
        "request_rate": rate if rate < float("inf") else "inf",  # as vLLM
        "burstiness": flags["burstiness"],
        "max_concurrency": flags["max_concurrency"],
    }
    if flags["ramp_up_strategy"] is not None:  # vLLM's keys
        setup["ramp_up_strategy"] = flags["ramp_up_strategy"].value
        setup["ramp_up_start_rps"] = flags["ramp_up_start_rps"]
        setup["ramp_up_end_rps"] = flags["ramp_up_end_rps"]
    return setup
