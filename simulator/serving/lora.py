"""Multi-LoRA adapters on one replica: the GPU slots and the CPU cache, as vLLM keeps them.

vLLM (vllm/lora/worker_manager.py, `LRUCacheWorkerLoRAManager`; vllm/config/lora.py) keeps at
most `max_loras` adapters in the GPU slots and `max_cpu_loras` in host memory, both LRU. When
a step needs an adapter that is not in a GPU slot, the least recently used adapter that the
step does not need is evicted and the new one copied in from host memory; one that is not in
the host cache either is first read from storage. The copies happen as the step starts
(`set_active_adapters`), so the step waits for them. The scheduler keeps each step within
`max_loras` distinct adapters (serving/scheduler.py), so a step's adapters always fit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from simulator.costmodel.lora import LoraCost


@dataclass
class AdapterCache:
    """One replica's adapters: LRU GPU slots and CPU cache, load counters (`row`)."""

    cost: LoraCost
    gpu: OrderedDict[int, None] = field(default_factory=OrderedDict)
    cpu: OrderedDict[int, None] = field(default_factory=OrderedDict)
    loads_from_cpu: int = 0
    loads_from_disk: int = 0
    load_s: float = 0.0
    steps: int = 0
    adapters_in_steps: int = 0
    most_in_step: int = 0

    @property
    def max_loras(self) -> int:
        return self.cost.spec.max_loras

    def activate(self, adapters: Iterable[int]) -> float:
        """Make `adapters` (at most max_loras distinct) resident for a step; returns the
        seconds of loading the step waits for and counts the loads."""
        need = set(adapters)
        need.discard(-1)
        assert len(need) <= self.max_loras, "the scheduler bounds a step's adapters"
        seconds = 0.0
        for a in sorted(need):
            if a in self.gpu:
                self.gpu.move_to_end(a)
                continue
            if len(self.gpu) >= self.max_loras:
                victim = next(v for v in self.gpu if v not in need)
                del self.gpu[victim]
            from_disk = a not in self.cpu
            if from_disk:
                self.loads_from_disk += 1
                if len(self.cpu) >= self.cost.spec.cpu_slots:
                    self.cpu.popitem(last=False)
                self.cpu[a] = None
            else:
                self.loads_from_cpu += 1
            self.cpu.move_to_end(a)
            self.gpu[a] = None
            seconds += self.cost.load_s(from_disk=from_disk)
        self.load_s += seconds
        return seconds

    def step_s(self, tokens: int, adapters: int) -> float:
        """The LoRA kernels' seconds for one step of `tokens` tokens over `adapters` distinct
        adapters."""
        return self.cost.step_s(tokens, adapters)

    def count(self, adapters: int, steps: int = 1) -> None:
        """`steps` steps ran with `adapters` distinct adapters each."""
        self.steps += steps
        self.adapters_in_steps += adapters * steps
        self.most_in_step = max(self.most_in_step, adapters)

    def row(self) -> dict[str, float]:
        loads = self.loads_from_cpu + self.loads_from_disk
        return {
            "adapter_loads": loads,
            "adapter_loads_from_cpu": self.loads_from_cpu,
            "adapter_loads_from_disk": self.loads_from_disk,
            "adapter_load_bytes": loads * self.cost.adapter_bytes,
            "adapter_load_s": self.load_s,
            "steps": self.steps,
            "adapters_in_steps": self.adapters_in_steps,
            "most_adapters_in_step": self.most_in_step,
        }


def lora_summary(caches: list[AdapterCache]) -> dict[str, float]:
    """The run summary's `lora` section: loads summed over replicas, the mean and most
    distinct adapters per step, the slot sizes."""
    rows = [c.row() for c in caches]
    if not rows:
        return {}
    total = {k: sum(r[k] for r in rows) for k in rows[0]}
    any_cache = caches[0]
    spec = any_cache.cost.spec
    return {
        "max_loras": spec.max_loras,
        "max_lora_rank": spec.max_lora_rank,
        "max_cpu_loras": spec.cpu_slots,
        "adapter_bytes_per_device": any_cache.cost.adapter_bytes,
        "adapter_loads": int(total["adapter_loads"]),
        "adapter_loads_from_cpu": int(total["adapter_loads_from_cpu"]),
        "adapter_loads_from_disk": int(total["adapter_loads_from_disk"]),
        "adapter_load_bytes": total["adapter_load_bytes"],
        "adapter_load_s": total["adapter_load_s"],
        "mean_adapters_per_step": total["adapters_in_steps"] / max(total["steps"], 1),
        "max_adapters_per_step": int(max(r["most_adapters_in_step"] for r in rows)),
    }
