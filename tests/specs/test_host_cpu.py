"""The host CPU of a node: an engine's CPU costs, fitted on one CPU, scale to the node's by the
ratio of single-thread scores; GPU kernel times do not move. A scenario's `host_cpu` and
bench's `--host-cpu` name another CPU; an unknown id is bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clitools import one_line_error, run_cli

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import deployment
from simulator.costmodel.step import engine_step_time, step_cost
from simulator.errors import SpecError
from simulator.runs.runner import group_deployment
from simulator.specs import list_hardware, load_engine, load_hardware, load_model
from simulator.specs.host_cpu import (
    cpu_time_factor,
    engine_on_host,
    list_host_cpus,
    with_host_cpu,
)
from simulator.specs.loader import host_cpu, load_host_cpus
from simulator.specs.scenario import ReplicaGroupSpec
from simulator.validate.iteration import iteration_suite

FITTED = "epyc-7742"  # vllm-0.2's host: DGX-A100
SLOW, FAST = "epyc-7r32", "core-i9-12900k"


def decode_step(host: str | None) -> tuple[float, float]:
    """(GPU time, wall time) of one eager decode step of llama-2-70b at TP4, batch 8, on
    DGX-A100 under vllm-0.2 with the node's CPU `host` (None: the hardware's own)."""
    dep = deployment(
        model="llama-2-70b",
        hardware="a100_sxm_80gb",
        engine="vllm-0.2",
        tensor_parallel_size=4,
        dtype="float16",
        host_cpu=host,
    )
    batch = BatchShape.decode(batch_size=np.array([8.0]), context_len=np.array([1024.0]))
    step = step_cost(dep.model, dep.hardware, dep.layout, dep.precision, batch, engine=dep.engine)
    wall = engine_step_time(step, dep.engine, num_tokens=8.0, num_seqs=8.0, enforce_eager=True)
    return step.seconds, float(np.ravel(wall)[0])


def test_a_slower_cpu_lengthens_the_cpu_bound_step_and_leaves_the_gpu_alone() -> None:
    gpu_fit, wall_fit = decode_step(None)
    gpu_slow, wall_slow = decode_step(SLOW)
    gpu_fast, wall_fast = decode_step(FAST)
    assert gpu_slow == gpu_fit == gpu_fast
    assert wall_fit > gpu_fit  # eager launches of 80 layers outlast the GPU: CPU-bound
    assert wall_slow > wall_fit > wall_fast
    # all of a CPU-bound step is CPU work, so it scales by the score ratio exactly
    assert wall_slow / wall_fit == pytest.approx(cpu_time_factor(FITTED, SLOW))
    # on a much faster CPU the launches hide under the GPU: never below the GPU time
    assert wall_fast / wall_fit > cpu_time_factor(FITTED, FAST)
    assert wall_fast > gpu_fast


def test_the_factor_is_the_ratio_of_single_thread_scores() -> None:
    cpus = load_host_cpus()
    ratio = cpus[FITTED].single_thread / cpus["xeon-8480"].single_thread
    assert cpu_time_factor(FITTED, "xeon-8480") == pytest.approx(ratio)
    assert cpu_time_factor(FITTED, FITTED) == 1.0


def test_every_cpu_cost_scales_and_nothing_else() -> None:
    engine = load_engine("vllm-0.2")
    moved = engine_on_host(engine, with_host_cpu(load_hardware("a100_sxm_80gb"), SLOW))
    factor = cpu_time_factor(FITTED, SLOW)
    for name in ("step_s", "per_seq_s", "launch_eager_s", "graph_launch_s"):
        assert getattr(moved.overhead, name) == pytest.approx(
            getattr(engine.overhead, name) * factor
        ), name
    assert moved.host_cpu == SLOW
    rest = set(type(engine).model_fields) - {"overhead", "host_cpu"}
    assert all(getattr(moved, f) == getattr(engine, f) for f in rest)


def test_on_its_own_host_or_twice_the_engine_is_unchanged() -> None:
    engine = load_engine("vllm-0.2")
    assert engine_on_host(engine, load_hardware("a100_sxm_80gb")) is engine
    h100 = load_hardware("h100_sxm")
    once = engine_on_host(engine, h100)
    assert once.overhead.step_s < engine.overhead.step_s  # the 8480C is the faster CPU
    assert engine_on_host(once, h100) is once  # a resolved engine passed on is not rescaled


def test_a_profile_without_a_fitted_host_is_the_same_everywhere() -> None:
    engine = load_engine("vllm")
    assert engine.host_cpu is None
    assert engine_on_host(engine, with_host_cpu(load_hardware("h100_sxm"), SLOW)) is engine


def test_the_bundled_nodes_name_known_cpus() -> None:
    known = set(list_host_cpus())
    named = {h: load_hardware(h).host.cpu for h in list_hardware()}
    assert {"a100_sxm_80gb": "epyc-7742", "h100_sxm": "xeon-8480"}.items() <= named.items()
    assert {cpu for cpu in named.values() if cpu is not None} <= known


def test_every_cpu_has_a_source() -> None:
    for cpu_id, cpu in load_host_cpus().items():
        assert cpu.source.strip() and cpu.single_thread > 0, cpu_id


def test_a_scenario_overrides_the_node_cpu() -> None:
    group = ReplicaGroupSpec(hardware="h100_sxm", engine="vllm-0.2", host_cpu=FITTED)
    dep = group_deployment(load_model("llama-2-7b"), group)
    assert dep.hardware.host.cpu == FITTED
    assert dep.engine.overhead == load_engine("vllm-0.2").overhead  # back on the fit's CPU
    plain = group_deployment(load_model("llama-2-7b"), without_override(group))
    assert plain.engine.overhead.step_s < dep.engine.overhead.step_s


def without_override(group: ReplicaGroupSpec) -> ReplicaGroupSpec:
    """`group` without its host CPU override."""
    return group.model_copy(update={"host_cpu": None})


def test_an_unknown_cpu_names_it_and_the_known_ones() -> None:
    with pytest.raises(SpecError) as err:
        with_host_cpu(load_hardware("h100_sxm"), "epyc-9999")
    assert err.value.field == "host_cpu"
    assert "'epyc-9999'" in err.value.reason
    assert all(cpu in err.value.reason for cpu in list_host_cpus())
    with pytest.raises(SpecError, match="did you mean 'epyc-7742'"):
        host_cpu("epyc-7724")


def test_bench_flag_unknown_cpu_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(
        capsys,
        *("bench", "latency", "--hardware", "h100_sxm", "--model", "llama-2-7b"),
        *("--host-cpu", "nope"),
    )
    assert "host_cpu" in err and "'nope'" in err and "epyc-7742" in err


def test_scenario_unknown_cpu_names_file_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: t\nmodel: llama-2-7b\nreplicas:\n  - {hardware: h100_sxm, host_cpu: nope}\n"
        "workload:\n  dataset: {name: random, input_len: 64, output_len: 8}\n"
        "  num_prompts: 2\n  request_rate: 1\n"
    )
    err = one_line_error(capsys, "run", str(path))
    assert str(path) in err and "replicas.0.host_cpu" in err and "'nope'" in err


def test_a_hardware_file_with_an_unknown_cpu_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("base: h100_sxm\nhost: {cpu: nope}\n")
    with pytest.raises(SpecError) as err:
        load_hardware(str(path))
    assert err.value.field == "host.cpu" and "'nope'" in err.value.reason


def test_bench_latency_flag_moves_tpot_only_through_cpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def tpot(*extra: str) -> float:
        code, out, err = run_cli(
            capsys,
            *("bench", "latency", "--hardware", "h100_sxm", "--model", "llama-2-70b", "-tp", "4"),
            *("--engine", "vllm-0.2", "--enforce-eager", "--batch-size", "8"),
            *("--input-len", "512", "--output-len", "32", "--json", *extra),
        )
        assert code == 0, err
        return float(json.loads(out)["tpot_s"])

    on_8480, on_7742 = tpot(), tpot("--host-cpu", FITTED)
    assert on_7742 / on_8480 == pytest.approx(1 / cpu_time_factor(FITTED, "xeon-8480"), rel=0.02)


def test_the_splitwise_h100_decode_check_improves() -> None:
    """Fitted on DGX-A100 (EPYC 7742), checked on DGX-H100 (Xeon 8480C): the held-out H100
    decode rows, llama-2-70b's launch-bound TP4/TP8 steps above all, come closer with the CPU
    costs on the H100 node's CPU. The A100 rows (the fit's host) do not move."""
    engine = load_engine("vllm-0.2")
    as_fitted = engine.model_copy(update={"host_cpu": None})  # the fit's costs everywhere
    before, after = iteration_suite(as_fitted), iteration_suite(engine)

    def ape(df: object, **where: object) -> np.ndarray:
        rows = df[np.logical_and.reduce([df[k].isin(v) for k, v in where.items()])]  # type: ignore[index]
        return np.abs(rows["predicted_s"] / rows["measured_s"] - 1).to_numpy()

    h100 = {"device": ["h100_sxm"], "kind": ["decode"]}
    assert ape(after, **h100).mean() < 0.5 * ape(before, **h100).mean()
    big = {**h100, "model_id": ["llama-2-70b"], "tensor_parallel": [4, 8]}
    assert np.median(ape(before, **big)) > 0.3  # ~45 ms predicted against 29-31 measured
    assert np.median(ape(after, **big)) < 0.15
    a100 = {"device": ["a100_sxm_80gb"]}
    np.testing.assert_allclose(ape(after, **a100), ape(before, **a100))
