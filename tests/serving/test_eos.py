"""Output lengths that stop at EOS (simulator/workload/eos.py) and the ignore_eos switch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clitools import run_cli
from pydantic import ValidationError

from simulator.errors import SpecError
from simulator.specs.workload import ShareGPTDataset, WorkloadSpec
from simulator.validate import data, e2e
from simulator.workload.datasets import sharegpt_lengths
from simulator.workload.eos import (
    eos_stopped,
    expected_kept_fraction,
    fit_hazard,
    stop_profile,
)
from simulator.workload.requests import RequestTable, generate_requests


def requests(seed: int = 0, **fields: Any) -> RequestTable:
    data = {"dataset": {"name": "sharegpt"}, "num_prompts": 20_000, "request_rate": 5.0}
    spec = WorkloadSpec.model_validate(data | fields)
    return generate_requests(spec, rng=np.random.default_rng(seed))


def test_the_hazards_are_the_ones_fitted_to_the_published_totals() -> None:
    # eos_stop.yaml: each hazard keeps its measured share of 200,000 reference lengths
    _, reference = sharegpt_lengths(ShareGPTDataset(), n=200_000, rng=np.random.default_rng(0))
    for model, kept in (("instruct", 0.994), ("base", 0.654)):
        profile = stop_profile(model)
        assert profile.kept_fraction == kept
        assert fit_hazard(reference, kept) == pytest.approx(profile.hazard, rel=1e-3)
        assert expected_kept_fraction(reference, profile.hazard) == pytest.approx(kept, abs=1e-3)


@pytest.mark.parametrize("model", ["instruct", "base"])
def test_honouring_eos_shortens_sharegpt_by_the_measured_share(model: str) -> None:
    full = requests(ignore_eos=True, eos_model=model)
    stopped = requests(eos_model=model)  # vllm bench serve's default: EOS honoured
    kept = stopped.output_len.sum() / full.output_len.sum()
    assert kept == pytest.approx(stop_profile(model).kept_fraction, abs=0.01)
    assert np.all(stopped.output_len <= full.output_len) and stopped.output_len.min() >= 1
    if model == "base":  # the brief's "about 40% fewer" is a base checkpoint's
        assert 0.6 < kept < 0.7
    # only the outputs change: prompts and arrivals are drawn as with ignore_eos
    assert np.array_equal(stopped.prompt_len, full.prompt_len)
    assert np.array_equal(stopped.arrival_s, full.arrival_s)


def test_ignore_eos_restores_the_full_lengths_and_seeds_repeat() -> None:
    _, reference = sharegpt_lengths(ShareGPTDataset(), n=20_000, rng=np.random.default_rng(0))
    assert np.array_equal(requests(ignore_eos=True).output_len, reference)
    a, b = requests(eos_model="base"), requests(eos_model="base")
    assert np.array_equal(a.output_len, b.output_len)
    assert not np.array_equal(a.output_len, requests(1, eos_model="base").output_len)


def test_eos_stopped_is_a_cap_from_a_geometric_draw() -> None:
    rng = np.random.default_rng(0)
    reference = np.full(100_000, 10_000, dtype=np.int64)
    out = eos_stopped(reference, hazard=0.01, rng=rng)
    assert out.mean() == pytest.approx(100, rel=0.02)  # 1 / hazard, the cap far away
    assert np.array_equal(eos_stopped(reference, hazard=0.0, rng=rng), reference)


def test_random_and_trace_datasets_are_not_shortened() -> None:
    random = {"name": "random", "input_len": 64, "output_len": 32}
    table = requests(dataset=random)  # vLLM sets ignore_eos for its random dataset
    assert np.all(table.output_len == 32)
    with pytest.raises(ValidationError, match="reference answers"):
        WorkloadSpec(dataset=random, num_prompts=10, ignore_eos=False)
    conv = {"dataset": {"name": "azure-conv"}, "num_prompts": 500}
    honoured = requests(**conv, ignore_eos=False, eos_model="base")
    assert np.array_equal(honoured.output_len, requests(**conv, ignore_eos=True).output_len)


def test_validation_rows_follow_their_harness() -> None:
    # S1's sglang.bench_serving sends ignore_eos unless told not to: its ShareGPT rows run the
    # full reference lengths, as before; every harness of the measured rows is known
    serving = data.read_measured("e2e/serving.csv", e2e.SERVING_COLUMNS)
    throughput = data.read_measured("e2e/throughput.csv", e2e.THROUGHPUT_COLUMNS)
    for rows in (serving, throughput):
        assert set(rows["harness"]) <= set(e2e.HARNESS_IGNORES_EOS)
    s1 = serving[serving["harness"] == "sglang.bench_serving"].iloc[0]
    assert s1["dataset"] == "sharegpt"
    workload = e2e._scenario(s1, num_prompts=10, rate=4.0).workload
    assert workload.ignore_eos is True and not workload.stops_at_eos
    bad = s1.copy()
    bad["harness"] = "my-client"
    with pytest.raises(SpecError, match="unknown harness"):
        e2e._scenario(bad, num_prompts=10, rate=4.0)


def test_bench_serve_ignore_eos_flag(capsys: pytest.CaptureFixture[str]) -> None:
    serve = ("bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b")
    sharegpt = ("--dataset-name", "sharegpt", "--num-prompts", "200", "--json")
    fixed = ("--sharegpt-output-len", "300")
    code, out, _ = run_cli(capsys, *serve, *sharegpt, *fixed, "--ignore-eos")
    assert code == 0 and json.loads(out)["total_output_tokens"] == 200 * 300
    code, out, _ = run_cli(capsys, *serve, *sharegpt, *fixed, "--eos-model", "base")
    # base: E[min(300, G)] = (1 - (1 - h)^300) / h, about 204 of 300 tokens
    assert code == 0 and 0.6 < json.loads(out)["total_output_tokens"] / (200 * 300) < 0.75
    code, _, err = run_cli(capsys, *serve, *sharegpt, "--eos-model", "chat")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_a_scenario_sets_the_switch_through_the_python_api(tmp_path: Path) -> None:
    import simulator as sim

    def total(ignore_eos: str) -> int:
        path = tmp_path / f"eos_{ignore_eos}.yaml"
        path.write_text(
            "name: eos\nmodel: llama-3.1-8b\nreplicas: [{hardware: h100_sxm, engine: vllm}]\n"
            "workload: {dataset: {name: sharegpt}, num_prompts: 100, request_rate: 8, "
            f"eos_model: base, ignore_eos: {ignore_eos}}}\n"
        )
        return int(sim.run(sim.load_scenario(path)).summary["total_output_tokens"])

    assert 0.55 < total("null") / total("true") < 0.75
