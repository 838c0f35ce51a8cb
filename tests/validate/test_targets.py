"""`llmsim validate --check`: suites against their documented goals and CI ceilings."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import run_cli

from simulator.errors import SpecError
from simulator.validate import targets
from simulator.validate.summary import SUITE_NAMES, UNIONS
from simulator.validate.targets import StatTarget, Targets, check_targets, load_targets, verdict


def stats(mape: float) -> dict[str, Any]:
    return {"n": 3, "mape_pct": mape, "median_ape_pct": mape, "p90_ape_pct": mape}


def summary(**by_suite: dict[str, float]) -> dict[str, Any]:
    """A `validate --json` object: per suite, MAPE per device."""
    return {
        "suites": {
            name: {**stats(max(d.values())), "by_device": {dev: stats(v) for dev, v in d.items()}}
            for name, d in by_suite.items()
        }
    }


def make_targets(**suites: dict[str, Any]) -> Targets:
    return Targets.model_validate({"suites": suites})


@pytest.mark.parametrize(
    ("value", "goal", "ceiling", "expected"),
    [
        (5.0, 10.0, 20.0, "meets goal"),
        (10.0, 10.0, 20.0, "meets goal"),  # equal to the goal meets it
        (10.1, 10.0, 20.0, "above goal"),
        (20.0, 10.0, 20.0, "above goal"),  # equal to the ceiling passes
        (20.1, 10.0, 20.0, "ABOVE CEILING"),
        (5.0, None, 20.0, "no goal"),
        (5.0, 10.0, None, "no ceiling"),
        (math.nan, 10.0, 20.0, "no data"),
        (None, 10.0, 20.0, "no data"),
    ],
)
def test_verdict_edges(
    value: float | None, goal: float | None, ceiling: float | None, expected: str
) -> None:
    assert verdict(value=value, goal=goal, ceiling=ceiling) == expected


def test_check_is_per_device_and_names_the_standing_of_each_suite() -> None:
    t = make_targets(
        ops={"mape_pct": {"goal": 12, "ceiling": {"a": 16, "b": 19}}},
        layers={"mape_pct": {"goal": 8, "ceiling": {"a": 16}}},
        power={"mape_pct": {"goal": None, "ceiling": {"a": 9}}},
    )
    result = check_targets(
        summary(ops={"a": 11.0, "b": 18.0}, layers={"a": 7.9}, power={"a": 6.0}), t
    )
    assert result.ok
    assert [(r.suite, r.device, r.verdict) for r in result.rows] == [
        ("ops", "a", "meets goal"),
        ("ops", "b", "above goal"),
        ("layers", "a", "meets goal"),
        ("power", "a", "no goal"),
    ]
    assert result.suites_by_standing() == {
        "meets goal": ["layers"],
        "above goal": ["ops"],
        "no goal": ["power"],
        "failed": [],
    }
    worse = check_targets(summary(ops={"a": 11.0, "b": 19.5}), t)
    assert not worse.ok and worse.suites_by_standing()["failed"] == ["ops"]


def test_a_suite_or_device_without_a_ceiling_fails_and_unions_are_skipped() -> None:
    t = make_targets(ops={"mape_pct": {"goal": 12, "ceiling": {"a": 16}}})
    result = check_targets(summary(ops={"a": 10.0, "new_gpu": 10.0}, layers={"a": 1.0}), t)
    assert [(r.suite, r.device, r.verdict) for r in result.rows if not r.ok] == [
        ("ops", "new_gpu", "no ceiling"),
        ("layers", "all", "no ceiling"),
    ]
    gone = check_targets(summary(ops={"b": 10.0}), t)  # device "a" has a ceiling but no rows
    assert ("a", "no data") in {(r.device, r.verdict) for r in gone.rows}
    union = next(iter(UNIONS))
    assert check_targets(summary(**{union: {"a": 99.0}}), t).rows == []


def test_committed_targets_cover_every_suite_and_keep_the_documented_goals() -> None:
    t = load_targets()
    suites = set(SUITE_NAMES) - set(UNIONS)
    assert set(t.suites) == suites
    assert t.suites["ops"]["mape_pct"].goal == 12 and t.suites["ops"]["median_ape_pct"].goal == 8
    assert t.suites["layers"]["mape_pct"].goal == 8
    for name in ("iteration_prefill", "iteration_decode"):  # set for Splitwise's DGX-A100
        assert t.suites[name]["mape_pct"].goal_for("a100_sxm_80gb") == 10
        assert t.suites[name]["mape_pct"].goal_for("h100_sxm") is None


def test_a_goal_set_for_some_devices_judges_only_those() -> None:
    t = StatTarget(goal={"a": 10}, ceiling={"a": 20, "b": 40})
    summary = {"suites": {"ops": {"by_device": {"a": {"mape_pct": 5.0}, "b": {"mape_pct": 30.0}}}}}
    result = check_targets(summary, Targets(suites={"ops": {"mape_pct": t}}))
    assert [(r.device, r.goal, r.verdict) for r in result.rows] == [
        ("a", 10, "meets goal"),
        ("b", None, "no goal"),
    ]
    assert result.ok and result.suites_by_standing()["meets goal"] == ["ops"]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"suites": {"opz": {"mape_pct": {"ceiling": {"a": 1}}}}}, "suites"),
        ({"suites": {"iteration": {"mape_pct": {"ceiling": {"a": 1}}}}}, "suites"),
        ({"suites": {"ops": {"mape": {"ceiling": {"a": 1}}}}}, "suites.ops.mape"),
        ({"suites": {"ops": {"mape_pct": {"ceiling": {}}}}}, "suites.ops.mape_pct.ceiling"),
        (
            {"suites": {"ops": {"mape_pct": {"goal": -1, "ceiling": {"a": 1}}}}},
            "suites.ops.mape_pct.goal",
        ),
        (
            {"suites": {"ops": {"mape_pct": {"goal": {"a": -1}, "ceiling": {"a": 1}}}}},
            "suites.ops.mape_pct.goal",
        ),
    ],
)
def test_bad_targets_file_is_a_spec_error(tmp_path: Path, data: Any, field: str) -> None:
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as info:
        load_targets(path)
    assert info.value.source == str(path) and info.value.field.startswith(field)


def test_cli_check_passes_then_fails_on_a_lowered_ceiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run_cli(capsys, "validate", "--suite", "iteration_decode", "--check")
    assert code == 0
    assert "meet their goal: iteration_decode" in out
    data = json.loads(
        run_cli(capsys, "validate", "--suite", "iteration_decode", "--check", "--json")[1]
    )
    row = data["check"]["rows"][0]
    assert data["check"]["ok"] and row["suite"] == "iteration_decode" and row["goal"] == 10
    assert (
        row["value"] == data["suites"]["iteration_decode"]["by_device"][row["device"]]["mape_pct"]
    )

    lowered = {"suites": {"iteration_decode": {"mape_pct": {"goal": 1, "ceiling": {}}}}}
    lowered["suites"]["iteration_decode"]["mape_pct"]["ceiling"] = {row["device"]: 1.0}
    (tmp_path / "targets.yaml").write_text(yaml.safe_dump(lowered))
    monkeypatch.setattr(targets, "TARGETS_PATH", tmp_path / "targets.yaml")
    code, out, _ = run_cli(capsys, "validate", "--suite", "iteration_decode", "--check")
    assert code == 1
    assert "ABOVE CEILING" in out and "FAILED" in out and "iteration_decode" in out
