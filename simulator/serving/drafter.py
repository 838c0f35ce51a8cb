"""What proposing costs: a speculative config resolved against its target deployment.

The proposer (`method`) is priced with the cost model on the replica's own devices, after the
target's pass in the same engine step (vLLM runs the drafter inside the step), with no CPU
overhead of its own beyond its kernel launches (the engine's per-step work is counted once):

- `ngram`: prompt lookup on the CPU: no GPU time (its CPU time is not modelled either).
- `draft_model`: the draft model's own forward passes at its own tensor parallel size
  (`draft_tensor_parallel_size`: 1 or the target's, as vLLM allows), at the target's precision:
  a catch-up pass over the tokens the target just computed (its KV must follow), then k - 1
  one-token passes of the sequences that sampled. Its weights and KV cache take device memory.
- `eagle`, `eagle3`, `mtp` (`deepseek_mtp`): a head of one decoder layer of the target's own
  architecture (its MoE layer for a MoE target, as DeepSeek-V3's MTP module), plus the fc layer
  that fuses the token embedding with the target's hidden state (2 hidden sizes in; 3 for
  EAGLE-3's three fused layers; DeepSeek's eh_proj), sharing the target's embedding and LM head
  (vLLM's EagleProposer shares them); passes as for a draft model, at the target's TP. Its
  weights and one layer of KV per token take memory.
- `medusa`: k heads on the target's last hidden states, each a hidden x hidden residual block
  and its own vocabulary-parallel LM head: one pass of the sequences that sampled.

Not modelled: EAGLE-3's reduced draft vocabulary (the target's LM head is used), the drafter's
share of vLLM's profiling activations, the rejection sampler's own kernels, speculation with
pipeline parallelism (refused).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment
from simulator.costmodel.memory import (
    MemoryPlan,
    kv_bytes_per_token_per_device,
    layer_weight_bytes,
    weight_bytes_per_device,
)
from simulator.costmodel.ops import step_ops
from simulator.costmodel.roofline import evaluate, total_launches, total_time
from simulator.costmodel.step import (
    StepCost,
    engine_overhead_rows,
    engine_step_time,
    launch_time,
    step_cost,
)
from simulator.errors import SpecError
from simulator.serving.draft_ops import FC_INPUTS, HeadOps, MedusaOps, head_model
from simulator.serving.steptime import (
    Chunks,
    OpList,
    StepTimer,
    verify_floor,
    verify_pricing,
    verify_shape,
)
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.engine import EngineSpec, LogitsPass
from simulator.specs.hardware import HardwareSpec
from simulator.specs.loader import load_model
from simulator.specs.model import DTYPE_BYTES, ModelSpec
from simulator.specs.serving import FIELD, SpeculativeSpec
from simulator.specs.workload import SamplingSpec


# -- the proposers' passes in an engine step ------------------------------------------------------
@dataclass(frozen=True)
class DraftPasses:
    """A drafter's passes in one engine step, priced by its own step timer: a catch-up pass
    over the tokens the target computed (if `catch_up`), then one-token passes of the sequences
    that sampled, each a position further, to `passes` in all."""

    timer: StepTimer
    passes: int
    catch_up: bool

    def __call__(self, chunks: Chunks, decode_contexts: Sequence[int]) -> float:
        seconds = 0.0
        if self.catch_up:
            seconds = self.timer.kernel_s(chunks=chunks, decode_contexts=decode_contexts)
        ends = [off + n for n, off, last in chunks if last]
        sampling = len(decode_contexts) + len(ends)
        if not sampling:
            return seconds
        mean = (sum(decode_contexts) + sum(ends)) / sampling
        for j in range(self.passes - self.catch_up):
            seconds += self.timer.pass_s(num_seqs=sampling, mean_context=mean + 1 + j)
        return seconds


# -- a config resolved against its target deployment --------------------------------------------
@dataclass(frozen=True)
class Drafter:
    """A speculative config on a target deployment: the network that proposes (None for
    ngram; the target itself for Medusa, whose ops are the heads), its layout and op list,
    and the passes it runs per engine step."""

    spec: SpeculativeSpec
    target: ModelSpec
    hw: HardwareSpec
    layout: Parallelism
    prec: Precision
    engine: EngineSpec
    network: ModelSpec | None = None
    network_layout: Parallelism = dataclasses.field(default_factory=Parallelism)
    ops: OpList = step_ops
    passes: int = 0
    catch_up: bool = False

    @property
    def verify_tokens(self) -> int:
        return 1 + self.spec.num_speculative_tokens

    def config(self) -> dict[str, object]:
        """What a result's config records: the speculative config and its mean yield."""
        return {
            "speculative_config": self.spec.model_dump(exclude_none=True),
            "speculative_tokens_per_step": self.spec.expected_tokens,
        }

    # -- memory ---------------------------------------------------------------------------------
    def memory(self, plan: MemoryPlan) -> MemoryPlan:
        """`plan` with the proposer's weights and KV cache added on the busiest device."""
        weights, kv = 0.0, 0.0
        net, nl, prec = self.network, self.network_layout, self.prec
        a = DTYPE_BYTES[prec.activations]
        match self.spec.kind:
            case "draft_model":
                assert net is not None
                weights = weight_bytes_per_device(net, nl, prec)
                kv = kv_bytes_per_token_per_device(net, nl, prec)
            case "eagle" | "eagle3" | "mtp":
                assert net is not None
                h = net.hidden_size
                fc = FC_INPUTS[self.spec.kind] * h * h * a
                weights = float(layer_weight_bytes(net, nl, prec)[0]) + fc + h * a  # + norm
                kv = kv_bytes_per_token_per_device(net, nl, prec)
            case "medusa":
                h, vocab = self.target.hidden_size, self.target.vocab_size
                weights = (
                    self.spec.num_speculative_tokens * a * (h * h + h + vocab / self.layout.tp * h)
                )
            case "ngram":
                pass
        return dataclasses.replace(
            plan,
            weights_bytes=plan.weights_bytes + weights,
            kv_bytes_per_token=plan.kv_bytes_per_token + kv,
        )

    # -- the serving simulator's timer ----------------------------------------------------------
    def step_timer(
        self,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_context: int,
        enforce_eager: bool = False,
        sampling: SamplingSpec | None = None,
    ) -> StepTimer:
        """The target's step timer verifying k + 1 tokens per decode, plus the draft passes;
        the target's sampler passes over the logits of every verified position for requests
        sampling as `sampling` (the drafter's proposals are its greedy picks)."""
        sizes: dict[str, Any] = {
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_context": max_context,
            "enforce_eager": enforce_eager,
        }
        draft = None
        if self.network is not None:
            network = Deployment(self.network, self.hw, self.engine, self.network_layout, self.prec)
            timer = StepTimer(
                network,
                verify_tokens=self.verify_tokens if self.catch_up else 1,
                verify_logits=False,
                ops=self.ops,
                **sizes,
            )
            draft = DraftPasses(timer=timer, passes=self.passes, catch_up=self.catch_up)
        target = Deployment(self.target, self.hw, self.engine, self.layout, self.prec)
        return StepTimer(
            target, verify_tokens=self.verify_tokens, draft=draft, sampling=sampling, **sizes
        )

    # -- `bench latency`, analytically ----------------------------------------------------------
    def decode_steps(
        self,
        *,
        batch_size: int,
        input_len: int,
        output_len: int,
        enforce_eager: bool = False,
        sampler: Mapping[str, LogitsPass] | None = None,
    ) -> tuple[np.ndarray, StepCost, pd.DataFrame]:
        """A batch's decode steps under speculation, each yielding `expected_tokens` per
        sequence on average: ceil((output_len - 1) / expected) steps, the context growing by
        that much each. Returns their times (the target's verification step, with its
        `sampler` passes over every verified position's logits, plus the draft passes, from
        the cost model), the verification steps' cost and the decode phase's engine and draft
        breakdown lines (of the middle step)."""
        q, n = self.verify_tokens, float(batch_size)
        per_step = self.spec.expected_tokens
        steps = math.ceil((output_len - 1) / per_step - 1e-9) if output_len > 1 else 0
        ctx = self.prec.kv_kept(
            input_len + 1.0 + per_step * np.arange(steps, dtype=float), input_len
        )
        shape = verify_shape(model=self.target, num_seqs=n, context=ctx, tokens=q, logits=n * q)
        prec, scores = verify_pricing(self.target, self.layout, self.prec, shape)
        cost = step_cost(
            self.target,
            self.hw,
            self.layout,
            prec,
            shape,
            engine=self.engine,
            sampler=sampler,
        )
        target_s = engine_step_time(
            cost, self.engine, num_tokens=n * q, num_seqs=n, enforce_eager=enforce_eager
        )
        if scores:  # H2O's scoring of the verified queries
            target_s = target_s + total_time(evaluate(scores, self.hw, self.engine))
        window = self.target.attention.batch_window
        plain = step_cost(
            self.target,
            self.hw,
            self.layout,
            self.prec,
            BatchShape.decode(batch_size=n, context_len=ctx, window=window),
            engine=self.engine,
        )
        # the batch-scaling part (attention) no cheaper than the plain decode's (`verify_floor`)
        v_batch, d_batch = _batch_part(cost), _batch_part(plain)
        target_s = np.asarray(target_s, dtype=float) + verify_floor(v_batch, d_batch) - v_batch
        draft_s = self._draft_seconds(num_seqs=n, context=ctx, enforce_eager=enforce_eager)
        times = np.broadcast_to(target_s + draft_s, ctx.shape).astype(float)
        if not steps:
            return times, cost, pd.DataFrame()
        mid = (steps - 1) // 2
        rows = engine_overhead_rows(
            cost,
            self.engine,
            index=mid,
            num_tokens=n * q,
            num_seqs=n,
            enforce_eager=enforce_eager,
        )
        draft_row = {
            "op": f"draft_{self.spec.kind}",
            "kind": "draft",
            "count": float(self.passes),
            "time_s": float(draft_s[mid]) / max(self.passes, 1),
            "total_s": float(draft_s[mid]),
            "flops": 0.0,
            "bytes": 0.0,
            "bound": "draft",
            "hidden_s": 0.0,
        }
        return times, cost, pd.concat([rows, pd.DataFrame([draft_row])], ignore_index=True)

    def _draft_seconds(
        self, *, num_seqs: float, context: np.ndarray, enforce_eager: bool
    ) -> np.ndarray:
        """The draft passes of one step per element of `context`, from the cost model."""
        total = np.zeros(context.shape)
        if self.network is None:
            return total
        q = self.verify_tokens
        if self.catch_up:
            shape = verify_shape(
                model=self.network, num_seqs=num_seqs, context=context, tokens=q, logits=num_seqs
            )
            total = total + self._pass_s(shape, num_seqs * q, enforce_eager)
        for j in range(self.passes - self.catch_up):
            shape = verify_shape(
                model=self.network,
                num_seqs=num_seqs,
                context=context + 1 + j,
                tokens=1,
                logits=num_seqs,
            )
            total = total + self._pass_s(shape, num_seqs, enforce_eager)
        return total

    def _pass_s(self, batch: BatchShape, tokens: float, enforce_eager: bool) -> np.ndarray:
        """One draft pass: GPU time or kernel launches, the longer (`StepTimer.kernel_s`)."""
        assert self.network is not None
        ops = self.ops(
            self.network,
            self.network_layout,
            self.prec,
            batch,
            gpus_per_node=self.hw.interconnect.gpus_per_node,
        )
        costs = evaluate(ops, self.hw, self.engine)
        launch = launch_time(
            total_launches(costs), self.engine, num_tokens=tokens, enforce_eager=enforce_eager
        )
        return np.maximum(total_time(costs), launch)


def resolve_drafter(spec: SpeculativeSpec, dep: Deployment) -> Drafter:
    """`spec` on the target deployment; SpecError if it cannot run there."""
    if dep.layout.pp > 1:
        raise SpecError(
            "speculative decoding with pipeline parallelism is not modelled", field=FIELD
        )
    if dep.layout.cp > 1:  # verification would price k + 1 query tokens as a ring prefill
        raise SpecError(
            "speculative decoding with context parallelism is not modelled", field=FIELD
        )
    base = Drafter(
        spec=spec,
        target=dep.model,
        hw=dep.hardware,
        layout=dep.layout,
        prec=dep.precision,
        engine=dep.engine,
    )
    k, tp = spec.num_speculative_tokens, spec.draft_tensor_parallel_size
    match spec.kind:
        case "ngram":
            return base
        case "medusa":
            return dataclasses.replace(
                base, network=dep.model, network_layout=dep.layout, ops=MedusaOps(heads=k), passes=1
            )
        case "eagle" | "eagle3" | "mtp":
            if tp is not None and tp != dep.layout.tp:
                raise SpecError(
                    f"the {spec.method} head runs at the target's tensor parallel size "
                    f"{dep.layout.tp}, not {tp}",
                    field=f"{FIELD}.draft_tensor_parallel_size",
                )
            return dataclasses.replace(
                base,
                network=head_model(dep.model, spec.kind),
                network_layout=dep.layout,
                ops=HeadOps(fc_inputs=FC_INPUTS[spec.kind]),
                passes=k,
                catch_up=True,
            )
        case "draft_model":
            draft = _draft_model(spec, dep.model)
            return dataclasses.replace(
                base,
                network=draft,
                network_layout=_draft_layout(spec, draft=draft, hw=dep.hardware, layout=dep.layout),
                passes=k,
                catch_up=True,
            )


def _draft_model(spec: SpeculativeSpec, target: ModelSpec) -> ModelSpec:
    assert spec.model is not None
    try:
        draft = load_model(spec.model)
    except SpecError as exc:
        raise SpecError(exc.reason, source=exc.source, field=f"{FIELD}.model") from None
    if draft.vocab_size != target.vocab_size:
        raise SpecError(
            f"the draft's vocabulary ({draft.vocab_size}) differs from the target's "
            f"({target.vocab_size}): they must share a tokenizer",
            source=spec.model,
            field=f"{FIELD}.model",
        )
    return draft


def _draft_layout(
    spec: SpeculativeSpec, *, draft: ModelSpec, hw: HardwareSpec, layout: Parallelism
) -> Parallelism:
    tp = layout.tp if spec.draft_tensor_parallel_size is None else spec.draft_tensor_parallel_size
    if tp not in (1, layout.tp):
        raise SpecError(
            f"must be 1 or the target's tensor parallel size {layout.tp} (vLLM), got {tp}",
            field=f"{FIELD}.draft_tensor_parallel_size",
        )
    draft_layout = Parallelism(tp=tp)
    draft_layout.check(draft, hw, source=f"{FIELD}.model")
    return draft_layout


def _batch_part(cost: StepCost) -> np.ndarray:
    """GPU seconds of a step's ops that scale with the batch's sequences (attention), the part
    the serving tables keep apart (`StepTimer`)."""
    parts = [c.time_s * c.op.count for c in cost.costs if c.op.scales_with == "batch"]
    return np.asarray(sum(parts, np.zeros(1)), dtype=float)
