"""llmsim: a performance simulator for LLM serving.

The public API is `simulator.api`'s list, served lazily: `import simulator` is cheap, and the
first name used imports the facade (and with it numpy, pandas and the cost model). Everything
here is also a CLI command (`llmsim --help`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator import native

native.choose()  # the compiled engine, or its sources (native.py says when)

if TYPE_CHECKING:
    from simulator.api import *  # noqa: F403

__version__ = "0.1.0"

__all__ = [
    "AdapterMix",
    "BatchShape",
    "Deployment",
    "EngineArgs",
    "EngineOpCost",
    "EngineSpec",
    "HardwareBound",
    "HardwareSpec",
    "KVTransferSpec",
    "LatencyResult",
    "LoraSpec",
    "MemoryPlan",
    "ModelSpec",
    "Parallelism",
    "PlanResult",
    "PlanSpec",
    "Precision",
    "RequestTable",
    "RunResult",
    "Scenario",
    "SimResult",
    "SpecError",
    "SpeculativeSpec",
    "StepCost",
    "SweepSpec",
    "WorkloadSpec",
    "allreduce_cost",
    "attention_cost",
    "bench_scenario",
    "bench_throughput",
    "deployment",
    "elementwise_cost",
    "energy_summary",
    "estimate",
    "gemm_cost",
    "generate_requests",
    "hardware_bound",
    "list_engines",
    "list_hardware",
    "list_host_cpus",
    "list_models",
    "load_engine",
    "load_hardware",
    "load_model",
    "load_plan",
    "load_scenario",
    "load_sweep",
    "plan",
    "run",
    "run_validation",
    "save_run",
    "serve_disaggregated",
    "serve_summary",
    "simulate",
    "step_cost",
    "sweep",
    "throughput_summary",
    "with_host_cpu",
    "with_power_cap",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from simulator import api

        return getattr(api, name)
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
