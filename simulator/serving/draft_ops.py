"""The forward passes of the proposers that are not a whole model, as op lists
(`serving.steptime.OpList`): an EAGLE/MTP head (one decoder layer of the target's own
architecture plus its fc layer) and Medusa's heads. `serving.drafter` prices them; its
docstring says what each method costs and what is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.ops import Op, collective, elementwise, gemm, step_ops
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.model import DTYPE_BYTES, ModelSpec

# Width of the head's input fc layer, in hidden sizes: token embedding + target hidden state
# (EAGLE's fc, DeepSeek MTP's eh_proj), or three fused target layers (EAGLE-3).
FC_INPUTS = {"eagle": 2, "eagle3": 3, "mtp": 2}


@dataclass(frozen=True)
class HeadOps:
    """An EAGLE/MTP head's pass: the one-layer model's ops plus the fc fusing `fc_inputs`
    hidden-size vectors into one (a replicated Linear in vLLM, 16-bit)."""

    fc_inputs: int

    def __call__(
        self,
        model: ModelSpec,
        layout: Parallelism,
        prec: Precision,
        batch: BatchShape,
        *,
        gpus_per_node: int = 8,
    ) -> list[Op]:
        h = model.hidden_size
        fc = gemm(
            "draft_fc",
            m=batch.num_tokens,
            n=h,
            k=self.fc_inputs * h,
            count=1,
            prec=prec,
            weight_dtype=prec.activations,
        )
        return [fc, *step_ops(model, layout, prec, batch, gpus_per_node=gpus_per_node)]


@dataclass(frozen=True)
class MedusaOps:
    """`heads` Medusa heads on the sampled rows: a residual block (hidden x hidden, replicated)
    and a vocabulary-parallel LM head with its sampler each."""

    heads: int

    def __call__(
        self,
        model: ModelSpec,
        layout: Parallelism,
        prec: Precision,
        batch: BatchShape,
        *,
        gpus_per_node: int = 8,
    ) -> list[Op]:
        h, vocab, rows = model.hidden_size, model.vocab_size, batch.sampled
        a = DTYPE_BYTES[prec.activations]
        ops = [
            gemm(
                name,
                m=rows,
                n=n,
                k=h,
                count=self.heads,
                prec=prec,
                weight_dtype=prec.activations,
                scales_with="sampled",
            )
            for name, n in (("medusa_block", h), ("medusa_lm_head", vocab / layout.tp))
        ]
        ops.append(
            elementwise(
                "medusa_sampler", bytes_=rows * vocab * 8.0, count=self.heads, scales_with="sampled"
            )
        )
        if layout.tp > 1:
            ops.append(
                collective(
                    "medusa_logits_all_gather",
                    "all_gather",
                    msg_bytes=rows * vocab * a,
                    group=layout.tp,
                    count=self.heads,
                    scales_with="sampled",
                )
            )
        return ops


def head_model(target: ModelSpec, method: str) -> ModelSpec:
    """One decoder layer of the target's architecture (its MoE layer if it has any)."""
    data = target.model_dump()
    data |= {"id": f"{target.id}:{method}-head", "name": f"{target.name} {method} head"}
    data["num_layers"] = 1
    if data.get("moe") is not None:
        data["moe"] = {**data["moe"], "first_dense_layers": 0}
    return ModelSpec.model_validate(data)
