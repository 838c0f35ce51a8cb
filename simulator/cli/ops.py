"""`llmsim op gemm|attention|elementwise|allreduce`: the cost of one operator on one device."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

import typer

from simulator.cli.common import HardwareOpt, JsonOpt, out, print_json
from simulator.units import format_bytes, format_seconds

op_app = typer.Typer(
    help="Cost of one operator on one device.", no_args_is_help=True, rich_markup_mode=None
)


class GemmDtype(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"
    fp4 = "fp4"


class ElementwiseKernel(str, Enum):
    norm = "norm"
    rotary = "rotary"
    act = "act"


class Phase(str, Enum):
    prefill = "prefill"
    decode = "decode"


OpEngineOpt = Annotated[
    str | None,
    typer.Option("--engine", help="add the kernel-launch cost under this engine (default: none)"),
]
OpEagerOpt = Annotated[bool, typer.Option("--enforce-eager", help="with --engine: no CUDA graphs")]


def _print_op(cost: Any, as_json: bool) -> None:
    from simulator.costmodel import single_ops

    data = single_ops.op_json(cost)
    if as_json:
        print_json(data)
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
    block_scaled: Annotated[
        bool,
        typer.Option(
            "--block-scaled",
            help="fp8 weights scaled per 128 x 128 block (DeepSeek-V3's checkpoints)",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """One GEMM: (m x k) times (k x n)."""
    from simulator.costmodel import single_ops

    cost = single_ops.gemm_cost(
        hardware=hardware,
        m=m,
        n=n,
        k=k,
        dtype=dtype.value,
        engine=engine,
        enforce_eager=enforce_eager,
        block_scaled=block_scaled,
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
    from simulator.costmodel import single_ops

    _print_op(
        single_ops.attention_cost(
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


@op_app.command("elementwise")
def op_elementwise(
    hardware: HardwareOpt,
    kernel: Annotated[
        ElementwiseKernel,
        typer.Option("--kernel", help="fused add + RMSNorm, rotary embedding or SiLU-and-mul"),
    ],
    tokens: Annotated[int, typer.Option("--tokens")],
    hidden_size: Annotated[int | None, typer.Option("--hidden-size", help="norm")] = None,
    num_heads: Annotated[int | None, typer.Option("--num-heads", help="rotary")] = None,
    num_kv_heads: Annotated[int | None, typer.Option("--num-kv-heads", help="rotary")] = None,
    head_dim: Annotated[int | None, typer.Option("--head-dim", help="rotary")] = None,
    intermediate_size: Annotated[
        int | None, typer.Option("--intermediate-size", help="act")
    ] = None,
    engine: OpEngineOpt = None,
    enforce_eager: OpEagerOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """One elementwise kernel of a layer (one thread block per token where the engine's is)."""
    from simulator.costmodel import single_ops

    _print_op(
        single_ops.elementwise_cost(
            hardware=hardware,
            kernel=kernel.value,
            tokens=tokens,
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate_size,
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
    """One all-reduce among GPUs of a node, or of whole nodes (hierarchical, over the NICs)."""
    from simulator.costmodel import single_ops

    cost = single_ops.allreduce_cost(
        hardware=hardware,
        num_devices=num_devices,
        size_bytes=size_bytes,
        engine=engine,
        enforce_eager=enforce_eager,
    )
    _print_op(cost, as_json)
