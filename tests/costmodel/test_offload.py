"""Weight streaming and MoE expert offload: the schedule by hand, the memory it frees, the
expert cache's hit rate and misses, the CPU roofline, the fit errors and the CLI."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from clitools import run_cli
from factories import cost_model_step_s
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment, deployment
from simulator.costmodel.expert_cache import (
    build_expert_cache,
    expected_misses,
    routing_probabilities,
    zipf_hit_rate,
)
from simulator.costmodel.memory import layer_weight_bytes
from simulator.costmodel.offload import (
    layer_times,
    link_bandwidth,
    spread_positions,
    stage_time,
    streamed_layer_bytes,
)
from simulator.costmodel.step import step_cost
from simulator.errors import SpecError
from simulator.runs.latency import estimate
from simulator.specs import load_model
from simulator.specs.engine_args import EngineArgs
from simulator.specs.offload import ExpertOffloadSpec, OffloadSpec, resolve_offload
from simulator.units import GiB

# RTX 4090 host link: PCIe 4.0 x16 32 GB/s x host_link_fraction 0.81 (host DRAM 51 GB/s is faster)
RTX_LINK = 32e9 * 0.81
# Llama-3.1-8B layer in bf16: (4096 x (4096 + 2 x 1024) + 4096 x 4096 + 3 x 4096 x 14336) x 2 B
# + two RMS norms of 4096 x 2 B
LLAMA8B_LAYER = (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336) * 2 + 2 * 4096 * 2


def make_deployment(
    model: str = "llama-3.1-8b", hardware: str = "rtx_4090", **knobs: Any
) -> Deployment:
    return deployment(model=model, hardware=hardware, **knobs)


# -- the schedule, by hand ------------------------------------------------------------------------
def test_the_host_link_is_pcie_times_its_measured_fraction() -> None:
    dep = make_deployment()
    assert link_bandwidth(dep.hardware, "host") == pytest.approx(RTX_LINK)
    assert link_bandwidth(dep.hardware, "nvme") == pytest.approx(3.5e9)  # the drive is slower


@pytest.mark.parametrize(("compute", "load"), [(1.0, 3.0), (3.0, 1.0), (2.0, 2.0)])
def test_double_buffered_layers_cost_max_of_compute_and_transfer(
    compute: float, load: float
) -> None:
    # All L layers streamed: the first load is exposed, then each layer takes max(c, x) while
    # the next one loads, and the last computes: x + (L - 1) max(c, x) + c.
    layers = 10
    c = np.full((layers, 1), compute)
    x = np.full(layers, load)
    total = float(stage_time(c, x, "prefetch")[0])
    assert total == pytest.approx(load + (layers - 1) * max(compute, load) + compute)
    one_more = float(
        stage_time(np.full((layers + 1, 1), compute), np.full(layers + 1, load), "prefetch")[0]
    )
    assert one_more - total == pytest.approx(max(compute, load))  # per streamed layer


def test_one_layer_streamed_over_the_rtx_4090_link() -> None:
    # One 1 GB layer over 25.92 GB/s: 38.58 ms of transfer; with 10 ms of compute it is
    # transfer-bound, and alone its load is exposed in full: 38.58 + 10 ms.
    dep = make_deployment()
    x = 1e9 / link_bandwidth(dep.hardware, "host")
    assert x == pytest.approx(0.0385802, rel=1e-5)
    assert float(stage_time(np.array([[0.010]]), np.array([x]), "prefetch")[0]) == pytest.approx(
        x + 0.010
    )
    two = stage_time(np.full((2, 1), 0.010), np.full(2, x), "prefetch")
    assert float(two[0]) == pytest.approx(2 * x + 0.010)  # x + max(c, x) + c


def test_resident_layers_in_front_hide_a_load() -> None:
    # 4 layers, the 2nd and 4th streamed (spread over two groups), c = 1, x = 1.5:
    # loads run [0, 1.5] and [1.5, 3.0]; layer 1 waits for its load until 1.5, ends 2.5; layer 2
    # ends 3.5; layer 3's load is long done, ends 4.5.
    c = np.ones((4, 1))
    x = np.array([0.0, 1.5, 0.0, 1.5])
    assert float(stage_time(c, x, "prefetch")[0]) == pytest.approx(4.5)
    assert float(stage_time(c, x, "uva")[0]) == pytest.approx(1 + 1.5 + 1 + 1.5)  # max(c, x) each
    assert float(stage_time(c, x, "sync")[0]) == pytest.approx(4 + 3.0)  # c + x each


def test_two_buffers_limit_how_far_loads_run_ahead() -> None:
    # Slow compute, instant-ish loads: the 3rd load waits for layer 0's buffer (layer 0 ends at
    # 0.1 + 5), so it ends at 5.2, hidden under layer 1; time = 0.1 + 3 x 5.
    c = np.full((3, 1), 5.0)
    x = np.full(3, 0.1)
    assert float(stage_time(c, x, "prefetch")[0]) == pytest.approx(0.1 + 15.0)


def test_spread_positions_end_each_group() -> None:
    assert spread_positions(8, 2).tolist() == [3, 7]
    assert spread_positions(8, 8).tolist() == list(range(8))
    assert spread_positions(80, 3).tolist() == [25, 52, 79]
    assert spread_positions(5, 0).tolist() == []


def test_resident_layers_stream_the_rest_whole() -> None:
    layers = np.full(8, 100.0)
    out = streamed_layer_bytes(layers, offload_bytes=0.0, resident_layers=6)
    assert out.tolist() == [0, 0, 0, 100, 0, 0, 0, 100]
    assert streamed_layer_bytes(layers, offload_bytes=0.0, resident_layers=9).sum() == 0


def test_offload_bytes_pick_the_fewest_layers_and_share_the_bytes() -> None:
    layers = np.full(8, 100.0)
    out = streamed_layer_bytes(layers, offload_bytes=250.0, resident_layers=None)
    assert np.count_nonzero(out) == 3
    assert out.sum() == pytest.approx(250.0)
    assert out.max() == pytest.approx(250.0 / 3)
    # more than the layers hold: everything streams (vLLM offloads what it can)
    assert streamed_layer_bytes(layers, offload_bytes=1e9, resident_layers=None).sum() == 800


@settings(max_examples=60, deadline=None)
@given(
    c=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=12),
    x=st.lists(st.floats(0.0, 10.0), min_size=12, max_size=12),
)
def test_prefetch_sits_between_the_bounds(c: list[float], x: list[float]) -> None:
    compute = np.array(c)[:, None]
    load = np.array(x[: len(c)])
    t = float(stage_time(compute, load, "prefetch")[0])
    assert t >= max(compute.sum(), load.sum()) - 1e-9  # neither engine can do better
    assert t <= compute.sum() + load.sum() + 1e-9  # never worse than blocking copies


# -- whole model ---------------------------------------------------------------------------------
def test_llama_8b_decode_with_every_layer_streamed_is_transfer_bound() -> None:
    # 32 layers of 436,224,000 B over 25.92 GB/s: x = 16.83 ms each, against well under 1 ms of
    # decode compute per layer, so the layers take x + 31 x + c = 32 x + c and the exposed
    # streaming is 32 x - 31 c.
    dep = make_deployment(offload={"resident_layers": 0})
    plan = dep.memory().offload
    assert plan is not None
    assert layer_weight_bytes(dep.model, dep.layout, dep.precision)[0] == LLAMA8B_LAYER
    x = LLAMA8B_LAYER / RTX_LINK
    assert x == pytest.approx(0.016829, rel=1e-4)
    batch = BatchShape.decode(batch_size=1.0, context_len=512.0)
    cost = step_cost(dep.model, dep.hardware, dep.layout, dep.precision, batch, offload=plan)
    c = layer_times(cost.costs, dep.model).per_layer[:, 0]
    assert np.allclose(c, c[0]) and c[0] < x / 10
    (extra,) = cost.extras
    assert extra.name == "weight streaming (exposed)"
    assert float(extra.time_s[0]) == pytest.approx(32 * x - 31 * c[0], rel=1e-9)
    assert float(extra.bytes) == pytest.approx(32 * LLAMA8B_LAYER)


def test_streaming_is_amortised_over_the_batch() -> None:
    # The same bytes cross the link per step whatever the batch: per token, batch 64 pays far
    # less than batch 1, and more compute hides more of the transfer.
    runs = {
        b: estimate(
            model="llama-3.1-70b",
            hardware="rtx_4090",
            quantization="int4",
            cpu_offload_gb=26,
            batch_size=b,
            input_len=128,
            output_len=16,
            max_num_batched_tokens=2048,
        )
        for b in (1, 64)
    }
    per_token = {b: r.tpot_s / b for b, r in runs.items()}
    assert per_token[64] < per_token[1] / 30
    streaming = {
        b: r.breakdown().query("op == 'weight streaming (exposed)' and phase == 'decode'")
        for b, r in runs.items()
    }
    assert float(streaming[64]["total_s"].iloc[0]) < float(streaming[1]["total_s"].iloc[0])
    # batch 1 decode: ~26 GiB over 25.92 GB/s, about 1.08 s per step
    assert runs[1].tpot_s == pytest.approx(26 * GiB / RTX_LINK, rel=0.1)


def test_prefill_hides_the_transfer_behind_compute() -> None:
    r = estimate(
        model="llama-3.1-70b",
        hardware="rtx_4090",
        quantization="int4",
        cpu_offload_gb=26,
        batch_size=4,
        input_len=512,
        output_len=2,
        max_num_batched_tokens=2048,
    )
    rows = r.breakdown().query("phase == 'prefill'")
    exposed = float(rows.loc[rows.op == "weight streaming (exposed)", "total_s"].iloc[0])
    assert exposed < 0.05 * (26 * GiB / RTX_LINK)


# -- memory ----------------------------------------------------------------------------------
def test_offloaded_weights_leave_the_gpu_and_staging_joins_it() -> None:
    base = make_deployment("llama-3.1-70b", quantization="int4").memory()
    plan = make_deployment("llama-3.1-70b", quantization="int4", cpu_offload_gb=26).memory()
    layer = float(layer_weight_bytes(*_args("llama-3.1-70b", quantization="int4"))[0])
    streamed = math.ceil(26 * GiB / layer)  # the fewest whole layers holding 26 GiB
    assert plan.offloaded_bytes == pytest.approx(26 * GiB)
    assert plan.weights_bytes == pytest.approx(base.weights_bytes - 26 * GiB)
    assert plan.staging_bytes == pytest.approx(2 * 26 * GiB / streamed)  # two buffers
    assert plan.kv_cache_bytes == pytest.approx(base.kv_cache_bytes + 26 * GiB - plan.staging_bytes)
    assert plan.fits and not base.fits
    assert plan.as_dict()["offloaded_bytes"] == plan.offloaded_bytes


def _args(model: str, **knobs: Any) -> tuple[Any, Any, Any]:
    dep = make_deployment(model, **knobs)
    return dep.model, dep.layout, dep.precision


def test_uva_needs_no_staging() -> None:
    plan = make_deployment(
        "llama-3.1-70b", quantization="int4", cpu_offload_gb=26, offload={"transfer": "uva"}
    ).memory()
    assert plan.staging_bytes == 0


def test_the_suggested_offload_is_the_least_that_fits() -> None:
    knobs: dict[str, Any] = {"quantization": "int4", "entrypoint": "offline"}  # as estimate
    dep = make_deployment("llama-3.1-70b", **knobs)
    with pytest.raises(SpecError) as info:
        estimate(model="llama-3.1-70b", hardware="rtx_4090", quantization="int4")
    n = dep.memory().min_cpu_offload_gib
    assert n is not None
    assert f"--cpu-offload-gb {n} " in str(info.value)
    assert make_deployment("llama-3.1-70b", cpu_offload_gb=n, **knobs).memory().fits
    assert not make_deployment("llama-3.1-70b", cpu_offload_gb=n - 1, **knobs).memory().fits


def test_a_model_too_big_even_streamed_says_so() -> None:
    # 405B bf16: two staging buffers of a 6.5 GB layer plus 8.4 GB of embeddings exceed 24 GB
    with pytest.raises(SpecError, match="not fit even with every layer streamed"):
        estimate(model="llama-3.1-405b", hardware="rtx_4090")


def test_host_memory_must_hold_what_is_offloaded() -> None:
    # bf16 Llama-70B needs ~117 GiB off the GPU; the rtx_4090 spec's host has 64 GB per GPU
    with pytest.raises(SpecError) as info:
        make_deployment("llama-3.1-70b", cpu_offload_gb=117).memory()
    assert info.value.field == "cpu_offload_gb"
    assert "host memory" in str(info.value)
    big = make_deployment(
        "llama-3.1-70b", cpu_offload_gb=117, offload={"host_memory_bytes": "128 GB"}
    ).memory()
    assert big.fits
    # on NVMe the host DRAM does not hold it
    assert (
        make_deployment("llama-3.1-70b", cpu_offload_gb=117, offload={"source": "nvme"})
        .memory()
        .fits
    )


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        ({"cpu_offload_gb": 4, "offload": {"resident_layers": 10}}, "offload"),
        ({"offload": {"expert_offload": {"cache_fraction": 0.5}}}, "expert_offload"),
        ({"offload": "{not json"}, ""),
        ({"offload": {"transfer": "uva", "source": "nvme"}}, "offload"),
        ({"cpu_offload_gb": 4, "offload": {"cpu_offload_gb": 8}}, "cpu_offload_gb"),
    ],
)
def test_impossible_offload_settings_are_spec_errors(knobs: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        make_deployment(**knobs).memory()
    assert field in (info.value.source + info.value.field) or not field


def test_nothing_offloaded_is_no_offload() -> None:
    assert resolve_offload() is None
    assert resolve_offload(offload={"source": "host"}) is None
    assert make_deployment().offload is None


# -- the expert cache ----------------------------------------------------------------------------
def test_uniform_routing_hits_the_cached_share() -> None:
    q = routing_probabilities(num_experts=256, top_k=8, skew=0.0)
    assert np.allclose(q, 8 / 256)
    assert zipf_hit_rate(num_experts=256, top_k=8, skew=0.0, cached=192) == pytest.approx(0.75)


def test_zipf_hit_rate_by_hand() -> None:
    # E = 4, top-1, s = 1: weights 1, 1/2, 1/3, 1/4 (sum 25/12): q = 12/25, 6/25, 4/25, 3/25
    q = routing_probabilities(num_experts=4, top_k=1, skew=1.0)
    assert q.tolist() == pytest.approx([12 / 25, 6 / 25, 4 / 25, 3 / 25])
    assert zipf_hit_rate(num_experts=4, top_k=1, skew=1.0, cached=1) == pytest.approx(0.48)
    assert zipf_hit_rate(num_experts=4, top_k=1, skew=1.0, cached=2) == pytest.approx(0.72)


def test_a_token_picks_an_expert_at_most_once() -> None:
    # E = 4, top-2, s = 2: the top expert would get 2 / (1 + 1/4 + 1/9 + 1/16) = 1.40 > 1, so it
    # is capped at 1 and the other pick spreads over the rest as 1/4 : 1/9 : 1/16.
    q = routing_probabilities(num_experts=4, top_k=2, skew=2.0)
    rest = np.array([1 / 4, 1 / 9, 1 / 16])
    assert q.tolist() == pytest.approx([1.0, *(rest / rest.sum())])
    assert q.sum() == pytest.approx(2.0)


@settings(max_examples=50, deadline=None)
@given(e=st.integers(2, 300), k=st.integers(1, 8), s=st.floats(0, 4), f=st.floats(0, 1))
def test_zipf_hit_rate_grows_with_skew_and_cache(e: int, k: int, s: float, f: float) -> None:
    k = min(k, e)
    cached = round(f * e)
    h = zipf_hit_rate(num_experts=e, top_k=k, skew=s, cached=cached)
    assert cached / e - 1e-9 <= h <= 1 + 1e-9  # popular experts first: never below uniform
    assert zipf_hit_rate(num_experts=e, top_k=k, skew=s + 0.5, cached=cached) >= h - 1e-9


def test_expected_misses_by_hand() -> None:
    # two uncached experts each picked with probability 1/2: two tokens miss each with 3/4
    assert float(expected_misses(np.array([0.5, 0.5]), 2.0)) == pytest.approx(1.5)
    assert expected_misses(np.array([0.5, 0.5]), np.array([0.0, 1.0])).tolist() == [0.0, 1.0]


def _deepseek_cache(**spec: Any) -> Any:
    dep = make_deployment("deepseek-v3", "h100_sxm", tensor_parallel_size=8)
    return build_expert_cache(
        dep.model,
        dep.hardware,
        dep.layout,
        dep.precision,
        ExpertOffloadSpec(**spec),
        link_bytes_per_s=link_bandwidth(dep.hardware, "host"),
    )


def test_a_given_hit_rate_spreads_the_misses_evenly() -> None:
    cache = _deepseek_cache(cache_fraction=0.75, hit_rate=0.9)
    assert cache.cached == 192
    assert cache.uncached_q == pytest.approx(np.full(64, 0.1 * 8 / 64))
    with pytest.raises(SpecError, match="hit_rate"):
        _deepseek_cache(cache_fraction=0.99, hit_rate=0.0)  # 8 picks over 3 experts


def test_cpu_expert_compute_is_a_roofline_by_hand() -> None:
    # DeepSeek-V3 at TP8: an expert is 3 x 7168 x 2048 = 44,040,192 fp8 weights, 5,505,024 per
    # device. Cache 192 of 256, uniform: one token misses 64 x 1/32 = 2 experts, with
    # 8 x 0.25 = 2 routings: 2 x 5,505,024 x 2 = 22.0 MFLOP (24.5 us at 0.9 TFLOP/s) against
    # 2 x 5,505,024 B of experts + 2 x 2 x 7168 x 2 B of activations from DRAM at 77 GB/s
    # (143.7 us): memory-bound; plus 2 x 7168 x 2 B over the 51.84 GB/s link.
    cache = _deepseek_cache(cache_fraction=0.75, cpu_compute=True)
    assert cache.expert_bytes == 5_505_024
    missed = cache.misses(1.0)
    assert float(missed) == pytest.approx(2.0)
    host = (2 * 5_505_024 + 2 * 2 * 7168 * 2) / 77e9
    link = 2 * 7168 * 2 / 51.84e9
    assert float(cache.cpu_s(np.asarray(1.0), missed)) == pytest.approx(host + link)
    # fetching the 2 experts instead takes 2 x 5,505,024 / 51.84 GB/s = 212 us: the CPU wins
    # at one token; at 4096 tokens the CPU's FLOPs lose to fetching all 64 experts
    gpu = {"expert_gpu_s": 1e-6, "shared_gpu_s": 1e-6}
    _, on_cpu = cache.layer_extra_s(np.array([1.0, 4096.0]), **gpu)
    assert on_cpu.tolist() == [True, False]


def test_expert_offload_frees_gpu_memory_and_costs_fetches() -> None:
    base = make_deployment("deepseek-v3", "h100_sxm", tensor_parallel_size=8).memory()
    assert not base.fits
    dep = make_deployment(
        "deepseek-v3",
        "h100_sxm",
        tensor_parallel_size=8,
        expert_offload=ExpertOffloadSpec(cache_fraction=0.75),
    )
    plan = dep.memory()
    # a quarter of 58 layers x 256 experts x 5,505,024 B per device
    off = 58 * 64 * 5_505_024
    assert plan.offloaded_bytes == pytest.approx(off)
    assert plan.weights_bytes == pytest.approx(base.weights_bytes - off)
    assert plan.fits
    r = estimate(
        model="deepseek-v3",
        hardware="h100_sxm",
        tensor_parallel_size=8,
        offload={"expert_offload": {"cache_fraction": 0.75}},
        batch_size=1,
        input_len=256,
        output_len=8,
    )
    row = r.breakdown().query("op == 'uncached experts' and phase == 'decode'")
    # one token: 2 missed experts per layer over the link, less the cached experts' compute
    fetch = 2 * 5_505_024 / 51.84e9
    assert 0 < float(row["time_s"].iloc[0]) <= fetch
    assert float(row["count"].iloc[0]) == 58


# -- the serving simulator prices the same steps --------------------------------------------------
@pytest.mark.parametrize(
    "knobs",
    [
        {"model": "llama-3.1-70b", "quantization": "int4", "cpu_offload_gb": 26},
        {
            "model": "deepseek-v3",
            "hardware": "h100_sxm",
            "tensor_parallel_size": 8,
            "expert_offload": ExpertOffloadSpec(cache_fraction=0.75),
        },
    ],
)
def test_the_step_timer_matches_the_cost_model_with_offload(knobs: dict[str, Any]) -> None:
    from simulator.serving.steptime import StepTimer

    dep = make_deployment(**knobs)
    plan = dep.memory(max_num_batched_tokens=2048, max_num_seqs=64).offload
    timer = StepTimer(
        dep, max_num_seqs=64, max_num_batched_tokens=2048, max_context=4096, offload=plan
    )
    for chunks, decodes in [([], [700] * 8), ([(512, 0, True)], [300] * 20), ([], [2000])]:
        batch = BatchShape.mixed(chunks=chunks, decode_context_lens=decodes)
        want = cost_model_step_s(dep, batch, num_seqs=len(chunks) + len(decodes), offload=plan)
        got = timer.mixed(chunks=chunks, decode_contexts=decodes)
        assert got == pytest.approx(want, rel=0.02)


# -- CLI -----------------------------------------------------------------------------------------
def test_cli_bench_latency_streams_with_cpu_offload_gb(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("bench", "latency", "--hardware", "rtx_4090", "--model", "llama-3.1-70b", "-q", "int4")
    args += ("--batch-size", "2", "--input-len", "256", "--output-len", "8")
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    assert err.count("\n") == 1 and "--cpu-offload-gb" in err
    code, out, _ = run_cli(capsys, *args, "--cpu-offload-gb", "26", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["memory"]["offloaded_bytes"] == pytest.approx(26 * GiB)
    ops = {row["op"] for row in data["breakdown"]}
    assert "weight streaming (exposed)" in ops
    code, out, _ = run_cli(capsys, *args, "--cpu-offload-gb", "26")
    assert code == 0 and "weight streaming" in out and "offloaded to host" in out


def test_cli_offload_config_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("bench", "latency", "--hardware", "rtx_4090", "--model", "llama-3.1-8b")
    code, _, err = run_cli(capsys, *args, "--offload-config", "{bad")
    assert code == 2 and err.count("\n") == 1 and "--offload-config" in err
    code, _, err = run_cli(capsys, *args, "--offload-config", '{"resident_layer": 3}')
    assert code == 2 and "resident_layer" in err


def test_offload_spec_round_trips() -> None:
    spec = OffloadSpec(cpu_offload_gb=2.5, expert_offload=ExpertOffloadSpec(cache_fraction=0.5))
    assert resolve_offload(offload=spec.model_dump_json()) == spec


def test_cli_host_memory_alone_still_applies(capsys: pytest.CaptureFixture[str]) -> None:
    # bf16 Llama-70B: 117 GiB streamed needs the 128 GB host given in --offload-config
    args = ("bench", "latency", "--hardware", "rtx_4090", "--model", "llama-3.1-70b")
    args += ("--batch-size", "1", "--input-len", "64", "--output-len", "4")
    args += ("--max-num-batched-tokens", "2048", "--cpu-offload-gb", "117", "--json")
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "host memory" in err
    code, out, _ = run_cli(capsys, *args, "--offload-config", '{"host_memory_bytes": "128 GB"}')
    assert code == 0
    # 117 GiB over 25.92 GB/s per decode step
    assert json.loads(out)["tpot_s"] == pytest.approx(117 * GiB / RTX_LINK, rel=0.05)


# -- scenarios ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["offload_llama70b_rtx4090.yaml", "offload_deepseek_v3_h100.yaml"])
def test_the_offload_scenarios_run(name: str) -> None:
    from pathlib import Path

    from simulator.runs import runner

    path = Path(__file__).resolve().parents[2] / "scenarios" / name
    result = runner.run(path)
    assert result.summary["completed"] == result.scenario.workload.num_prompts
    (plan,) = result.memory
    assert plan.fits and plan.offloaded_bytes > 0 and plan.offload is not None
    assert result.summary["output_throughput"] > 0


def test_scenario_offload_fields_merge_and_conflict() -> None:
    from simulator.runs import runner
    from simulator.specs.workload import WorkloadSpec
    from simulator.workload.requests import RandomDataset

    workload = WorkloadSpec(
        dataset=RandomDataset(input_len=64, output_len=8), num_prompts=4, request_rate=math.inf
    )
    scenario = runner.bench_scenario(
        model="llama-3.1-70b",
        hardware="rtx_4090",
        workload=workload,
        engine_args=EngineArgs(
            quantization="int4",
            cpu_offload_gb=26,
            offload_config='{"transfer": "sync"}',
            max_num_batched_tokens=2048,
        ),
    )
    (group,) = scenario.replicas
    assert group.cpu_offload_gb == 26 and group.offload is not None
    dep = runner.group_deployment(load_model("llama-3.1-70b"), group)
    assert dep.offload is not None
    assert (dep.offload.cpu_offload_gb, dep.offload.transfer) == (26, "sync")
    clash = group.model_copy(update={"offload": OffloadSpec(cpu_offload_gb=3)})
    with pytest.raises(SpecError, match="disagrees"):
        runner.group_deployment(load_model("llama-3.1-70b"), clash)
