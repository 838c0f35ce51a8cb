"""The host CPU of a node, and what it does to an engine's CPU costs.

An engine's per-step CPU work (the scheduler, Python, eager kernel launches, graph replays)
is fitted on one host (`EngineSpec.host_cpu`, e.g. `vllm-0.2` on DGX-A100's EPYC 7742). On a
node with another CPU (`HostSpec.cpu`) that work takes the fitted time times the fitted
host's single-thread score over this host's (`cpu_time_factor`); GPU kernels are unchanged.
The CPUs and their scores are in `simulator/specs/host_cpus.yaml`.
"""

from __future__ import annotations

from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import HardwareSpec
from simulator.specs.loader import host_cpu, load_host_cpus


def list_host_cpus() -> list[str]:
    """Ids of the host CPUs, sorted."""
    return sorted(load_host_cpus())


def with_host_cpu(hw: HardwareSpec, cpu_id: str) -> HardwareSpec:
    """`hw` in a node with the CPU `cpu_id` (a scenario's `host_cpu`, bench's `--host-cpu`);
    an unknown id is a SpecError (field `host_cpu`) listing the known ones."""
    host_cpu(cpu_id)
    return hw.model_copy(update={"host": hw.host.model_copy(update={"cpu": cpu_id})})


def cpu_time_factor(fitted_on: str, host: str) -> float:
    """Time of CPU work on `host` over its time on `fitted_on`: the ratio of their
    single-thread scores (the work is one Python thread)."""
    return host_cpu(fitted_on).single_thread / host_cpu(host).single_thread


def engine_on_host(engine: EngineSpec, hw: HardwareSpec) -> EngineSpec:
    """`engine` with its CPU costs as they run on `hw`'s host CPU: scaled by
    `cpu_time_factor` where the profile names the CPU it was fitted on and the node names its
    own; unchanged where either is unknown, or both are the same CPU (so applying it twice
    changes nothing)."""
    fitted, host = engine.host_cpu, hw.host.cpu
    if fitted is None or host is None or fitted == host:
        return engine
    return engine.with_cpu_speed(cpu_time_factor(fitted, host), host)
