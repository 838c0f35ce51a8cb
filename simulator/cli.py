"""The `llmsim` command line. Every command has a Python API twin in `simulator.api`.

Bad input of any kind exits with status 2 and one line on stderr naming the file, field and
reason (SpecError, or a usage error from the flag parser).
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from simulator import api, runner
from simulator.errors import SpecError
from simulator.metrics.summary import (
    format_serve_summary,
    format_throughput_summary,
    parse_goodput,
)
from simulator.scenario import Scenario
from simulator.serving.disagg import pool_lines
from simulator.serving.workload import WorkloadSpec
from simulator.specs import (
    list_engines,
    list_hardware,
    list_models,
    load_engine,
    load_hardware,
    load_model,
)
from simulator.specs.loader import validate
from simulator.units import GiB, format_bytes, format_seconds

app = typer.Typer(
    help="llmsim: performance simulator for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
hardware_app = typer.Typer(help="Accelerator specs.", no_args_is_help=True)
models_app = typer.Typer(help="Model catalogue.", no_args_is_help=True)
engines_app = typer.Typer(help="Serving-engine profiles.", no_args_is_help=True)
op_app = typer.Typer(help="Cost of one operator on one device.", no_args_is_help=True)
bench_app = typer.Typer(help="Predict `vllm bench latency|throughput|serve`.", no_args_is_help=True)
app.add_typer(hardware_app, name="hardware")
app.add_typer(models_app, name="models")
app.add_typer(engines_app, name="engines")
app.add_typer(op_app, name="op")
app.add_typer(bench_app, name="bench")

out = Console()


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


# -- hardware / models / engines ------------------------------------------------------------------
@hardware_app.command("list")
def hardware_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the hardware ids."""
    specs = [load_hardware(h) for h in list_hardware()]
    if as_json:
        _print_json([{"id": s.id, "name": s.name} for s in specs])
        return
    table = Table("id", "name", "bf16 TFLOP/s", "fp8 TFLOP/s", "memory", "bandwidth", "$/h")
    for s in specs:
        fp8 = s.peak_flops("fp8")
        table.add_row(
            s.id,
            s.name,
            f"{s.peak_flops('bf16') / 1e12:,.0f}",
            f"{fp8 / 1e12:,.0f}" if fp8 else "-",
            f"{s.memory.capacity_bytes / GiB:.0f} GiB",
            f"{s.memory.bandwidth_bytes_per_s / 1e12:.2f} TB/s",
            f"{s.price.usd_per_hour:.2f}",
        )
    out.print(table)


@hardware_app.command("show")
def hardware_show(
    hw_id: Annotated[str, typer.Argument(metavar="ID")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one hardware spec."""
    spec = load_hardware(hw_id)
    data = {
        "id": spec.id,
        "peak_flops_per_s": dict(spec.compute.peak_flops_per_s),
        "memory_capacity_bytes": spec.memory.capacity_bytes,
        "memory_bandwidth_bytes_per_s": spec.memory.bandwidth_bytes_per_s,
        **spec.model_dump(exclude={"id"}),
    }
    if as_json:
        _print_json(data)
        return
    out.print(f"[bold]{spec.name}[/bold] ({spec.id})")
    for dtype, peak in spec.compute.peak_flops_per_s.items():
        out.print(f"  {dtype:>5}: {peak / 1e12:,.1f} TFLOP/s dense")
    out.print(
        f"  memory: {format_bytes(spec.memory.capacity_bytes)} at "
        f"{spec.memory.bandwidth_bytes_per_s / 1e12:.2f} TB/s; "
        f"L2 {format_bytes(spec.memory.l2_cache_bytes)}"
    )
    ic = spec.interconnect
    out.print(
        f"  interconnect: {ic.topology}, {ic.link_bw_bytes_per_s / 1e9:.0f} GB/s per direction, "
        f"{ic.gpus_per_node} GPUs per node"
    )
    out.print(
        f"  power: {spec.power.tdp_w:.0f} W TDP; price ~${spec.price.usd_per_hour:.2f}/GPU-hour "
        f"({spec.price.source}, {spec.price.date})"
    )


@models_app.command("list")
def models_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the built-in model ids."""
    specs = [load_model(m) for m in list_models()]
    if as_json:
        _print_json([{"id": s.id, "num_params": s.num_params} for s in specs])
        return
    table = Table("id", "params", "active", "layers", "hidden", "attention", "KV/token")
    for s in specs:
        table.add_row(
            s.id,
            f"{s.num_params / 1e9:.1f}B",
            f"{s.num_active_params / 1e9:.1f}B",
            str(s.num_layers),
            str(s.hidden_size),
            s.attention.kind,
            format_bytes(s.kv_bytes_per_token()),
        )
    out.print(table)


@models_app.command("show")
def models_show(
    model_id: Annotated[str, typer.Argument(metavar="ID")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one model (a catalogue id or a path to a Hugging Face config.json)."""
    spec = load_model(model_id)
    data = {
        "id": spec.id,
        "num_params": spec.num_params,
        "num_active_params": spec.num_active_params,
        "kv_bytes_per_token": spec.kv_bytes_per_token(),
        **spec.model_dump(exclude={"id"}),
    }
    if as_json:
        _print_json(data)
        return
    out.print(
        f"[bold]{spec.id}[/bold]: {spec.num_params / 1e9:.2f}B parameters "
        f"({spec.num_active_params / 1e9:.2f}B active), {spec.num_layers} layers, "
        f"hidden {spec.hidden_size}, {spec.attention.kind} attention, "
        f"KV {format_bytes(spec.kv_bytes_per_token())}/token at {spec.dtype}"
    )


@engines_app.command("list")
def engines_list() -> None:
    """List the serving-engine profiles."""
    for e in list_engines():
        spec = load_engine(e)
        out.print(f"{spec.id:10} {spec.name} {spec.version}")


@engines_app.command("show")
def engines_show(
    engine_id: Annotated[str, typer.Argument(metavar="ID")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one engine profile."""
    spec = load_engine(engine_id)
    if as_json:
        _print_json(spec.model_dump())
        return
    out.print(spec.model_dump())


# -- op ---------------------------------------------------------------------------------------
class GemmDtype(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"


class Phase(str, Enum):
    prefill = "prefill"
    decode = "decode"


HardwareOpt = Annotated[str, typer.Option("--hardware", help="hardware id or path to a YAML spec")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the contract's JSON object")]
ReportOpt = Annotated[
    bool, typer.Option("--report", help="also write DIR/report.html (llmsim report DIR)")
]
OpEngineOpt = Annotated[
    str | None,
    typer.Option("--engine", help="add the kernel-launch cost under this engine (default: none)"),
]
OpEagerOpt = Annotated[bool, typer.Option("--enforce-eager", help="with --engine: no CUDA graphs")]


def _print_op(cost: Any, as_json: bool) -> None:
    data = api.op_json(cost)
    if as_json:
        _print_json(data)
        return
    out.print(
        f"latency {format_seconds(data['latency_s'])} ({data['bound']}-bound): "
        f"{data['flops'] / 1e9:,.3f} GFLOP, {format_bytes(data['bytes'])}; "
        f"compute {format_seconds(data['compute_s'])}, memory {format_seconds(data['memory_s'])}, "
        f"network {format_seconds(data['network_s'])}, "
        f"fixed {format_seconds(data['fixed_latency_s'])}"
    )
    if "engine" in data:
        launches = data["kernel_launches"]
        how = (
            f"CUDA graph, replayed once per step for {format_seconds(data['graph_replay_s'])}"
            if data["cuda_graph"]
            else f"eager, {launches:g} kernel launch{'es' if launches != 1 else ''}"
        )
        out.print(
            f"under {data['engine']} ({how}): kernel {format_seconds(data['kernel_s'])} + "
            f"launch {format_seconds(data['launch_overhead_s'])} = "
            f"{format_seconds(data['latency_s'])}"
        )


@op_app.command("gemm")
def op_gemm(
    hardware: HardwareOpt,
    m: Annotated[int, typer.Option("--m")],
    n: Annotated[int, typer.Option("--n")],
    k: Annotated[int, typer.Option("--k")],
    dtype: Annotated[GemmDtype, typer.Option("--dtype")] = GemmDtype.bf16,
    engine: OpEngineOpt = None,
    enforce_eager: OpEagerOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """One GEMM: (m x k) times (k x n)."""
    cost = api.gemm_cost(
        hardware=hardware,
        m=m,
        n=n,
        k=k,
        dtype=dtype.value,
        engine=engine,
        enforce_eager=enforce_eager,
    )
    _print_op(cost, as_json)


@op_app.command("attention")
def op_attention(
    hardware: HardwareOpt,
    phase: Annotated[Phase, typer.Option("--phase")],
    batch_size: Annotated[int, typer.Option("--batch-size")],
    seq_len: Annotated[
        int, typer.Option("--seq-len", help="prompt length (prefill) or KV length (decode)")
    ],
    num_heads: Annotated[int, typer.Option("--num-heads")],
    num_kv_heads: Annotated[int, typer.Option("--num-kv-heads")],
    head_dim: Annotated[int, typer.Option("--head-dim")],
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype")] = "auto",
    engine: OpEngineOpt = None,
    enforce_eager: OpEagerOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """One attention layer call (flash-style prefill or paged decode)."""
    _print_op(
        api.attention_cost(
            hardware=hardware,
            phase=phase.value,
            batch_size=batch_size,
            seq_len=seq_len,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            kv_cache_dtype=kv_cache_dtype,
            engine=engine,
            enforce_eager=enforce_eager,
        ),
        as_json,
    )


@op_app.command("allreduce")
def op_allreduce(
    hardware: HardwareOpt,
    num_devices: Annotated[int, typer.Option("--num-devices")],
    size_bytes: Annotated[int, typer.Option("--size-bytes")],
    engine: OpEngineOpt = None,
    enforce_eager: OpEagerOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """One all-reduce among GPUs of a node."""
    cost = api.allreduce_cost(
        hardware=hardware,
        num_devices=num_devices,
        size_bytes=size_bytes,
        engine=engine,
        enforce_eager=enforce_eager,
    )
    _print_op(cost, as_json)


# -- bench ------------------------------------------------------------------------------------
# The flags every bench command shares, spelled as in `vllm bench`.
ModelOpt = Annotated[str, typer.Option("--model", help="model id or path to config.json")]
TpOpt = Annotated[int, typer.Option("--tensor-parallel-size", "-tp")]
PpOpt = Annotated[int, typer.Option("--pipeline-parallel-size", "-pp")]
DpOpt = Annotated[
    int,
    typer.Option(
        "--data-parallel-size",
        "-dp",
        help="replicas (with --enable-expert-parallel: DP-attention ranks of one replica)",
    ),
]
DtypeOpt = Annotated[str, typer.Option("--dtype")]
QuantOpt = Annotated[str | None, typer.Option("--quantization", "-q")]
KvDtypeOpt = Annotated[str, typer.Option("--kv-cache-dtype")]
EngineOpt = Annotated[str, typer.Option("--engine")]
EagerOpt = Annotated[bool, typer.Option("--enforce-eager")]
GmuOpt = Annotated[float | None, typer.Option("--gpu-memory-utilization")]
SeqsOpt = Annotated[int | None, typer.Option("--max-num-seqs")]
TokensOpt = Annotated[int | None, typer.Option("--max-num-batched-tokens")]
ChunkedOpt = Annotated[
    bool | None, typer.Option("--enable-chunked-prefill/--no-enable-chunked-prefill")
]
OutJsonOpt = Annotated[str | None, typer.Option("--output-json")]


class SchedulingPolicy(str, Enum):
    fcfs = "fcfs"
    priority = "priority"


class PreemptionMode(str, Enum):
    recompute = "recompute"
    swap = "swap"


PolicyOpt = Annotated[
    SchedulingPolicy | None,
    typer.Option("--scheduling-policy", help="queue order (priority: the workload's classes)"),
]
PreemptOpt = Annotated[
    PreemptionMode | None,
    typer.Option("--preemption-mode", help="on KV exhaustion: recompute, or swap to host"),
]
SwapOpt = Annotated[float, typer.Option("--swap-space", help="host swap space per GPU, GiB")]


class OffloadingBackend(str, Enum):
    native = "native"
    lmcache = "lmcache"


KvOffloadSizeOpt = Annotated[
    float | None,
    typer.Option(
        "--kv-offloading-size",
        help="GiB of host memory per replica for KV blocks evicted from the GPU (vLLM's flag; "
        "needs --enable-prefix-caching)",
    ),
]
KvOffloadBackendOpt = Annotated[
    OffloadingBackend | None,
    typer.Option(
        "--kv-offloading-backend",
        help="native: a hit loads between steps, the request waits (default); lmcache: before "
        "the step, the batch waits",
    ),
]
EpOpt = Annotated[
    bool,
    typer.Option(
        "--enable-expert-parallel",
        help="MoE experts over EP ranks; with -dp N: N DP-attention ranks, EP = tp x N",
    ),
]
MicroBatchOpt = Annotated[
    bool,
    typer.Option(
        "--pipeline-micro-batching/--no-pipeline-micro-batching",
        help="with -pp > 1: up to pp batches in flight (vLLM V1); default: one at a time",
    ),
]
PrefixCachingOpt = Annotated[
    bool,
    typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        help="reuse the KV blocks of shared prompt prefixes (vLLM's automatic prefix caching)",
    ),
]
CpuOffloadOpt = Annotated[
    float,
    typer.Option(
        "--cpu-offload-gb", help="GiB of weights per GPU kept in host memory, streamed each step"
    ),
]
OffloadConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--offload-config",
        help='JSON: {"resident_layers": N, "source": "host"|"nvme", "transfer": '
        '"prefetch"|"uva"|"sync", "host_memory_bytes": "128 GB", "expert_offload": '
        '{"cache_fraction": F, "hit_rate": H, "zipf_skew": S, "cpu_compute": true}}',
    ),
]
SpecOpt = Annotated[
    str | None,
    typer.Option(
        "--speculative-config",
        help='vLLM\'s JSON ({"method": "eagle", "num_speculative_tokens": 3, ...}) plus '
        "acceptance_rate or acceptance_rates",
    ),
]


def _offload_config(text: str | None) -> Any:
    """--offload-config as an OffloadSpec (None when not given); bad JSON is a SpecError."""
    from simulator.specs.offload import parse_offload

    return parse_offload(text, source="--offload-config") if text else None


def _write_json(path: str | None, data: Any) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, default=str)


@bench_app.command("latency")
def bench_latency_cmd(
    hardware: HardwareOpt,
    model: ModelOpt,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 8,
    input_len: Annotated[int, typer.Option("--input-len")] = 32,
    output_len: Annotated[int, typer.Option("--output-len")] = 128,
    tensor_parallel_size: TpOpt = 1,
    pipeline_parallel_size: PpOpt = 1,
    data_parallel_size: DpOpt = 1,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = None,
    kv_cache_dtype: KvDtypeOpt = "auto",
    engine: EngineOpt = "vllm",
    enforce_eager: EagerOpt = False,
    gpu_memory_utilization: GmuOpt = None,
    max_num_seqs: SeqsOpt = None,
    max_num_batched_tokens: TokensOpt = None,
    enable_chunked_prefill: ChunkedOpt = None,
    num_iters: Annotated[int, typer.Option("--num-iters")] = 30,
    speculative_config: SpecOpt = None,
    cpu_offload_gb: CpuOffloadOpt = 0.0,
    offload_config: OffloadConfigOpt = None,
    output_json: OutJsonOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Latency of one batch: prefill, then decode to the output length (analytic)."""
    if data_parallel_size != 1:
        raise SpecError(
            "bench latency runs one replica; drop --data-parallel-size", field="data_parallel_size"
        )
    result = api.estimate(
        model=model,
        hardware=hardware,
        batch_size=batch_size,
        input_len=input_len,
        output_len=output_len,
        engine=engine,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        dtype=dtype,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        enforce_eager=enforce_eager,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill,
        num_iters=num_iters,
        speculative_config=speculative_config,
        cpu_offload_gb=cpu_offload_gb,
        offload=_offload_config(offload_config),
    )
    data = result.as_json()
    _write_json(output_json, data)
    if as_json:
        _print_json(data)
        return
    _print_latency_summary(result)


def _print_latency_summary(result: Any) -> None:
    out.print(f"Avg latency: {result.latency_s:.6f} seconds")
    for p, v in result.as_json()["percentiles"].items():
        out.print(f"{p}% percentile latency: {v:.6f} seconds")
    out.print(
        f"TTFT (prefill of the batch): {format_seconds(result.ttft_s)}; "
        f"TPOT (decode time per output token): {format_seconds(result.tpot_s)}"
    )
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


# -- validate ---------------------------------------------------------------------------------
@app.command("validate")
def validate_cmd(
    suite: Annotated[
        list[str] | None,
        typer.Option(
            "--suite",
            help="ops, layers, iteration, iteration_prefill, iteration_decode, "
            "iteration_engine_fit, power or power_fit; repeat the flag for several (default: all)",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="compare each suite with its goal and CI ceiling "
            "(simulator/validate/targets.yaml); exit 1 when one is above its ceiling",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Error tables of predicted vs measured against the bundled measurements."""
    from simulator.validate import kind_stats, run_validation, worst_cases
    from simulator.validate.summary import STAT_KEYS

    summary, df = run_validation(suite)
    if check:
        _check_targets(summary, as_json=as_json)
        return
    if as_json:
        _print_json(summary)
        return

    def cells(stats: Any) -> list[str]:
        return [str(stats["n"]), *(f"{float(stats[k]):.1f}%" for k in STAT_KEYS)]

    stat_cols = ("n", "MAPE", "median", "p90", "worst")
    table = Table("suite", "device", *stat_cols, "fitted", title="Absolute % error")
    for name, entry in summary["suites"].items():
        table.add_row(name, "all", *cells(entry), "yes" if entry["fitted"] else "no")
        for device, stats in entry["by_device"].items():
            table.add_row("", device, *cells(stats), "")
    out.print(table)
    kinds = kind_stats(df)
    kinds = kinds[kinds.groupby("suite")["kind"].transform("nunique") > 1]
    if not kinds.empty:
        by_kind = Table("suite", "device", "kind", *stat_cols, title="By kind of case")
        for row in kinds.to_dict(orient="records"):
            by_kind.add_row(str(row["suite"]), str(row["device"]), str(row["kind"]), *cells(row))
        out.print(by_kind)
    for name in summary["suites"]:
        worst = Table("device", "case", "predicted", "measured", "error", title=f"{name}: worst 5")
        for r in worst_cases(df, name).itertuples():
            sign = "+" if r.predicted_s >= r.measured_s else "-"
            if name.startswith("power"):  # fractions of TDP, not times
                times = (f"{r.predicted_s:.2f} TDP", f"{r.measured_s:.2f} TDP")
            else:
                times = (format_seconds(r.predicted_s), format_seconds(r.measured_s))
            worst.add_row(str(r.device), str(r.case), *times, f"{sign}{r.ape_pct:.0f}%")
        out.print(worst)
    skipped = df.attrs.get("skipped", [])
    if skipped:
        out.print(f"Skipped {len(skipped)} configuration(s):")
        for line in skipped:
            out.print(f"  {line}", markup=False)


def _wide_console() -> Console:
    """stdout, at PLAN_WIDTH columns when it is not a terminal (CI logs, pipes)."""
    return out if sys.stdout.isatty() else Console(width=PLAN_WIDTH)


def _check_targets(summary: dict[str, Any], *, as_json: bool) -> None:
    from simulator.validate.targets import check_targets, load_targets, render_check

    result = check_targets(summary, load_targets())
    if as_json:
        _print_json({**summary, "check": result.as_json()})
    else:
        render_check(result, _wide_console())
    if not result.ok:
        raise typer.Exit(1)


# -- regress ----------------------------------------------------------------------------------
@app.command("regress")
def regress_cmd(
    golden: Annotated[
        str | None,
        typer.Argument(
            metavar="GOLDEN.yaml",
            help="golden file (default: ./regress.yaml, else the project's regress/golden.yaml)",
        ),
    ] = None,
    update: Annotated[
        bool, typer.Option("--update", help="rewrite the golden values with today's predictions")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Recompute golden predictions; exit 1 when one leaves its tolerance band."""
    from simulator import regress

    path = golden or regress.default_golden()
    report = regress.update(path) if update else regress.check(path)
    if as_json:
        _print_json(report.as_json())
    else:
        regress.render(report, _wide_console())
    if not report.ok and not update:
        raise typer.Exit(1)


@bench_app.command("throughput")
def bench_throughput_cmd(
    hardware: HardwareOpt,
    model: ModelOpt,
    input_len: Annotated[int, typer.Option("--input-len")] = 1024,
    output_len: Annotated[int, typer.Option("--output-len")] = 128,
    num_prompts: Annotated[int, typer.Option("--num-prompts")] = 1000,
    prefix_len: Annotated[
        int, typer.Option("--prefix-len", min=0, help="tokens every prompt shares, first")
    ] = 0,
    tensor_parallel_size: TpOpt = 1,
    pipeline_parallel_size: PpOpt = 1,
    data_parallel_size: DpOpt = 1,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = None,
    kv_cache_dtype: KvDtypeOpt = "auto",
    engine: EngineOpt = "vllm",
    enforce_eager: EagerOpt = False,
    gpu_memory_utilization: GmuOpt = None,
    max_num_seqs: SeqsOpt = None,
    max_num_batched_tokens: TokensOpt = None,
    enable_chunked_prefill: ChunkedOpt = None,
    scheduling_policy: PolicyOpt = None,
    preemption_mode: PreemptOpt = None,
    swap_space: SwapOpt = 4.0,
    enable_prefix_caching: PrefixCachingOpt = False,
    kv_offloading_size: KvOffloadSizeOpt = None,
    kv_offloading_backend: KvOffloadBackendOpt = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    speculative_config: SpecOpt = None,
    cpu_offload_gb: CpuOffloadOpt = 0.0,
    offload_config: OffloadConfigOpt = None,
    enable_expert_parallel: EpOpt = False,
    pipeline_micro_batching: MicroBatchOpt = False,
    output_json: OutJsonOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Offline throughput: every prompt submitted at t=0, served to completion (simulated)."""
    _, summary = runner.bench_throughput(
        input_len=input_len,
        output_len=output_len,
        num_prompts=num_prompts,
        prefix_len=prefix_len,
        model=model,
        hardware=hardware,
        engine=engine,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        data_parallel_size=data_parallel_size,
        dtype=dtype,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        enforce_eager=enforce_eager,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill,
        scheduling_policy=scheduling_policy.value if scheduling_policy else None,
        preemption_mode=preemption_mode.value if preemption_mode else None,
        swap_space=swap_space,
        enable_prefix_caching=enable_prefix_caching,
        kv_offloading_size=kv_offloading_size,
        kv_offloading_backend=kv_offloading_backend.value if kv_offloading_backend else None,
        seed=seed,
        speculative_config=speculative_config,
        cpu_offload_gb=cpu_offload_gb,
        offload_config=offload_config,
        enable_expert_parallel=enable_expert_parallel,
        pipeline_micro_batching=pipeline_micro_batching,
    )
    _write_json(output_json, summary)
    if as_json:
        _print_json(summary)
    else:
        sys.stdout.write(format_throughput_summary(summary) + "\n")


class DatasetName(str, Enum):
    random = "random"
    sharegpt = "sharegpt"
    azure_code = "azure-code"
    azure_conv = "azure-conv"
    trace = "trace"


@bench_app.command("serve")
def bench_serve_cmd(
    hardware: HardwareOpt,
    model: ModelOpt,
    dataset_name: Annotated[DatasetName, typer.Option("--dataset-name")] = DatasetName.random,
    dataset_path: Annotated[str | None, typer.Option("--dataset-path")] = None,
    random_input_len: Annotated[int, typer.Option("--random-input-len")] = 1024,
    random_output_len: Annotated[int, typer.Option("--random-output-len")] = 128,
    random_range_ratio: Annotated[float, typer.Option("--random-range-ratio")] = 0.0,
    random_prefix_len: Annotated[
        int, typer.Option("--random-prefix-len", min=0, help="tokens every prompt shares, first")
    ] = 0,
    num_prompts: Annotated[int, typer.Option("--num-prompts")] = 1000,
    request_rate: Annotated[float, typer.Option("--request-rate")] = float("inf"),
    burstiness: Annotated[float, typer.Option("--burstiness")] = 1.0,
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    goodput: Annotated[
        list[str] | None, typer.Option("--goodput", help="ttft:MS tpot:MS e2el:MS")
    ] = None,
    router: Annotated[str, typer.Option("--router")] = "round_robin",
    tensor_parallel_size: TpOpt = 1,
    pipeline_parallel_size: PpOpt = 1,
    data_parallel_size: DpOpt = 1,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = None,
    kv_cache_dtype: KvDtypeOpt = "auto",
    engine: EngineOpt = "vllm",
    enforce_eager: EagerOpt = False,
    gpu_memory_utilization: GmuOpt = None,
    max_num_seqs: SeqsOpt = None,
    max_num_batched_tokens: TokensOpt = None,
    enable_chunked_prefill: ChunkedOpt = None,
    scheduling_policy: PolicyOpt = None,
    preemption_mode: PreemptOpt = None,
    swap_space: SwapOpt = 4.0,
    enable_prefix_caching: PrefixCachingOpt = False,
    kv_offloading_size: KvOffloadSizeOpt = None,
    kv_offloading_backend: KvOffloadBackendOpt = None,
    speculative_config: SpecOpt = None,
    cpu_offload_gb: CpuOffloadOpt = 0.0,
    offload_config: OffloadConfigOpt = None,
    enable_expert_parallel: EpOpt = False,
    pipeline_micro_batching: MicroBatchOpt = False,
    output_json: OutJsonOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Online serving: requests arrive at --request-rate (simulated), vLLM's metrics out."""
    dataset: dict[str, Any] = {"name": dataset_name.value}
    if dataset_name is DatasetName.random:
        dataset |= {
            "input_len": random_input_len,
            "output_len": random_output_len,
            "range_ratio": random_range_ratio,
        }
    if dataset_name is DatasetName.trace:
        if not dataset_path:
            raise SpecError("--dataset-name trace needs --dataset-path", field="dataset_path")
        dataset["path"] = dataset_path
    if random_prefix_len and dataset_name is not DatasetName.random:
        raise SpecError("applies to --dataset-name random", field="random_prefix_len")
    workload = validate(
        WorkloadSpec,
        {
            "dataset": dataset,
            "num_prompts": num_prompts,
            "request_rate": request_rate,
            "burstiness": burstiness,
            "prefix": {"tokens": random_prefix_len} if random_prefix_len else None,
        },
        source="bench serve",
    )
    scenario = runner.bench_scenario(
        model=model,
        hardware=hardware,
        workload=workload,
        engine=engine,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        data_parallel_size=data_parallel_size,
        dtype=dtype,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        enforce_eager=enforce_eager,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill,
        scheduling_policy=scheduling_policy.value if scheduling_policy else None,
        preemption_mode=preemption_mode.value if preemption_mode else None,
        swap_space=swap_space,
        enable_prefix_caching=enable_prefix_caching,
        kv_offloading_size=kv_offloading_size,
        kv_offloading_backend=kv_offloading_backend.value if kv_offloading_backend else None,
        max_concurrency=max_concurrency,
        goodput=parse_goodput(goodput) if goodput else None,
        router=router,
        seed=seed,
        speculative_config=speculative_config,
        cpu_offload_gb=cpu_offload_gb,
        offload_config=offload_config,
        enable_expert_parallel=enable_expert_parallel,
        pipeline_micro_batching=pipeline_micro_batching,
    )
    result = runner.run(scenario)
    _write_json(output_json, result.summary)
    if as_json:
        _print_json(result.summary)
    else:
        sys.stdout.write(format_serve_summary(result.summary) + "\n")


# -- run ----------------------------------------------------------------------------------------
@app.command("run")
def run_cmd(
    scenario: Annotated[str | None, typer.Argument(metavar="SCENARIO.yaml")] = None,
    out: Annotated[
        str | None, typer.Option("--out", help="write summary.json, requests.csv, steps.csv")
    ] = None,
    as_json: JsonOpt = False,
    schema: Annotated[
        bool, typer.Option("--schema", help="print the scenario JSON schema")
    ] = False,
    report: ReportOpt = False,
) -> None:
    """A full what-if from a scenario file: replica groups, router, workload, SLOs."""
    if schema:
        _print_json(Scenario.model_json_schema())
        return
    if scenario is None:
        raise SpecError("missing SCENARIO.yaml", field="scenario")
    if report and not out:
        raise SpecError("--report needs --out DIR (it writes DIR/report.html)", field="report")
    result = runner.run(scenario)
    if out:
        runner.save_run(result, out)
    if out and report:
        sys.stderr.write(_report_line(out) + "\n")  # stdout may be --json
    if as_json:
        _print_json(result.as_json())
        return
    sys.stdout.write(format_serve_summary(result.summary) + "\n")
    out_console = Console()
    for spec, plan in zip(result.scenario.replicas, result.memory, strict=True):
        role = f"{spec.role} pool: " if spec.role != "both" else ""
        dp = spec.data_parallel_size
        ranks, unit = (f" dp={dp}", "attention rank") if dp > 1 else ("", "replica")
        out_console.print(
            f"{role}{spec.count} x {spec.hardware} tp={spec.tensor_parallel_size} "
            f"pp={spec.pipeline_parallel_size}{ranks} ({spec.engine}): KV "
            f"{plan.kv_capacity_tokens:,} tokens per {unit}"
        )
    out_console.print(
        f"KV cache peak {result.sim.kv_peak_fraction:.1%}; simulated "
        f"{len(result.sim.steps):,} steps in {result.sim.wall_s:.2f} s"
    )
    if result.scenario.disaggregated:
        for line in pool_lines(result.scenario, result.deployments, result.summary):
            out_console.print(line, highlight=False, soft_wrap=True)
    e = result.energy
    out_console.print(
        f"Energy {e['energy_per_output_token_j']:.3f} J/output token; "
        f"{e['avg_power_w_per_gpu']:.0f} W per GPU on average over {e['num_gpus']} GPU(s)"
    )
    out_console.print(
        f"Cost ${e['cost_usd']:.2f} for {e['gpu_hours']:.3f} GPU-hours: "
        f"${e['usd_per_million_output_tokens']:.2f}/M output tokens, "
        f"${e['usd_per_million_tokens']:.2f}/M tokens"
    )


# -- plan ---------------------------------------------------------------------------------------
@app.command("plan")
def plan_cmd(
    plan_file: Annotated[str | None, typer.Argument(metavar="PLAN.yaml")] = None,
    out: Annotated[
        str | None,
        typer.Option("--out", help="write plan.json, candidates.csv, pareto.csv, probes.csv"),
    ] = None,
    as_json: JsonOpt = False,
    schema: Annotated[bool, typer.Option("--schema", help="print the plan JSON schema")] = False,
) -> None:
    """The cheapest deployments that meet the SLOs: per layout, and the cheapest mixed fleet."""
    from simulator.plan import plan
    from simulator.planning.report import print_plan, save_plan
    from simulator.planning.spec import PlanSpec

    if schema:
        _print_json(PlanSpec.model_json_schema())
        return
    if plan_file is None:
        raise SpecError("missing PLAN.yaml", field="plan")
    err = Console(stderr=True)
    status = err.status("planning") if err.is_terminal else None
    if status:
        status.start()
    try:
        result = plan(plan_file, progress=status.update if status else None)
    finally:
        if status:
            status.stop()
    if out:
        save_plan(result, out)
    if as_json:
        _print_json(result.as_json())
        return
    print_plan(result, Console() if sys.stdout.isatty() else Console(width=PLAN_WIDTH))


PLAN_WIDTH = 140  # columns of the plan's tables when stdout is not a terminal


# -- sweep --------------------------------------------------------------------------------------
class Executor(str, Enum):
    local = "local"
    ray = "ray"


@app.command("sweep")
def sweep_cmd(
    sweep_file: Annotated[str, typer.Argument(metavar="SWEEP.yaml")],
    out: Annotated[str, typer.Option("--out", help="folder for results.csv and sweep.yaml")],
    executor: Annotated[
        Executor, typer.Option("--executor", help="local process pool, or Ray (llmsim[ray])")
    ] = Executor.local,
    workers: Annotated[
        int | None, typer.Option("--workers", help="processes (default: CPU count)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bar")] = False,
    report: ReportOpt = False,
) -> None:
    """Run a base scenario over a grid / zip / random sample of values; rerun to resume."""
    from simulator.sweep import execute_sweep

    done = execute_sweep(
        sweep_file, out, executor=executor.value, workers=workers, progress=not quiet
    )
    sys.stdout.write(f"sweep: {done.line()}\n")
    if report:
        sys.stdout.write(_report_line(out) + "\n")


# -- report -------------------------------------------------------------------------------------
@app.command("report")
def report_cmd(
    folder: Annotated[str, typer.Argument(metavar="DIR")],
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="the HTML file (default DIR/report.html)")
    ] = None,
) -> None:
    """One self-contained HTML report (plotly, works offline) of a run, sweep or plan folder."""
    sys.stdout.write(_report_line(folder, output) + "\n")


def _report_line(folder: str, output: str | None = None) -> str:
    from simulator.report import write_report

    path = write_report(folder, output)
    return f"report: {path} ({path.stat().st_size / 1e6:.1f} MB)"


# -- entry point ------------------------------------------------------------------------------
# Flags that take several values after one flag in vLLM (argparse nargs="+").
MULTI_VALUE_FLAGS = ("--goodput",)


def _spread_multi_values(argv: list[str]) -> list[str]:
    """`--goodput a b` -> `--goodput a --goodput b`, as vLLM's argparse accepts it."""
    out: list[str] = []
    flag = None
    for arg in argv:
        if arg in MULTI_VALUE_FLAGS:
            flag = arg
            continue
        if flag and not arg.startswith("-"):
            out += [flag, arg]
            continue
        flag = None
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; bad input exits 2 with one line on stderr."""
    args = _spread_multi_values(sys.argv[1:] if argv is None else list(argv))
    try:
        code = app(args=args, standalone_mode=False)
    except SpecError as exc:
        sys.stderr.write(f"llmsim: error: {exc.line()}\n")
        raise SystemExit(2) from None
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("llmsim: aborted\n")
        raise SystemExit(130) from None
    except Exception as exc:
        message = usage_error(exc)
        if message is None:  # not bad input: a bug, which keeps its traceback
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # help was printed: a bare command group
            raise SystemExit(0) from None
        sys.stderr.write(f"llmsim: error: {message}\n")
        raise SystemExit(2) from None
    raise SystemExit(code if isinstance(code, int) else 0)


def usage_error(exc: Exception) -> str | None:
    """The one-line message of a flag-parser usage error (bad flag, missing option, bad value:
    exit code 2 and a message), or None for any other exception."""
    format_message = getattr(exc, "format_message", None)
    if getattr(exc, "exit_code", None) != 2 or format_message is None:
        return None
    return " ".join(str(format_message()).split())
