"""llmsim: a performance simulator for LLM serving.

The flat public API: load specs by id, resolve a deployment, cost single operators, predict
`vllm bench latency`. Everything here is also a CLI command (`llmsim --help`).
"""

from simulator.api import (
    Deployment,
    allreduce_cost,
    attention_cost,
    deployment,
    estimate,
    gemm_cost,
)
from simulator.costmodel.batch import BatchShape
from simulator.costmodel.latency import LatencyResult
from simulator.costmodel.memory import MemoryPlan, plan_memory
from simulator.costmodel.step import StepCost, step_cost
from simulator.errors import SpecError
from simulator.specs import (
    EngineSpec,
    HardwareSpec,
    ModelSpec,
    list_engines,
    list_hardware,
    list_models,
    load_engine,
    load_hardware,
    load_model,
)
from simulator.specs.deployment import Parallelism, Precision, resolve_precision
from simulator.validate import run_validation

__version__ = "0.1.0"

__all__ = [
    "BatchShape",
    "Deployment",
    "EngineSpec",
    "HardwareSpec",
    "LatencyResult",
    "MemoryPlan",
    "ModelSpec",
    "Parallelism",
    "Precision",
    "SpecError",
    "StepCost",
    "allreduce_cost",
    "attention_cost",
    "deployment",
    "estimate",
    "gemm_cost",
    "list_engines",
    "list_hardware",
    "list_models",
    "load_engine",
    "load_hardware",
    "load_model",
    "plan_memory",
    "resolve_precision",
    "run_validation",
    "step_cost",
]
