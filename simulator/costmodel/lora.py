"""Multi-LoRA serving on the GPU: the adapter slots' memory and the batched LoRA kernels.

Memory (vLLM's way): `LoRAModelManager` preallocates, for every LoRA-wrapped linear layer,
`max_loras` slots of A (in x rank) and B (rank x out) at `max_lora_rank` in the model's dtype
when the engine starts, before the KV cache is sized, so the slots come out of KV room
(vllm/lora/layers: `create_lora_weights`; vllm/config/lora.py for the flags). Under tensor
parallelism vLLM shards half of the LoRA work by default (`fully_sharded_loras` off): a
column-parallel layer (q, k, v, gate, up) keeps A whole and shards B's output, a row-parallel
one (o, down) shards A's input and keeps B whole; the slot bytes per device follow.
S-LoRA (arXiv 2311.03285, section 4, "Unified Paging") instead pages adapter weights and KV
blocks in one pool, so idle slots cost nothing; llmsim models vLLM's preallocation.

Kernels: Punica (arXiv 2310.18547) runs the LoRA product of a batch that mixes adapters as
two kernels per layer and target module: shrink, x @ A (rank r), and expand, (x A) @ B, added
to the base layer's output (vLLM launches one of each for a packed qkv or gate_up layer);
BGMV for decode, SGMV for prefill segments (S-LoRA's MBGMV and MBGMM; vLLM's punica/triton
kernels, `lora_shrink` and `lora_expand`). Every distinct adapter in the batch has its A and
B read once per step; the tokens' activations are read, the shrink result written and read,
and the output read and written back. Both papers describe these kernels as memory-bound
(their cost grows with the distinct adapters whose weights a batch reads: Punica's
Distinct / Uniform / Skewed / Identical mixes) but neither gives a table of kernel times to
fit, so llmsim derives them from the roofline: each kernel is a grouped skinny GEMM priced
by `roofline.evaluate` with the device's own efficiency factors and launch latency,
`groups` = distinct adapters. A check on magnitude, not a fit: Punica's abstract reports
"only adding 2ms latency per token" for Llama-7B on A100; llmsim adds 1.2 to 1.4 ms to a
decode step of 1 to 32 sequences of Llama-2-7B on an A100-80GB with one adapter (rank 16,
all seven modules).

Not modelled: LoRA on MoE experts or on the LM head and embeddings (vLLM's extra vocabulary
is deprecated), the small TP collectives of the shrink output, adapters of smaller rank
than `max_lora_rank` (the kernels run at the slots' rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.costmodel.deployment import Deployment
from simulator.costmodel.op import Op
from simulator.costmodel.roofline import evaluate, total_time
from simulator.specs.lora import LoraSpec
from simulator.specs.model import DTYPE_BYTES, ModelSpec

# Row-parallel layers under tensor parallelism (the rest are column-parallel).
_ROW_PARALLEL = frozenset({"o_proj", "down_proj"})


def module_shapes(model: ModelSpec, modules: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """(module, in features, out features) of each target module of one decoder layer (the
    dense MLP's sizes; LoRA on MoE experts is not modelled)."""
    h = model.hidden_size
    attn = model.attention
    q = attn.num_heads * attn.head_dim
    kv = attn.num_kv_heads * attn.head_dim
    i = model.mlp.intermediate_size
    dims = {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    return [(m, *dims[m]) for m in modules]


def _device_shapes(dep: Deployment, spec: LoraSpec) -> list[tuple[str, float, float]]:
    """(module, in, out) as one tensor-parallel rank holds its A and B (vLLM's default)."""
    tp = dep.layout.tp
    out = []
    for name, n_in, n_out in module_shapes(dep.model, spec.target_modules):
        if name in _ROW_PARALLEL:
            out.append((name, n_in / tp, float(n_out)))
        else:
            out.append((name, float(n_in), n_out / tp))
    return out


def _layers(dep: Deployment) -> float:
    """Decoder layers on the busiest pipeline stage."""
    return float(-(-dep.model.num_layers // dep.layout.pp))


def adapter_bytes(dep: Deployment, spec: LoraSpec) -> float:
    """One adapter slot at `max_lora_rank` on one device: rank x (in + out) x dtype bytes,
    summed over the target modules of its layers."""
    width = DTYPE_BYTES[dep.precision.activations]
    per_layer = sum(n_in + n_out for _, n_in, n_out in _device_shapes(dep, spec))
    return spec.max_lora_rank * per_layer * width * _layers(dep)


def slot_bytes(dep: Deployment, spec: LoraSpec) -> float:
    """What vLLM preallocates on each device: `max_loras` adapter slots."""
    return spec.max_loras * adapter_bytes(dep, spec)


# vLLM's packed LoRA layers (vllm/lora/layers: MergedQKVParallelLinearWithLoRA,
# MergedColumnParallelLinearWithLoRA): one shrink and one expand launch covers every slice.
_PACKED = {
    "q_proj": "qkv",
    "k_proj": "qkv",
    "v_proj": "qkv",
    "gate_proj": "gate_up",
    "up_proj": "gate_up",
}


def lora_ops(dep: Deployment, spec: LoraSpec, *, tokens: int, adapters: int) -> list[Op]:
    """The shrink and expand kernels of one step whose `tokens` tokens use `adapters` distinct
    adapters: per layer and (packed) target module, x[tokens, in] @ A[in, r] and
    [tokens, r] @ B[r, out] as grouped GEMMs over the adapters, each adapter's weights read
    once; a packed layer's slices (q, k, v; gate, up) share one launch of each and one read
    of x."""
    if tokens <= 0 or adapters <= 0:
        return []
    r = float(spec.max_lora_rank)
    a = DTYPE_BYTES[dep.precision.activations]
    g = float(adapters)
    layers: dict[str, list[tuple[float, float]]] = {}
    for name, n_in, n_out in _device_shapes(dep, spec):
        layers.setdefault(_PACKED.get(name, name), []).append((n_in, n_out))
    ops = []
    for name, slices in layers.items():
        n_in = slices[0][0]  # the slices of a packed layer share its input
        ranks = r * len(slices)
        n_out = sum(out for _, out in slices)
        shrink = (2.0 * tokens * ranks * n_in, g * ranks * n_in * a + tokens * (n_in + ranks) * a)
        # each slice's B is r x its out: r x n_out in all, and so are the FLOPs per token
        expand = (2.0 * tokens * r * n_out, g * r * n_out * a + tokens * (ranks + 2 * n_out) * a)
        for kind, (k, n), (flops, nbytes) in (
            ("shrink", (n_in, ranks), shrink),
            ("expand", (r, n_out), expand),
        ):
            ops.append(
                Op(
                    f"lora_{kind}_{name}",
                    "gemm",
                    _layers(dep),
                    np.asarray([flops]),
                    np.asarray([nbytes]),
                    dtype=dep.precision.activations,
                    m=tokens / g,  # tokens per adapter, on average
                    n=n,
                    k=k,
                    groups=g,
                )
            )
    return ops


@dataclass
class LoraCost:
    """A deployment's LoRA step costs and adapter load times, memoised per (tokens, adapters).
    `host_link_bytes_per_s` and `disk_bytes_per_s` move one adapter's slot bytes from the CPU
    cache or from storage (NVMe) to the GPU."""

    dep: Deployment
    spec: LoraSpec
    _memo: dict[tuple[int, int], float] = field(default_factory=dict)

    @property
    def adapter_bytes(self) -> float:
        return adapter_bytes(self.dep, self.spec)

    @property
    def host_link_bytes_per_s(self) -> float:
        hw = self.dep.hardware
        return hw.host.pcie_bw_bytes_per_s * hw.efficiency.host_link_fraction

    @property
    def disk_bytes_per_s(self) -> float:
        return self.dep.hardware.host.nvme_bw_bytes_per_s

    def step_s(self, tokens: int, adapters: int) -> float:
        """Seconds the shrink and expand kernels add to a step."""
        key = (tokens, adapters)
        hit = self._memo.get(key)
        if hit is None:
            ops = lora_ops(self.dep, self.spec, tokens=tokens, adapters=adapters)
            engine = self.dep.engine
            hit = float(total_time(evaluate(ops, self.dep.hardware, engine))[0]) if ops else 0.0
            self._memo[key] = hit
        return hit

    def load_s(self, *, from_disk: bool) -> float:
        """One adapter into its GPU slot: over the host link from the CPU cache, after a read
        from storage into it when it was not cached."""
        size = self.adapter_bytes
        seconds = size / self.host_link_bytes_per_s
        if from_disk:
            seconds += size / self.disk_bytes_per_s
        return seconds
