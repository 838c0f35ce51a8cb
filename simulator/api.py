"""The facade: every public operation of llmsim, imported from where it lives. The same
operations as the CLI, taking ids or spec objects: load specs, resolve a `deployment`, cost
single operators, predict `vllm bench latency` (`estimate`), simulate serving (`run` a
scenario, `simulate` a deployment on a workload, `sweep` many variants of a scenario), plan the
cheapest fleet (`plan`), validate against measurements (`run_validation`).

`import simulator` gives the same names without importing this module until one is used.
"""

from __future__ import annotations

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.bound import HardwareBound, hardware_bound
from simulator.costmodel.deployment import Deployment, deployment
from simulator.costmodel.memory import MemoryPlan
from simulator.costmodel.single_ops import (
    EngineOpCost,
    allreduce_cost,
    attention_cost,
    elementwise_cost,
    gemm_cost,
)
from simulator.costmodel.step import StepCost, step_cost
from simulator.errors import SpecError
from simulator.metrics.summary import serve_summary, throughput_summary
from simulator.planning.plan import PlanResult, plan
from simulator.planning.spec import PlanSpec, load_plan
from simulator.runs.latency import LatencyResult, estimate
from simulator.runs.runner import (
    RunResult,
    bench_scenario,
    bench_throughput,
    energy_summary,
    run,
    save_run,
)
from simulator.runs.sweeps import load_sweep, sweep
from simulator.serving.cluster import SimResult, simulate
from simulator.serving.disagg import serve_disaggregated
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
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.engine_args import EngineArgs
from simulator.specs.hardware import with_power_cap
from simulator.specs.host_cpu import list_host_cpus, with_host_cpu
from simulator.specs.lora import AdapterMix, LoraSpec
from simulator.specs.scenario import Scenario, load_scenario
from simulator.specs.serving import KVTransferSpec, SpeculativeSpec
from simulator.specs.sweep import SweepSpec
from simulator.specs.workload import WorkloadSpec
from simulator.validate.summary import run_validation
from simulator.workload.requests import RequestTable, generate_requests

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
