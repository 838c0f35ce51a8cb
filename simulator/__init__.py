"""llmsim: a performance simulator for LLM serving.

The flat public API: load specs by id, resolve a deployment, cost single operators, predict
`vllm bench latency`, simulate serving (`run` a scenario, `simulate` a deployment on a
workload, `sweep` many variants of a scenario, also named `run_sweep`), validate against
measurements. Everything here is also a CLI command (`llmsim --help`).
"""

from simulator.api import (
    Deployment,
    EngineOpCost,
    allreduce_cost,
    attention_cost,
    deployment,
    elementwise_cost,
    estimate,
    gemm_cost,
)
from simulator.costmodel.batch import BatchShape
from simulator.costmodel.latency import LatencyResult
from simulator.costmodel.memory import MemoryPlan, plan_memory
from simulator.costmodel.step import StepCost, step_cost
from simulator.engine_args import EngineArgs
from simulator.errors import SpecError
from simulator.metrics.summary import serve_summary, throughput_summary
from simulator.plan import PlanResult
from simulator.plan import plan as run_plan
from simulator.planning.spec import PlanSpec, load_plan
from simulator.power import PowerModel, energy_summary, with_power_cap
from simulator.runner import RunResult, bench_scenario, bench_throughput, run, save_run
from simulator.scenario import Scenario, load_scenario
from simulator.serving.cluster import SimResult, simulate
from simulator.serving.disagg import serve_disaggregated
from simulator.serving.kv_transfer import KVTransferSpec
from simulator.serving.speculative import SpeculativeSpec
from simulator.serving.workload import RequestTable, WorkloadSpec, generate_requests
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
from simulator.sweeps import SweepSpec, load_sweep, run_sweep
from simulator.sweeps import run_sweep as sweep
from simulator.validate import run_validation

__version__ = "0.1.0"

__all__ = [
    "BatchShape",
    "Deployment",
    "EngineArgs",
    "EngineOpCost",
    "EngineSpec",
    "HardwareSpec",
    "KVTransferSpec",
    "LatencyResult",
    "MemoryPlan",
    "ModelSpec",
    "Parallelism",
    "PlanResult",
    "PlanSpec",
    "PowerModel",
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
    "list_engines",
    "list_hardware",
    "list_models",
    "load_engine",
    "load_hardware",
    "load_model",
    "load_plan",
    "load_scenario",
    "load_sweep",
    "plan_memory",
    "resolve_precision",
    "run",
    "run_plan",
    "run_sweep",
    "run_validation",
    "save_run",
    "serve_disaggregated",
    "serve_summary",
    "simulate",
    "step_cost",
    "sweep",
    "throughput_summary",
    "with_power_cap",
]
