"""ShadowKV (low-rank keys on the GPU, values in host memory, sparse decode over the host link)
and SwiftKV (prompt tokens skip the last layers; AcrossKV shares their KV): memory, operator
costs, the serving loop, bad combinations and the papers' headline figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from clitools import one_line_error, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment, deployment
from simulator.costmodel.ops import step_ops
from simulator.costmodel.roofline import evaluate, total_time
from simulator.errors import SpecError
from simulator.specs.hardware import HardwareSpec

LONG = 122 * 1024  # ShadowKV's throughput setting (arXiv 2410.21465, sec. 5.2)


def step_s(dep: Deployment, batch: BatchShape, hw: HardwareSpec | None = None) -> float:
    ops = step_ops(dep.model, dep.layout, dep.precision, batch)
    return float(total_time(evaluate(ops, hw or dep.hardware, dep.engine)).ravel()[0])


def dep(hardware: str = "a100_sxm_80gb", **kw: Any) -> Deployment:
    return deployment(model="llama-3.1-8b", hardware=hardware, **kw)


@settings(max_examples=25, deadline=None)
@given(
    rank=st.integers(16, 512),
    chunk=st.integers(4, 64),
    budget=st.integers(512, 4096),
    hardware=st.sampled_from(["a100_sxm_80gb", "h100_sxm", "h200_sxm"]),
)
def test_shadowkv_never_raises_gpu_kv_bytes_nor_lowers_capacity(
    rank: int, chunk: int, budget: int, hardware: str
) -> None:
    base = dep(hardware).memory()
    shadow = dep(
        hardware, shadowkv={"rank": rank, "chunk": chunk, "budget": budget, "outlier_share": 0.003}
    ).memory()
    assert shadow.kv_bytes_per_token < base.kv_bytes_per_token
    assert shadow.kv_capacity_tokens >= base.kv_capacity_tokens
    assert shadow.max_batch(seq_len=LONG) >= base.max_batch(seq_len=LONG)


@settings(max_examples=25, deadline=None)
@given(skip=st.floats(0.0, 0.9), across=st.integers(1, 8))
def test_swiftkv_never_raises_kv_bytes_nor_lowers_capacity(skip: float, across: int) -> None:
    base = dep("h100_sxm").memory()
    layers = int(skip * 32)
    if across > 1 and layers < 2:
        with pytest.raises(SpecError, match="AcrossKV"):
            dep("h100_sxm", swiftkv={"skip_fraction": skip, "across": across})
        return
    swift = dep("h100_sxm", swiftkv={"skip_fraction": skip, "across": across}).memory()
    assert swift.kv_bytes_per_token <= base.kv_bytes_per_token
    assert swift.kv_capacity_tokens >= base.kv_capacity_tokens
    # AcrossKV over the skipped layers: kept + ceil(skipped / across) of 32 layers' KV
    kept = 32 - layers + -(-layers // across)
    assert swift.kv_bytes_per_token == pytest.approx(base.kv_bytes_per_token * kept / 32)


def test_shadowkv_gpu_bytes_per_token_are_rank_keys_and_landmarks() -> None:
    # Llama-3.1-8B: K width 8 x 128 = 1024; rank 160 + 1024 / 8 landmark elements of 2048,
    # plus 0.3% of the tokens kept whole
    base, shadow = dep().memory(), dep(shadowkv={}).memory()
    assert shadow.kv_bytes_per_token == pytest.approx(
        base.kv_bytes_per_token * (288 / 2048 + 0.003)
    )
    # the values live in host memory: half the full KV a token
    assert shadow.host_kv_bytes_per_token == pytest.approx(base.kv_bytes_per_token / 2)


def test_shadowkv_capacity_is_bounded_by_host_memory() -> None:
    d = dep(shadowkv={})
    small = d.hardware.model_copy(
        update={"host": d.hardware.host.model_copy(update={"memory_bytes": 8 * 2**30})}
    )
    tight = deployment(model="llama-3.1-8b", hardware=small, shadowkv={}).memory()
    # 8 GiB of 64 KiB values a token: 131072 tokens at most
    assert tight.kv_capacity_tokens <= 8 * 2**30 // (64 * 1024)
    assert tight.kv_capacity_tokens < d.memory().kv_capacity_tokens


def test_shadowkv_decode_pays_the_host_link_fetch() -> None:
    d = dep(shadowkv={})
    batch = BatchShape.decode(batch_size=16.0, context_len=float(LONG))
    slow = d.hardware.model_copy(
        update={
            "host": d.hardware.host.model_copy(
                update={"pcie_bw_bytes_per_s": d.hardware.host.pcie_bw_bytes_per_s / 4}
            )
        }
    )
    fast_s, slow_s = step_s(d, batch), step_s(d, batch, slow)
    assert slow_s > 1.5 * fast_s
    names = {op.name for op in step_ops(d.model, d.layout, d.precision, batch)}
    assert {"shadowkv_value_fetch", "shadowkv_key_rebuild", "shadowkv_landmark_scores"} <= names
    # attention reads the budget, not the context: a longer context costs only landmarks
    # (without outliers, whose share of the context would take more of the budget)
    d = dep(shadowkv={"outlier_share": 0.0})
    longer = BatchShape.decode(batch_size=16.0, context_len=float(2 * LONG))
    base = dep()
    grow_shadow = step_s(d, longer) - step_s(d, batch)
    grow_base = step_s(base, longer) - step_s(base, batch)
    assert 0 < grow_shadow < grow_base / 4


def test_shadowkv_fetch_overlaps_the_key_rebuild() -> None:
    d = dep(shadowkv={})
    batch = BatchShape.decode(batch_size=8.0, context_len=float(LONG))
    costs = {
        c.op.name: c
        for c in evaluate(step_ops(d.model, d.layout, d.precision, batch), d.hardware, d.engine)
    }
    fetch, rebuild = costs["shadowkv_value_fetch"], costs["shadowkv_key_rebuild"]
    link = d.hardware.host.pcie_bw_bytes_per_s * d.hardware.efficiency.host_link_fraction
    alone = float(fetch.network_s.ravel()[0])
    assert alone == pytest.approx(float(fetch.op.msg_bytes) / link)
    exposed = float(fetch.time_s.ravel()[0])
    assert exposed == pytest.approx(
        max(alone + float(fetch.latency_s.ravel()[0]) - float(rebuild.time_s.ravel()[0]), 0.0)
    )


@pytest.mark.parametrize(("skip", "low", "high"), [(0.5, 0.48, 0.6), (0.25, 0.72, 0.82)])
def test_swiftkv_prefill_is_faster_by_about_the_skipped_layers(
    skip: float, low: float, high: float
) -> None:
    batch = BatchShape.prefill(batch_size=1.0, prompt_len=8192.0)
    base = step_s(dep("h100_sxm"), batch)
    swift = step_s(dep("h100_sxm", swiftkv={"skip_fraction": skip}), batch)
    assert low < swift / base < high


def test_swiftkv_leaves_decode_alone() -> None:
    batch = BatchShape.decode(batch_size=32.0, context_len=2048.0)
    base = step_s(dep("h100_sxm"), batch)
    swift = step_s(dep("h100_sxm", swiftkv={"skip_fraction": 0.5}), batch)
    assert swift == pytest.approx(base, rel=0.02)


def test_shadowkv_paper_batch_and_decode_throughput() -> None:
    """ShadowKV: up to 6x larger batch and 3.04x throughput, Llama-3.1-8B, A100, 122K."""
    base, shadow = dep(), dep(shadowkv={})
    nb, ns = base.memory().max_batch(seq_len=LONG), shadow.memory().max_batch(seq_len=LONG)
    assert 4 <= ns / nb <= 12
    tb = nb / step_s(base, BatchShape.decode(batch_size=float(nb), context_len=float(LONG)))
    ts = ns / step_s(shadow, BatchShape.decode(batch_size=float(ns), context_len=float(LONG)))
    assert 1.8 <= ts / tb <= 4.0


@pytest.mark.slow
def test_swiftkv_paper_throughput_on_prefill_heavy_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SwiftKV: up to 2x aggregate throughput on prefill-heavy work (50% SingleInputKV, 2-way
    AcrossKV, fp8 KV); here 2000-token prompts, 200 out, Llama-3.1-8B on an H100."""
    args = ["bench", "throughput", "--model", "llama-3.1-8b", "--hardware", "h100_sxm"]
    args += ["--input-len", "2000", "--output-len", "200", "--num-prompts", "300"]
    args += ["--kv-cache-dtype", "fp8", "--json"]
    code, out, _ = run_cli(capsys, *args)
    assert code == 0
    base = json.loads(out)["elapsed_time"]
    code, out, _ = run_cli(capsys, *args, "--swiftkv-layers", "0.5", "--acrosskv", "2")
    assert code == 0
    swift = json.loads(out)["elapsed_time"]
    assert 1.3 <= base / swift <= 2.2


def test_cli_flags_run_and_bad_combinations_are_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["bench", "throughput", "--model", "llama-3.1-8b", "--hardware", "h100_sxm"]
    args += ["--num-prompts", "8", "--input-len", "4096", "--output-len", "32"]
    code, out, _ = run_cli(capsys, *args, "--shadowkv", "--shadowkv-rank", "128")
    assert code == 0 and "Throughput:" in out
    code, out, _ = run_cli(capsys, *args, "--swiftkv-layers", "0.5", "--acrosskv", "4")
    assert code == 0 and "Throughput:" in out
    assert "shadowkv" in one_line_error(capsys, *args, "--shadowkv", "--enable-prefix-caching")
    assert "shadowkv" in one_line_error(capsys, *args, "--shadowkv", "--kv-cache-dtype", "fp8")
    assert "shadowkv" in one_line_error(capsys, *args, "--shadowkv", "--kv-budget", "512")
    assert "shadowkv_rank" in one_line_error(capsys, *args, "--shadowkv-rank", "64")
    assert "acrosskv" in one_line_error(capsys, *args, "--acrosskv", "2")
    assert "shadowkv" in one_line_error(capsys, *args, "--shadowkv", "--shadowkv-rank", "4096")
    serve = ["bench", "serve", "--model", "llama-3.1-8b", "--hardware", "h100_sxm"]
    serve += ["--num-prompts", "8", "--random-input-len", "2048", "--random-output-len", "16"]
    code, out, _ = run_cli(capsys, *serve, "--swiftkv-layers", "0.5")
    assert code == 0
    latency = ["bench", "latency", "--model", "llama-3.1-8b", "--hardware", "a100_sxm_80gb"]
    latency += ["--batch-size", "4", "--input-len", "32768", "--output-len", "16", "--json"]
    code, out, _ = run_cli(capsys, *latency)
    assert code == 0
    base = json.loads(out)
    code, out, _ = run_cli(capsys, *latency, "--shadowkv", "--swiftkv-layers", "0.5")
    assert code == 0
    both = json.loads(out)
    # four sequences of 32K: fetching 2048 tokens' values over PCIe outweighs reading 32K
    # tokens from HBM (ShadowKV wins by the batch its memory allows); prompts skip half
    assert both["tpot_s"] > base["tpot_s"]
    assert both["ttft_s"] < 0.6 * base["ttft_s"]
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.7}'
    assert "shadowkv" in one_line_error(
        capsys, *latency, "--shadowkv", "--speculative-config", spec
    )


def test_scenario_fields_reach_the_deployment() -> None:
    from simulator.specs.engine_args import EngineArgs

    group = EngineArgs(shadowkv={"budget": 1024}, swiftkv=None).replica_group(hardware="h100_sxm")
    assert group["shadowkv"] == {"budget": 1024}
    from simulator.specs.scenario import ReplicaGroupSpec

    spec = ReplicaGroupSpec.model_validate(group)
    assert spec.shadowkv is not None and spec.shadowkv.budget == 1024
    assert not spec.prefix_caching


def test_a_bad_scenario_field_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    scenario = Path(__file__).parents[2] / "scenarios" / "long_context_shadowkv.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text(scenario.read_text().replace("rank: 160", "rank: 4096"))
    err = one_line_error(capsys, "run", str(bad))
    assert "bad.yaml" in err and "shadowkv" in err and "rank 4096" in err
