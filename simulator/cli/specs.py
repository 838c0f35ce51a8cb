"""`llmsim hardware|models|engines list|show` and `llmsim hardware cpus`: the spec catalogues."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from simulator.cli.common import id_table, out, print_json
from simulator.errors import SpecError
from simulator.units import GiB, format_bytes

hardware_app = typer.Typer(help="Accelerator specs.", no_args_is_help=True, rich_markup_mode=None)
models_app = typer.Typer(help="Model catalogue.", no_args_is_help=True, rich_markup_mode=None)
engines_app = typer.Typer(
    help="Serving-engine profiles.", no_args_is_help=True, rich_markup_mode=None
)


@hardware_app.command("list")
def hardware_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the hardware ids."""
    from simulator.specs import list_hardware, load_hardware

    specs = [load_hardware(h) for h in list_hardware()]
    if as_json:
        print_json([{"id": s.id, "name": s.name} for s in specs])
        return
    rows = [
        (
            s.id or "",
            s.name,
            f"{s.peak_flops('bf16') / 1e12:,.0f}",
            f"{fp8 / 1e12:,.0f}" if (fp8 := s.peak_flops("fp8")) else "-",
            f"{s.memory.capacity_bytes / GiB:.0f} GiB",
            f"{s.memory.bandwidth_bytes_per_s / 1e12:.2f} TB/s",
            f"{s.price.usd_per_hour:.2f}",
        )
        for s in specs
    ]
    columns = ("name", "bf16 TFLOP/s", "fp8 TFLOP/s", "memory", "bandwidth", "$/h")
    out.print(id_table("id", rows, *columns))


@hardware_app.command("show")
def hardware_show(
    hw_id: Annotated[str, typer.Argument(metavar="ID")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one hardware spec."""
    from simulator.specs import hardware_provenance, load_hardware

    spec = load_hardware(hw_id)
    origin = hardware_provenance(hw_id)
    data = {
        "id": spec.id,
        "peak_flops_per_s": dict(spec.compute.peak_flops_per_s),
        "memory_capacity_bytes": spec.memory.capacity_bytes,
        "memory_bandwidth_bytes_per_s": spec.memory.bandwidth_bytes_per_s,
        "provenance": origin,
        **spec.model_dump(exclude={"id"}),
    }
    if as_json:
        print_json(data)
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
        f"  power: {spec.power.tdp_w:.0f} W TDP, {spec.power.idle_w:.0f} W idle, "
        f"{spec.power.between_steps_w:.0f} W parked between steps; "
        f"price ~${spec.price.usd_per_hour:.2f}/GPU-hour "
        f"({spec.price.source}, {spec.price.date})"
    )
    cpu = spec.host.cpu
    out.print(f"  host CPU: {cpu if cpu is not None else 'not named (engine CPU costs as fitted)'}")
    out.print(f"  efficiency: {_efficiency_origin(origin, list(spec.efficiency.gemm_libraries))}")


@hardware_app.command("cpus")
def hardware_cpus(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the host CPUs (--host-cpu, a scenario's host_cpu) and their single-thread scores."""
    from simulator.specs.loader import load_host_cpus

    cpus = load_host_cpus()
    if as_json:
        print_json({cpu_id: cpu.model_dump() for cpu_id, cpu in sorted(cpus.items())})
        return
    rows = [(cpu_id, cpu.name, f"{cpu.single_thread:,.0f}") for cpu_id, cpu in sorted(cpus.items())]
    out.print(id_table("id", rows, "name", "single thread"))
    out.print("single thread: PassMark's rating; sources in --json and docs/hardware_sources.md")


def _efficiency_origin(origin: dict[str, Any], libraries: list[str]) -> str:
    """One line on where a spec's efficiency factors come from."""
    refit = origin.get("calibrated_over") or []
    prior = " (the prior: the calibration fits its own)"
    parts = [
        f"fitted factors from {origin['calibration']}, the rest as the spec writes them"
        if origin["calibration"]
        else "as the spec writes them (datasheet and microbenchmark figures)"
    ]
    if origin["base"]:
        parts.append(f"over {origin['base']}'s")
    for key, part in (("attention_from", "attention"), ("collective_from", "collectives")):
        if origin[key]:
            parts.append(f"{part} from {origin[key]}{prior if key in refit else ''}")
    if libraries:
        parts.append(f"GEMM libraries {', '.join(libraries)}")
    return "; ".join(parts)


@models_app.command("list")
def models_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the built-in model ids."""
    from simulator.specs import list_models, load_model

    specs = [load_model(m) for m in list_models()]
    if as_json:
        print_json([{"id": s.id, "num_params": s.num_params} for s in specs])
        return
    rows = [
        (
            s.id or "",
            f"{s.num_params / 1e9:.1f}B",
            f"{s.num_active_params / 1e9:.1f}B",
            str(s.num_layers),
            str(s.hidden_size),
            s.attention.kind,
            format_bytes(s.kv_bytes_per_token()),
        )
        for s in specs
    ]
    columns = ("params", "active", "layers", "hidden", "attention", "KV/token")
    out.print(id_table("id", rows, *columns))


@models_app.command("show")
def models_show(
    model_id: Annotated[str, typer.Argument(metavar="ID")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one model (a catalogue id or a path to a Hugging Face config.json)."""
    from simulator.specs import load_model

    spec = load_model(model_id)
    data = {
        "id": spec.id,
        "num_params": spec.num_params,
        "num_active_params": spec.num_active_params,
        "kv_bytes_per_token": spec.kv_bytes_per_token(),
        **spec.model_dump(exclude={"id"}),
    }
    if as_json:
        print_json(data)
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
    from simulator.specs import list_engines, load_engine

    for e in list_engines():
        spec = load_engine(e)
        out.print(f"{spec.id:10} {spec.name} {spec.version}")


@engines_app.command("show")
def engines_show(
    engine_id: Annotated[str, typer.Argument(metavar="ID")],
    hardware: Annotated[
        str | None,
        typer.Option("--hardware", help="as it runs on this device (its batch defaults resolved)"),
    ] = None,
    offline: Annotated[
        bool,
        typer.Option("--offline", help="with --hardware: run offline (vLLM's LLM class)"),
    ] = False,
    tensor_parallel_size: Annotated[
        int, typer.Option("--tensor-parallel-size", "-tp", min=1, help="with --hardware")
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one engine profile."""
    from simulator.specs import load_engine, load_hardware

    spec = load_engine(engine_id)
    if hardware is not None:
        hw = load_hardware(hardware)
        spec = spec.on_device(
            hardware_id=hw.id,
            memory_bytes=hw.memory.capacity_bytes,
            entrypoint="offline" if offline else "server",
            tensor_parallel=tensor_parallel_size,
        )
    elif offline:
        raise SpecError("needs --hardware", field="offline")
    if as_json:
        print_json(spec.model_dump())
        return
    out.print(spec.model_dump())
