"""The error bands' residuals: from the end-to-end rows, the committed file, its staleness
check and the held-out coverage of the bands (`llmsim validate --write-bands | --check`)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from clitools import run_cli

from simulator.metrics.bands import Residual, group_band, load_residuals, parse_residuals
from simulator.validate import bands
from simulator.validate.summary import summarize
from simulator.validate.targets import CheckResult

# The end-to-end row each family comes from (suite, kind, metric), as the suites write them.
LATENCY_METRIC = {v: k for k, v in bands.LATENCY_FAMILIES.items()}


MODEL_OF = {"dense": "llama-3.1-8b", "moe": "qwen3-30b-a3b"}  # a model of each family
# The `kind` of each family's rows in the suites that name it there.
SUITE_KIND = {
    "e2e_serving": {"ttft": "ttft", "tpot": "tpot"},
    "e2e_serving_curve": {"ttft": "ttft", "tpot": "itl"},
    "e2e_energy": {"tpot": "itl", "throughput": "throughput"},
}


def frame_of(rows: tuple[Residual, ...]) -> pd.DataFrame:
    """End-to-end suite rows (predicted 1 s) whose residuals are `rows`."""
    out = []
    for r in rows:
        kind: Any = SUITE_KIND.get(r.suite, {}).get(r.family, "batch")
        if r.suite == "e2e_throughput":
            kind = r.engine_family  # throughput rows name the engine in `kind`
        out.append(
            {
                "suite": r.suite,
                "device": r.device,
                "kind": kind,
                "case": r.case,
                "predicted_s": 1.0,
                "measured_s": math.exp(r.log_ratio),
                "ape_pct": 100 * abs(math.exp(r.log_ratio) - 1),
                "fitted": False,
                "source": r.source,
                "engine": None if r.suite == "e2e_throughput" else r.engine_family,
                "metric": LATENCY_METRIC.get(r.family) if r.suite == "e2e_latency" else None,
                "model": MODEL_OF[r.model_family],
            }
        )
    return pd.DataFrame(out)


def test_residuals_label_each_end_to_end_row() -> None:
    df = pd.DataFrame(
        [
            ("e2e_serving", "h100_sxm", "ttft", "a", 0.1, 0.2, "sglang-0.3", None),
            ("e2e_serving", "h100_sxm", "tpot", "b", 0.1, 0.1, "vllm-0.6", None),
            ("e2e_latency", "mi300x", "batch", "c", 2.0, 1.0, "vllm", "latency_ms"),
            ("e2e_latency", "l40s", "first_token", "d", 1.0, 1.0, "trtllm-0.6", "first_token_ms"),
            (
                "e2e_latency",
                "l40s",
                "batch",
                "e",
                1.0,
                1.0,
                "trtllm-0.6",
                "output_tokens_per_s_per_gpu",
            ),
            ("e2e_throughput", "b200", "trtllm", "f", 1.0, 1.0, None, None),
            ("e2e_throughput", "b200", "trtllm", "g", 1.0, 1.0, None, None),
            ("ops", "h100_sxm", "gemm", "h", 1.0, 1.0, None, None),
        ],
        columns=[
            "suite",
            "device",
            "kind",
            "case",
            "predicted_s",
            "measured_s",
            "engine",
            "metric",
        ],
    ).assign(fitted=False, source="S9", model="llama-3.1-8b")
    df.loc[6, "fitted"] = True  # a fitted row never backs a band
    df.loc[5, "model"] = "qwen3-30b-a3b"  # routed experts: the MoE family
    got = {r.case: r for r in bands.residuals(df)}
    assert set(got) == set("abcdef")
    assert (got["a"].family, got["a"].regime, got["a"].engine_family) == (
        "ttft",
        "online",
        "sglang",
    )
    assert got["a"].log_ratio == pytest.approx(math.log(2), abs=1e-5)
    assert (got["b"].family, got["b"].engine_family) == ("tpot", "vllm")
    assert (got["c"].family, got["c"].regime, got["c"].device_family) == (
        "latency",
        "offline",
        "amd",
    )
    assert got["c"].log_ratio == pytest.approx(-math.log(2), abs=1e-5)
    assert (got["d"].family, got["d"].engine_family) == ("ttft", "trtllm")
    assert got["e"].family == "throughput"
    assert (got["f"].family, got["f"].engine_family, got["f"].regime) == (
        "throughput",
        "trtllm",
        "offline",
    )
    assert got["f"].model_family == "moe"
    assert {got[c].model_family for c in "abcde"} == {"dense"}


def test_served_curves_and_energy_runs_are_labelled_and_power_is_left_out() -> None:
    df = pd.DataFrame(
        [
            ("e2e_serving_curve", "mi300x", "ttft", "a", 1.0, 3.0, "sglang-0.4", "deepseek-v3"),
            ("e2e_serving_curve", "mi300x", "itl", "b", 1.0, 2.0, "vllm-0.7", "deepseek-v3"),
            ("e2e_energy", "b200", "itl", "70b b8 itl", 1.0, 1.0, "vllm-0.11", "llama-3.1-70b"),
            ("e2e_energy", "b200", "itl", "70b b8 itl", 1.0, 1.1, "vllm-0.11", "llama-3.1-70b"),
            ("e2e_energy", "b200", "throughput", "e", 1.0, 1.0, "vllm-0.11", "llama-3.1-8b"),
            ("e2e_energy", "b200", "power", "f", 1.0, 1.0, "vllm-0.11", "llama-3.1-8b"),
        ],
        columns=["suite", "device", "kind", "case", "predicted_s", "measured_s", "engine", "model"],
    ).assign(
        fitted=False,
        source="S9",
        checkpoint=["x", "x", "meta/L-3.1", "meta/L-3.3", "x", "x"],
        simulated_prompts=1024,
    )
    got = {r.case: r for r in bands.residuals(df)}
    assert set(got) == {
        "a",
        "b",
        "e",
        "70b b8 itl (meta/L-3.1, 1024 prompts)",  # two checkpoints, one simulated model
        "70b b8 itl (meta/L-3.3, 1024 prompts)",
    }  # power has no band
    assert (got["a"].family, got["a"].regime, got["a"].model_family) == ("ttft", "online", "moe")
    assert (got["b"].family, got["b"].regime, got["b"].device_family) == ("tpot", "online", "amd")
    energy_itl = got["70b b8 itl (meta/L-3.3, 1024 prompts)"]
    assert (energy_itl.family, energy_itl.regime) == ("tpot", "online")
    assert energy_itl.log_ratio == pytest.approx(math.log(1.1), abs=1e-5)
    assert (got["e"].family, got["e"].regime) == ("throughput", "offline")


def test_a_group_splits_by_model_family_first() -> None:
    def rows(model: str, n: int, r: float) -> list[Residual]:
        return [
            Residual(
                "tpot", "online", "s", "S", "h100_sxm", "nvidia", "vllm", f"{model}{i}", r, model
            )
            for i in range(n)
        ]

    pool = rows("dense", 12, 0.1) + rows("moe", 12, 0.5)
    split = {"device_family": "nvidia", "engine_family": "vllm", "coverage": 0.8}
    moe = group_band(pool, family="tpot", regime="online", model_family="moe", **split)
    dense = group_band(pool, family="tpot", regime="online", model_family="dense", **split)
    both = group_band(pool, family="tpot", regime="online", **split)
    assert moe is not None and dense is not None and both is not None
    assert (moe.label, moe.low, moe.high) == ("tpot, online, moe, nvidia, vllm", 0.5, 0.5)
    assert (dense.low, dense.high) == (0.1, 0.1)
    assert both.label == "tpot, online, nvidia, vllm" and len(both.rows) == 24
    # too few rows of the model family: the rows of every model family
    thin = group_band(pool[:12] + pool[12:15], family="tpot", regime="online",
                      model_family="moe", **split)  # fmt: skip
    assert thin is not None and len(thin.rows) == 15


def test_a_device_with_ten_rows_gets_its_own_band_not_its_vendors() -> None:
    def rows(device: str, n: int, r: float) -> list[Residual]:
        return [
            Residual("throughput", "offline", "s", "S", device, "nvidia", "vllm", f"{device}{i}", r)
            for i in range(n)
        ]

    pool = rows("h100_sxm", 12, 0.1) + rows("b200", 12, 0.9)
    split = {"device_family": "nvidia", "engine_family": "vllm", "coverage": 0.8}
    h100 = group_band(pool, family="throughput", regime="offline", hardware="h100_sxm", **split)
    a100 = group_band(
        pool, family="throughput", regime="offline", hardware="a100_sxm_80gb", **split
    )
    assert h100 is not None and a100 is not None
    assert (h100.label, h100.low, h100.high) == ("throughput, offline, h100_sxm, vllm", 0.1, 0.1)
    assert a100.label == "throughput, offline, nvidia, vllm" and len(a100.rows) == 24


def test_the_committed_file_round_trips_through_its_frame() -> None:
    committed = load_residuals()
    assert bands.residuals(frame_of(committed)) == committed
    text = bands.bands_text(committed)
    assert parse_residuals(yaml.safe_load(text), source="x") == committed
    assert text.startswith("# Error bands of llmsim's predictions")


def test_write_bands_writes_what_load_reads(tmp_path: Path) -> None:
    rows = load_residuals()[:5]
    path = bands.write_bands(rows, tmp_path / "bands.yaml")
    assert load_residuals(path) == rows


# -- staleness ------------------------------------------------------------------------------------
def test_check_bands_names_each_row_that_moved_appeared_vanished_or_changed_group() -> None:
    committed = load_residuals()
    assert bands.check_bands(committed, committed).ok
    first, second, third = committed[:3]
    nudged = replace(first, log_ratio=first.log_ratio + 0.004)  # within TOLERANCE
    moved = replace(second, log_ratio=second.log_ratio + 0.02)
    relabelled = replace(third, regime="offline" if third.regime == "online" else "online")
    new = replace(first, case="a new case")
    current = (nudged, moved, relabelled, *committed[4:], new)
    check = bands.check_bands(current, committed)
    assert not check.ok
    name = f"{second.suite} / {second.device} / {second.case}"
    assert check.moved == [(name, second.log_ratio, second.log_ratio + 0.02)]
    assert check.added == [f"{new.suite} / {new.device} / a new case"]
    assert check.missing == [
        " / ".join((committed[3].suite, committed[3].device, committed[3].case))
    ]
    assert check.relabelled == [f"{third.suite} / {third.device} / {third.case}"]
    assert len(check.lines()) == 4


def test_validate_check_fails_when_the_committed_bands_are_stale(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The end-to-end rows as committed, predicted again; one moves by 3%.
    df = frame_of(load_residuals())
    monkeypatch.setattr(
        "simulator.validate.summary.run_validation", lambda suites=None, **_: (summarize(df), df)
    )
    monkeypatch.setattr(
        "simulator.validate.targets.check_targets", lambda summary, targets: CheckResult([])
    )
    code, out, _ = run_cli(capsys, "validate", "--check")
    assert code == 0, out
    assert "error_bands.yaml matches today's predictions" in " ".join(out.split())
    df.loc[0, "measured_s"] *= 1.03
    code, out, _ = run_cli(capsys, "validate", "--check")
    flat = " ".join(out.split())
    assert code == 1
    assert f"moved: {df.loc[0, 'suite']} / {df.loc[0, 'device']} / {df.loc[0, 'case']}" in flat
    assert "is stale: rewrite it with `llmsim validate --write-bands`" in flat
    code, out, _ = run_cli(capsys, "validate", "--check", "--json")
    assert code == 1
    verdict = json.loads(out)["bands_check"]
    assert verdict["ok"] is False and verdict["coverage"]["ok"] is True


# -- held-out coverage ----------------------------------------------------------------------------
def test_covered_leaves_the_row_or_its_source_out() -> None:
    def row(r: float, source: str) -> Residual:
        return Residual(
            "ttft", "offline", "e2e_latency", source, "h100_sxm", "nvidia", "vllm", f"{r}", r
        )

    # 11 rows 0.00 .. 0.10 and an outlier: leave-one-out covers the middle rows only
    rows = (*(row(0.01 * k, "A") for k in range(11)), row(1.0, "B"))
    got = bands.covered(rows, coverage=0.8, holdout="row")
    assert got[0] is False and got[-1] is False and all(got[1:11])
    # without source A's rows, only the outlier is left: its range, a point
    by_source = bands.covered(rows, coverage=0.8, holdout="source")
    assert by_source == [False] * 11 + [False]


def test_the_80_percent_bands_cover_75_to_85_percent_of_held_out_rows() -> None:
    section = bands.coverage_section(load_residuals(), coverage=0.8)
    families = section["families"]
    assert 0.75 <= families["all"]["loo_coverage"] <= 0.85
    assert families["all"]["n"] == sum(
        families[f]["n"] for f in ("ttft", "tpot", "latency", "throughput")
    )
    for name, entry in families.items():
        low, high = bands.accepted_range(0.8, None if name == "all" else entry["n"])
        assert low <= entry["loo_coverage"] <= high, (name, entry)
        assert entry["ok"]
    # the families with many rows meet the stated range itself
    for name in ("latency", "throughput"):
        assert 0.75 <= families[name]["loo_coverage"] <= 0.85, name
    assert all(g["n"] >= 8 for g in section["groups"].values())


def test_accepted_range_widens_a_small_family_by_one_row() -> None:
    assert bands.accepted_range(0.8) == pytest.approx((0.75, 0.85))
    assert bands.accepted_range(0.8, 8) == pytest.approx((0.625, 0.975))
