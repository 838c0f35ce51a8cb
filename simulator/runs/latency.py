"""`bench latency`, analytically: one batch prefilled, then decoded to the output length.

Mirrors `vllm bench latency`: `batch_size` prompts of `input_len` tokens submitted together,
each generating `output_len` tokens. The prefill is split into steps of at most
`max_num_batched_tokens` tokens (whole prompts per step without chunked prefill); then
output_len - 1 decode steps follow with the context growing by one token each step.

Not modelled here (the serving simulator does it): decodes of prompts that finished early
interleaving with the remaining prefill chunks; the run-to-run noise vLLM's percentiles show
(every iteration of the simulation takes the same time).

With an offload spec (vLLM's --cpu-offload-gb, resident layers, MoE expert offload) weights that
do not fit on the GPU stream from host memory in every step (`costmodel.offload`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.bound import HardwareBound, hardware_bound
from simulator.costmodel.deployment import Deployment, deployment, fitting_layouts
from simulator.costmodel.memory import MemoryPlan, pick, positive, require_fit
from simulator.costmodel.offload import OffloadPlan
from simulator.costmodel.step import StepCost, engine_overhead_rows, engine_step_time, step_cost
from simulator.errors import SpecError
from simulator.metrics import bands
from simulator.serving.drafter import resolve_drafter
from simulator.serving.steptime import sampler_passes
from simulator.specs._base import MAX_TOKENS
from simulator.specs.engine import EngineSpec, LogitsPass
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import ModelSpec
from simulator.specs.offload import OffloadLike
from simulator.specs.serving import SpeculativeSpec, parse_speculative_config
from simulator.specs.workload import OFFLINE_BENCH_SAMPLING

if TYPE_CHECKING:
    from simulator.serving.drafter import Drafter

PERCENTILES = (10, 25, 50, 75, 90, 99)


@dataclass(frozen=True)
class LatencyResult:
    """Times in seconds. `prefill_steps` and `decode_steps` are the step-by-step times.
    `band_target`: the hardware and engine the error bands look up (`intervals`)."""

    ttft_s: float
    tpot_s: float
    latency_s: float
    prefill_steps: np.ndarray
    decode_steps: np.ndarray
    memory: MemoryPlan
    prefill_cost: StepCost
    decode_cost: StepCost
    num_iters: int = 30
    config: dict[str, object] = field(default_factory=dict)
    engine_rows: pd.DataFrame | None = None
    band_target: bands.Target | None = None
    bound: HardwareBound | None = None

    def bound_json(self) -> dict[str, object]:
        """The hardware-limit bound (`costmodel.bound`) for these lengths at the batch KV room
        allows, and the batch's share of it: its prompt and output tokens over the latency
        (keys as `runs.runner.bound_summary`); empty without a bound."""
        if self.bound is None:
            return {}
        tokens = float(self.config["batch_size"]) * (  # type: ignore[arg-type]
            float(self.config["input_len"]) + float(self.config["output_len"])  # type: ignore[arg-type]
        )
        return {
            "hardware_bound_tok_s": self.bound.tokens_per_s,
            "hardware_bound_output_tok_s": self.bound.output_tokens_per_s,
            "hardware_bound_resource": self.bound.resource,
            "bound_share": tokens / self.latency_s / self.bound.tokens_per_s,
        }

    def intervals(self, *, coverage: float = bands.DEFAULT_COVERAGE) -> dict[str, Any]:
        """The error bands of avg_latency, ttft_s and tpot_s (`avg_latency_interval`, ...,
        `interval_coverage`, `interval_source`), or `interval_note` where no validation data
        backs the hardware and engine (metrics.bands): offline regime, a static batch."""
        values = {"avg_latency": self.latency_s, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s}
        return bands.intervals(
            values,
            metrics=bands.LATENCY_METRICS,
            targets=[] if self.band_target is None else [self.band_target],
            regime="offline",
            coverage=coverage,
        )

    def breakdown(self) -> pd.DataFrame:
        """Per-op time of the first prefill step and of the middle decode step, then the
        engine's CPU lines of each (`engine_rows`). `share` is of the step's wall time;
        `hidden_s` is the launch time that overlaps GPU work (see `engine_overhead_rows`)."""
        mid = len(self.decode_steps) // 2
        parts = [self.prefill_cost.breakdown().assign(phase="prefill")]
        if len(self.decode_steps):
            parts.append(self.decode_cost.breakdown(index=mid).assign(phase="decode"))
        df = pd.concat(parts, ignore_index=True).assign(hidden_s=0.0)
        if self.engine_rows is not None:
            df = pd.concat([df, self.engine_rows], ignore_index=True)
        wall = {"prefill": float(self.prefill_steps[0])}
        if len(self.decode_steps):
            wall["decode"] = float(self.decode_steps[mid])
        df["share"] = (df["total_s"] - df["hidden_s"]) / df["phase"].map(wall)
        return df.assign(engine=self.config.get("engine", ""))

    def as_json(
        self, *, interval_coverage: float | None = bands.DEFAULT_COVERAGE
    ) -> dict[str, object]:
        """vLLM `bench latency --output-json` keys, plus ttft_s / tpot_s, the breakdown and
        the error bands at `interval_coverage` (`intervals`; None: without them)."""
        latencies = [self.latency_s] * self.num_iters
        data = {
            "avg_latency": self.latency_s,
            "latencies": latencies,
            "percentiles": {str(p): float(np.percentile(latencies, p)) for p in PERCENTILES},
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "config": self.config,
            "memory": self.memory.as_dict(),
            "breakdown": self.breakdown().to_dict(orient="records"),
            **self.bound_json(),
        }
        if interval_coverage is not None:
            data |= self.intervals(coverage=interval_coverage)
        return data


def prefill_schedule(
    *, batch_size: int, input_len: int, max_tokens: int, chunked: bool
) -> list[list[tuple[int, int, bool]]]:
    """The prefill steps as lists of (tokens, offset, last_chunk) per sequence."""
    if not chunked:
        if input_len > max_tokens:
            raise SpecError(
                f"input length {input_len} exceeds max_num_batched_tokens {max_tokens} "
                "without chunked prefill",
                field="max_num_batched_tokens",
            )
        per_step = max_tokens // input_len
        return [
            [(input_len, 0, True)] * min(per_step, batch_size - i)
            for i in range(0, batch_size, per_step)
        ]
    steps: list[list[tuple[int, int, bool]]] = []
    seq, done, step, budget = 0, 0, [], max_tokens
    while seq < batch_size:
        take = min(budget, input_len - done)
        step.append((take, done, done + take == input_len))
        done, budget = done + take, budget - take
        if done == input_len:
            seq, done = seq + 1, 0
        if budget == 0 or seq == batch_size:
            steps.append(step)
            step, budget = [], max_tokens
    return steps


# The largest batch `bench latency` takes (its waves are computed one by one) and the most
# iterations it averages: far beyond any measured (vLLM's defaults: 8 and 30).
MAX_BATCH = 10**6
MAX_ITERS = 10**6


def _check_lengths(
    model: ModelSpec,
    *,
    batch_size: int,
    input_len: int,
    output_len: int,
    num_iters: int,
    max_model_len: int | None,
) -> int:
    """The longest request served (`max_model_len`, default the model's context length), once
    the lengths are checked against it."""
    for name, value, most in (
        ("batch_size", batch_size, MAX_BATCH),
        ("input_len", input_len, MAX_TOKENS),
        ("output_len", output_len, MAX_TOKENS),
        ("num_iters", num_iters, MAX_ITERS),
    ):
        positive(value, field=name)
        if value > most:
            raise SpecError(f"must be at most {most:,}, got {value:,}", field=name)
    if max_model_len is not None:
        positive(max_model_len, field="max_model_len")
    served = model.served_length(max_model_len)
    if input_len + output_len > served:
        what = "max_model_len" if max_model_len else "the model's context length"
        raise SpecError(
            f"input_len + output_len = {input_len + output_len} exceeds {what} {served}",
            field="max_model_len" if max_model_len else "input_len",
        )
    return served


def _wave(
    dep: Deployment,
    *,
    batch_size: int,
    input_len: int,
    output_len: int,
    max_tokens: int,
    chunked: bool,
    enforce_eager: bool,
    offload: OffloadPlan | None = None,
    drafter: Drafter | None = None,
    sampler: Mapping[str, LogitsPass] | None = None,
) -> tuple[np.ndarray, np.ndarray, StepCost, StepCost, pd.DataFrame]:
    """Prefill and decode step times of one batch that runs to completion together, and the
    engine's breakdown lines of its first prefill and middle decode step."""
    window = dep.model.attention.batch_window
    schedule = prefill_schedule(
        batch_size=batch_size, input_len=input_len, max_tokens=max_tokens, chunked=chunked
    )
    shapes = [BatchShape.mixed(chunks=s, window=window) for s in schedule]
    stacked = BatchShape(
        **{f: np.array([getattr(b, f) for b in shapes]) for f in BatchShape.__slots__}
    )
    pre_cost = step_cost(
        dep.model,
        dep.hardware,
        dep.layout,
        dep.precision,
        stacked,
        engine=dep.engine,
        offload=offload,
        sampler=sampler,
    )
    prefill = engine_step_time(
        pre_cost,
        dep.engine,
        num_tokens=stacked.num_tokens,
        num_seqs=stacked.prefill_seqs,
        enforce_eager=enforce_eager,
    )
    pre_rows = engine_overhead_rows(
        pre_cost,
        dep.engine,
        index=0,
        num_tokens=float(sum(t for t, _, _ in schedule[0])),
        num_seqs=float(len(schedule[0])),
        enforce_eager=enforce_eager,
    ).assign(phase="prefill")
    if drafter is not None:  # speculative decoding: fewer decode steps, each verifying k + 1
        decode, dec_cost, dec_rows = drafter.decode_steps(
            batch_size=batch_size,
            input_len=input_len,
            output_len=output_len,
            enforce_eager=enforce_eager,
            sampler=sampler,
        )
        rows = pd.concat([pre_rows, dec_rows.assign(phase="decode")], ignore_index=True)
        return prefill, decode, pre_cost, dec_cost, rows
    context = dep.precision.kv_kept(input_len + np.arange(1, output_len, dtype=float), input_len)
    dec = BatchShape.decode(
        batch_size=np.full(context.shape, float(batch_size)), context_len=context, window=window
    )
    dec_cost = step_cost(
        dep.model,
        dep.hardware,
        dep.layout,
        dep.precision,
        dec,
        engine=dep.engine,
        offload=offload,
        sampler=sampler,
    )
    decode = engine_step_time(
        dec_cost,
        dep.engine,
        num_tokens=float(batch_size),
        num_seqs=float(batch_size),
        enforce_eager=enforce_eager,
    )
    lines = [pre_rows]
    if output_len > 1:
        lines.append(
            engine_overhead_rows(
                dec_cost,
                dep.engine,
                index=(output_len - 1) // 2,
                num_tokens=float(batch_size),
                num_seqs=float(batch_size),
                enforce_eager=enforce_eager,
            ).assign(phase="decode")
        )
    rows = pd.concat(lines, ignore_index=True)
    return prefill, np.broadcast_to(decode, context.shape), pre_cost, dec_cost, rows


def bench_latency(
    dep: Deployment,
    *,
    batch_size: int,
    input_len: int,
    output_len: int,
    enforce_eager: bool = False,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    chunked_prefill: bool | None = None,
    gpu_memory_utilization: float | None = None,
    num_iters: int = 30,
    max_model_len: int | None = None,
    drafter: Drafter | None = None,
    sampler: Mapping[str, LogitsPass] | None = None,
) -> LatencyResult:
    """Predict `vllm bench latency` for one replica. Raises SpecError if it cannot run (a
    model that does not fit names the `--cpu-offload-gb` that would make it fit).

    A batch larger than `max_num_seqs` runs in waves of at most `max_num_seqs` sequences, one
    after another; TTFT is the first wave's prefill. `offload` keeps weights off the GPU.
    `drafter`: speculative decoding (serving.drafter); TPOT is then the decode time per output
    token after the first (the mean decode step without speculation). `sampler`: the engine's
    passes over the logits of each sampled sequence (each verified position with a drafter),
    by name. `max_model_len`: vLLM's --max-model-len (default the model's context length),
    which sets the step budget without chunked prefill."""
    max_model_len = _check_lengths(
        dep.model,
        batch_size=batch_size,
        input_len=input_len,
        output_len=output_len,
        num_iters=num_iters,
        max_model_len=max_model_len,
    )
    for name, knob in (
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_num_seqs", max_num_seqs),
    ):
        if knob is not None:
            positive(knob, field=name)
    dep.layout.check(dep.model, dep.hardware)
    sched = dep.engine.scheduler
    chunked = (
        dep.engine.chunked_by_default(max_model_len, dep.model)
        if chunked_prefill is None
        else chunked_prefill
    )
    max_tokens = pick(
        max_num_batched_tokens,
        dep.engine.step_tokens(chunked=chunked, max_model_len=max_model_len),
    )
    max_seqs = pick(max_num_seqs, sched.max_num_seqs)
    plan = dep.memory(
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_batched_tokens=max_tokens,
        max_num_seqs=max_seqs,
    )
    if drafter is not None:
        if plan.offload is not None:
            raise SpecError(
                "speculative decoding with weight offloading is not modelled",
                field="speculative_config",
            )
        plan = drafter.memory(plan)
    if not plan.fits:
        fits = fitting_layouts(
            dep,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_batched_tokens=max_tokens,
            max_num_seqs=max_seqs,
        )
        require_fit(plan, what=dep.label, alternatives=fits)
    wave = min(batch_size, max_seqs)
    lookahead = drafter.spec.num_speculative_tokens if drafter is not None else 0
    # every sequence's KV at the end, one held at its most (a prompt is whole until its first
    # decode, when a KV token budget evicts; the others' prompts are in by then)
    end = most = longest = input_len + output_len + lookahead
    if plan.hold is not None:
        tokens, prompt = np.asarray(longest), np.asarray(input_len)
        end = int(plan.hold.tokens_of(tokens, prompt))
        most = int(plan.hold.most_tokens(tokens, prompt))
    size = plan.block_size
    needed = (wave - 1) * -(-end // size) + -(-most // size)
    if needed > plan.kv_capacity_blocks:
        what = f"batch of {wave}"
        if wave < batch_size:
            what = f"wave of {wave} (max_num_seqs; the batch of {batch_size} runs in waves)"
        raise SpecError(
            f"{what} x {input_len + output_len} tokens needs {needed} KV blocks, "
            f"only {plan.kv_capacity_blocks} fit (largest batch: "
            f"{plan.max_batch(seq_len=input_len + output_len)})",
            field="batch_size",
        )
    sizes = [wave] * (batch_size // wave) + ([batch_size % wave] if batch_size % wave else [])
    runs = {
        size: _wave(
            dep,
            batch_size=size,
            input_len=input_len,
            output_len=output_len,
            max_tokens=max_tokens,
            chunked=chunked,
            enforce_eager=enforce_eager,
            offload=plan.offload,
            drafter=drafter,
            sampler=sampler,
        )
        for size in set(sizes)
    }
    prefill, decode, pre_cost, dec_cost, engine_rows = runs[sizes[0]]
    total = sum(float(runs[s][0].sum() + runs[s][1].sum()) for s in sizes)
    all_decode = np.concatenate([runs[s][1] for s in sizes])
    return LatencyResult(
        ttft_s=float(prefill.sum()),
        tpot_s=float(all_decode.sum()) / (len(sizes) * (output_len - 1)) if output_len > 1 else 0.0,
        latency_s=total,
        prefill_steps=prefill,
        decode_steps=np.asarray(decode),
        memory=plan,
        prefill_cost=pre_cost,
        decode_cost=dec_cost,
        num_iters=num_iters,
        engine_rows=engine_rows,
        band_target=bands.deployment_target(dep),
        bound=hardware_bound(
            dep,
            prompt_len=input_len,
            output_len=output_len,
            weight_bytes=plan.weights_bytes + plan.offloaded_bytes,
            kv_capacity_tokens=plan.kv_capacity_tokens,
        ),
        config={
            "model": dep.model.id,
            "hardware": dep.hardware.id,
            "engine": dep.engine.id,
            "tp": dep.layout.tp,
            "pp": dep.layout.pp,
            "cp": dep.layout.cp,
            "precision": dep.precision.model_dump(),
            "batch_size": batch_size,
            "input_len": input_len,
            "output_len": output_len,
            "enforce_eager": enforce_eager,
            "waves": len(sizes),
            "offload": dep.offload.model_dump()
            if dep.offload is not None and dep.offload.active
            else None,
            **(drafter.config() if drafter is not None else {}),
        },
    )


def estimate(
    *,
    model: str | ModelSpec,
    hardware: str | HardwareSpec,
    batch_size: int = 1,
    input_len: int = 1024,
    output_len: int = 128,
    engine: str | EngineSpec = "vllm",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    context_parallel_size: int = 1,
    dtype: str = "auto",
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    kv_budget: int | None = None,
    kv_eviction: str = "snapkv",
    enforce_eager: bool = False,
    async_scheduling: bool = False,
    host_cpu: str | None = None,
    overlap_tp_comm: bool = False,
    nano_batches: int | None = None,
    gpu_memory_utilization: float | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    enable_chunked_prefill: bool | None = None,
    num_iters: int = 30,
    max_model_len: int | None = None,
    speculative_config: SpeculativeSpec | Mapping[str, Any] | str | None = None,
    cpu_offload_gb: float = 0.0,
    offload: OffloadLike = None,
    shadowkv: Mapping[str, Any] | None = None,
    swiftkv: Mapping[str, Any] | None = None,
) -> LatencyResult:
    """Predict `vllm bench latency` analytically: TTFT, TPOT, total latency, memory plan and a
    per-operator breakdown. `speculative_config`: vLLM's --speculative-config (JSON text, a
    mapping or a SpeculativeSpec) with the acceptance added (serving/speculative.py). A model
    too large for the GPU runs with weights streamed from host memory when `cpu_offload_gb`
    or `offload` allows it (see `deployment`). `async_scheduling`: vLLM's --async-scheduling.
    `host_cpu`: the node's CPU where it is not the hardware's (`deployment`).
    `overlap_tp_comm`: tensor-parallel all-reduces fused with their producer GEMMs.
    `nano_batches`: NanoFlow's nano-batched overlap (`deployment`; None: the profile's).
    `max_model_len`: vLLM's --max-model-len (default and upper bound: the model's context).
    The requests sample as vLLM's benchmark's do (temperature 1.0: OFFLINE_BENCH_SAMPLING), the
    engine's draw priced every step. `shadowkv`, `swiftkv`: those techniques' fields
    (`specs.deployment.ShadowKV`, `SwiftKV`; docs/long-context.md); `kv_budget`, `kv_eviction`:
    a KV token budget (`specs.deployment.KvEviction`): each decode attends to what it keeps."""
    speculative = parse_speculative_config(speculative_config)
    for name, on in (("shadowkv", shadowkv), ("swiftkv", swiftkv)):
        if on is not None and speculative is not None:
            raise SpecError("with speculative decoding is not modelled", field=name)
    dep = deployment(
        model=model,
        hardware=hardware,
        engine=engine,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        context_parallel_size=context_parallel_size,
        dtype=dtype,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        kv_budget=kv_budget,
        kv_eviction=kv_eviction,
        cpu_offload_gb=cpu_offload_gb,
        offload=offload,
        entrypoint="offline",  # vllm bench latency runs the LLM class
        async_scheduling=async_scheduling,
        host_cpu=host_cpu,
        overlap_tp_comm=overlap_tp_comm,
        nano_batches=nano_batches,
        shadowkv=shadowkv,
        swiftkv=swiftkv,
    )
    return bench_latency(
        dep,
        batch_size=batch_size,
        input_len=input_len,
        output_len=output_len,
        enforce_eager=enforce_eager,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        chunked_prefill=enable_chunked_prefill,
        gpu_memory_utilization=gpu_memory_utilization,
        num_iters=num_iters,
        max_model_len=max_model_len,
        drafter=None if speculative is None else resolve_drafter(speculative, dep),
        sampler=sampler_passes(dep.engine, OFFLINE_BENCH_SAMPLING),
    )
