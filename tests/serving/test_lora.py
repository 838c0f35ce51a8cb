"""Multi-LoRA serving: the adapter popularity, the slots' memory, the batched kernels' cost, the
scheduler's max_loras bound, adapter loads, the run summary and the CLI's flags.

The engine cases run on the fixed step-time model of test_engine.py (10 ms + 10 us per prefill
token for a step with chunks, 5 ms for a decode-only step); the LoRA kernels and loads come from
the cost model of Llama-3.1-8B on one H100 and are added to those steps.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from clitools import one_line_error, run_cli
from factories import MS, fixed_group, make_requests, make_scheduler

from simulator.costmodel.deployment import deployment
from simulator.costmodel.lora import LoraCost, adapter_bytes, lora_ops, slot_bytes
from simulator.errors import SpecError
from simulator.runs import runner
from simulator.serving.cluster import serve
from simulator.serving.group import replica_group
from simulator.serving.kv_cache import BlockManager
from simulator.serving.lora import AdapterCache
from simulator.serving.request import Request
from simulator.serving.scheduler import schedule
from simulator.specs.lora import AdapterMix, LoraSpec
from simulator.specs.scenario import Scenario, load_scenario
from simulator.specs.workload import WorkloadSpec
from simulator.workload.requests import draw_adapters, generate_requests

SCENARIOS = Path(__file__).parents[2] / "scenarios"
# Llama-3.1-8B: hidden 4096, 32 query and 8 KV heads of 128, MLP 14336, 32 layers, bf16.
LLAMA8B_LAYER_IN_PLUS_OUT = (
    (4096 + 4096)  # q
    + 2 * (4096 + 1024)  # k, v
    + (4096 + 4096)  # o
    + 2 * (4096 + 14336)  # gate, up
    + (14336 + 4096)  # down
)


@pytest.fixture(scope="module")
def dep():  # type: ignore[no-untyped-def]
    return deployment(model="llama-3.1-8b", hardware="h100_sxm")


# -- workload -------------------------------------------------------------------------------------
def test_uniform_and_zipf_popularity() -> None:
    rng = np.random.default_rng(0)
    uniform = draw_adapters(AdapterMix(num_adapters=100), 20_000, rng)
    zipf = draw_adapters(AdapterMix(num_adapters=100, distribution="zipf", alpha=1.0), 20_000, rng)
    assert uniform.min() == 0 and uniform.max() == 99
    assert 0.005 < np.mean(uniform == 0) < 0.015  # 1 %
    # Zipf(1) over 100: adapter 0 has 1 / H_100 = 19 % of the requests, adapter 1 half that
    share = np.bincount(zipf, minlength=100) / len(zipf)
    assert share[0] == pytest.approx(1 / np.sum(1 / np.arange(1, 101)), abs=0.01)
    assert share[1] == pytest.approx(share[0] / 2, abs=0.01)


def test_adapters_leave_the_other_draws_alone() -> None:
    data = {"dataset": {"name": "random", "range_ratio": 0.5}, "num_prompts": 50, "request_rate": 4}
    plain = generate_requests(WorkloadSpec.model_validate(data), rng=np.random.default_rng(1))
    mixed = generate_requests(
        WorkloadSpec.model_validate({**data, "adapters": {"num_adapters": 7}}),
        rng=np.random.default_rng(1),
    )
    assert (plain.adapter == -1).all()
    assert set(mixed.adapter.tolist()) <= set(range(7)) and len(set(mixed.adapter.tolist())) > 1
    for column in ("arrival_s", "prompt_len", "output_len"):
        np.testing.assert_array_equal(getattr(plain, column), getattr(mixed, column))


# -- memory ---------------------------------------------------------------------------------------
def test_slots_take_their_exact_bytes_out_of_the_kv_cache(dep) -> None:  # type: ignore[no-untyped-def]
    requests = make_requests((0.0, 100, 10))
    spec = LoraSpec(max_loras=4, max_lora_rank=32)
    _, plain = replica_group(dep, requests=requests)
    _, lora = replica_group(dep, requests=requests, lora=spec)
    expected = (
        4 * 32 * LLAMA8B_LAYER_IN_PLUS_OUT * 2 * 32
    )  # slots x rank x (in+out) x bf16 x layers
    assert slot_bytes(dep, spec) == expected
    assert plain.kv_cache_bytes - lora.kv_cache_bytes == pytest.approx(expected, rel=1e-12)
    assert lora.kv_capacity_blocks < plain.kv_capacity_blocks


def test_tensor_parallel_shards_half_of_each_adapter() -> None:
    spec = LoraSpec()
    one = adapter_bytes(deployment(model="llama-3.1-8b", hardware="h100_sxm"), spec)
    two = adapter_bytes(
        deployment(model="llama-3.1-8b", hardware="h100_sxm", tensor_parallel_size=2), spec
    )
    assert one / 2 < two < one  # A of column-parallel and B of row-parallel layers stay whole


# -- kernels --------------------------------------------------------------------------------------
def test_more_distinct_adapters_make_a_slower_step(dep) -> None:  # type: ignore[no-untyped-def]
    cost = LoraCost(dep, LoraSpec(max_loras=64))
    times = [cost.step_s(64, n) for n in (1, 4, 16, 64)]
    assert all(a < b for a, b in itertools.pairwise(times))
    assert cost.step_s(0, 0) == 0.0 and lora_ops(dep, cost.spec, tokens=0, adapters=0) == []
    # decode: the adapters' weights dominate; 64 adapters of 84 MB each at 3.35 TB/s is ~1.6 ms
    assert 1 * MS < times[-1] < 4 * MS


# -- scheduling and loads -------------------------------------------------------------------------
def _request(i: int, adapter: int) -> Request:
    return Request(id=i, arrival_s=0.0, prompt_len=16, output_len=4, adapter=adapter)


def test_the_scheduler_skips_requests_past_max_loras() -> None:
    waiting = deque(_request(i, a) for i, a in enumerate([0, 1, 2, 0, 3, 1]))
    running: list[Request] = []
    plan = schedule(
        make_scheduler(),
        running=running,
        waiting=waiting,
        kv=BlockManager(num_blocks=100, block_size=16),
        max_loras=2,
    )
    assert [r.adapter for r, _ in plan.entries] == [0, 1, 0, 1]
    assert [r.id for r in waiting] == [2, 4]  # skipped, back at the front in their order


def test_max_loras_bounds_the_adapters_of_every_step(dep) -> None:  # type: ignore[no-untyped-def]
    n = 24
    requests = make_requests(*[(0.0, 64, 8)] * n, adapter=[i % 6 for i in range(n)])
    group = fixed_group(lora=LoraCost(dep, LoraSpec(max_loras=2, max_cpu_loras=6)))
    result = serve(requests, groups=[group])
    assert result.lora is not None
    assert len(result.requests) == n
    assert result.lora["max_adapters_per_step"] == 2
    assert result.lora["adapter_loads_from_disk"] == 6  # each once into the CPU cache
    unbounded = serve(
        requests, groups=[fixed_group(lora=LoraCost(dep, LoraSpec(max_loras=8, max_cpu_loras=8)))]
    )
    assert unbounded.lora is not None and unbounded.lora["max_adapters_per_step"] == 6


def test_cold_adapters_pay_their_load(dep) -> None:  # type: ignore[no-untyped-def]
    cost = LoraCost(dep, LoraSpec(max_loras=1, max_cpu_loras=2))
    size = cost.adapter_bytes
    from_cpu = size / cost.host_link_bytes_per_s
    from_disk = from_cpu + size / cost.disk_bytes_per_s
    cache = AdapterCache(cost)
    assert cache.activate([0]) == pytest.approx(from_disk)
    assert cache.activate([0]) == 0.0  # resident
    assert cache.activate([1]) == pytest.approx(from_disk)  # evicts 0 from its GPU slot
    assert cache.activate([0]) == pytest.approx(from_cpu)  # still in the CPU cache
    assert cache.activate([2]) == pytest.approx(from_disk)  # the CPU cache drops 1, its LRU
    assert cache.activate([1]) == pytest.approx(from_disk)
    assert (cache.loads_from_cpu, cache.loads_from_disk) == (1, 4)

    # one request: its first step waits for the load, then prefills with the LoRA kernels
    group = fixed_group(lora=cost)
    done = serve(make_requests((0.0, 100, 1), adapter=[5]), groups=[group])
    ttft = float(done.requests["first_token_s"].iloc[0])
    assert ttft == pytest.approx(10 * MS + 100 * 0.01 * MS + from_disk + cost.step_s(100, 1))


def test_lora_off_changes_nothing(dep) -> None:  # type: ignore[no-untyped-def]
    """Requests naming no adapter on replicas with LoRA on run as without it (the slots'
    memory aside); a run without LoRA has no `lora` section."""
    requests = make_requests(*[(0.01 * i, 50 + i, 5 + i % 3) for i in range(12)])
    plain = serve(requests, groups=[fixed_group()])
    slots = serve(requests, groups=[fixed_group(lora=LoraCost(dep, LoraSpec(max_loras=2)))])
    assert plain.lora is None
    assert slots.lora is not None and slots.lora["adapter_loads"] == 0
    np.testing.assert_array_equal(
        plain.requests["finish_s"].to_numpy(), slots.requests["finish_s"].to_numpy()
    )


def test_requests_naming_adapters_need_lora(dep) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError, match="enable LoRA"):
        replica_group(dep, requests=make_requests((0.0, 10, 2), adapter=[0]))


# -- the scenario, the API and the CLI ------------------------------------------------------------
def test_scenario_runs_with_a_lora_section() -> None:
    result = runner.run(SCENARIOS / "multi_lora.yaml")
    lora = result.summary["lora"]
    assert (
        lora["max_adapters_per_step"]
        <= load_scenario(SCENARIOS / "multi_lora.yaml").replicas[0].lora.max_loras
    )  # type: ignore[union-attr]
    assert lora["adapter_loads"] >= 1 and lora["adapter_load_bytes"] > 0


def test_bench_throughput_reports_the_lora_section(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("bench", "throughput", "--model", "llama-3.1-8b", "--hardware", "h100_sxm")
    args += ("--num-prompts", "60", "--input-len", "128", "--output-len", "16", "--json")
    code, out, _ = run_cli(capsys, *args)
    assert code == 0 and "lora" not in json.loads(out)
    lora_args = ("--enable-lora", "--max-loras", "4", "--num-lora-adapters", "20")
    code, out, _ = run_cli(capsys, *args, *lora_args, "--lora-popularity", "zipf")
    summary = json.loads(out)
    assert code == 0 and summary["lora"]["max_adapters_per_step"] == 4
    code, out, _ = run_cli(capsys, *args[:-1], *lora_args)
    assert code == 0 and "LoRA adapter loads:" in out


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--max-loras", "4"), "max_loras: needs --enable-lora"),
        (("--enable-lora", "--max-lora-rank", "12"), "--max-lora-rank: must be one of"),
        (("--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"), "--max-cpu-loras: must"),
        (("--enable-lora", "--max-loras", "0"), "--max-loras:"),
        (("--num-lora-adapters", "5"), "do not enable LoRA"),
        (("--enable-lora", "--num-lora-adapters", "0"), "--num-lora-adapters"),
        (
            ("--enable-lora", "--num-lora-adapters", "3", "--lora-zipf-alpha", "-1"),
            "--lora-zipf-alpha:",
        ),
    ],
)
def test_bad_lora_flags_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], says: str
) -> None:
    args = ("bench", "serve", "--model", "llama-3.1-8b", "--hardware", "h100_sxm")
    err = one_line_error(capsys, *args, "--num-prompts", "10", *flags)
    assert says in err


def test_the_python_api_serves_adapters() -> None:
    import simulator as sim

    dep = sim.deployment(model="llama-3.1-8b", hardware="h100_sxm")
    workload = sim.WorkloadSpec(
        dataset={"name": "random", "input_len": 128, "output_len": 16},  # type: ignore[arg-type]
        num_prompts=40,
        adapters=sim.AdapterMix(num_adapters=10, distribution="zipf", alpha=1.5),
    )
    requests = sim.generate_requests(workload, rng=np.random.default_rng(0))
    result = sim.simulate(dep, requests=requests, lora=sim.LoraSpec(max_loras=3))
    assert result.lora is not None and result.lora["max_adapters_per_step"] == 3
    assert len(result.requests) == 40


UNIFORM_8_512 = {"range_ratio": 252 / 260}  # 260 +- 252: S-LoRA's lengths, uniform in [8, 512]


def _slora_s1(num_adapters: int) -> float:
    """S-LoRA's S1 table setting (Llama-7B, rank-8 q/k/v/o adapters, Zipf(1) popularity, lengths
    uniform in [8, 512]) on one A100-80GB with slots for every adapter a batch holds and every
    adapter in host memory, as S-LoRA keeps them; 1200 requests at once: requests/s."""
    data = {
        "name": "slora-s1",
        "model": "llama-2-7b",
        "replicas": [
            {
                "hardware": "a100_sxm_80gb",
                "lora": {
                    "max_loras": 256,
                    "max_lora_rank": 8,
                    "max_cpu_loras": max(num_adapters, 256),
                    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
                },
            }
        ],
        "workload": {
            "dataset": {
                "name": "random",
                "input_len": 260,
                "output_len": 260,
                "range_ratio": 0.969,
            },
            "num_prompts": 1200,
            "adapters": {"num_adapters": num_adapters, "distribution": "zipf", "alpha": 1.0},
        },
    }
    return float(runner.run(Scenario.model_validate(data)).summary["request_throughput"])


@pytest.mark.slow
def test_s_loras_thousands_of_adapters_cost_a_few_percent() -> None:
    """S-LoRA (arXiv 2311.03285, Table 3; its benchmarks/paper/synthetic/slora/
    synthetic_num_adapters_a100-80_S1_slora_table.jsonl): 8.05 req/s with 5 adapters, 7.61 with
    2000, 5.5 % less. llmsim's vLLM with enough slots: a few per cent less as well."""
    few, many = _slora_s1(5), _slora_s1(2000)
    assert 0.90 * few < many < few
