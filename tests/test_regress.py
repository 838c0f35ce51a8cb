"""`llmsim regress`: tolerance bands, the golden file, check / --update through the CLI, the
project's own grid, and the pytest plugin as a user's test suite would use it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import run_cli
from factories import scenario_data, write_yaml
from hypothesis import given
from hypothesis import strategies as st

from simulator import regress
from simulator.cli.inprocess import run_command
from simulator.regress.check import band_of
from simulator.regress.golden import ScenarioCase, load_golden
from simulator.specs import load_model

pytest_plugins = ["pytester"]

# A case that runs in milliseconds: one GEMM on an H100.
GEMM_FLAGS = {"hardware": "h100_sxm", "m": 1024, "n": 1024, "k": 1024}
GEMM = {"name": "gemm", "op": "gemm", "flags": GEMM_FLAGS}


def recorded(tmp_path: Path, *cases: dict[str, Any], **top: Any) -> Path:
    """A golden file of `cases` whose values `--update` has just recorded."""
    path = write_yaml(tmp_path / "regress.yaml", {**top, "cases": list(cases)})
    regress.update(path, run=run_command)
    return path


def perturb(path: Path, case: int, metric: str, factor: float) -> float:
    """Scale one golden value in place; returns the new value."""
    data = yaml.safe_load(path.read_text())
    entry = data["cases"][case]["metrics"]
    value = entry[metric]["value"] if isinstance(entry[metric], dict) else entry[metric]
    new = value * factor
    if isinstance(entry[metric], dict):
        entry[metric]["value"] = new
    else:
        entry[metric] = new
    write_yaml(path, data)
    return float(new)


# -- bands ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("now", "ok"), [(125.0, True), (75.0, True), (125.00001, False), (74.99999, False)]
)
def test_relative_band_edges_are_inside(now: float, ok: bool) -> None:
    # 100 with rtol 0.25: the band is [75, 125], both ends in.
    assert regress.Band(rtol=0.25, atol=0.0).contains(now=now, golden=100.0) is ok


@pytest.mark.parametrize(("now", "ok"), [(0.5, True), (-0.5, True), (0.50001, False)])
def test_absolute_band_holds_around_zero(now: float, ok: bool) -> None:
    # A relative band around 0 has no width; atol gives it one.
    assert regress.Band(rtol=0.5, atol=0.5).contains(now=now, golden=0.0) is ok
    assert not regress.Band(rtol=0.5, atol=0.0).contains(now=1e-12, golden=0.0)


def test_bands_add_and_use_the_golden_magnitude() -> None:
    band = regress.Band(rtol=0.125, atol=0.5)  # around 8: 0.5 + 0.125 * 8 = 1.5
    assert band.contains(now=9.5, golden=8.0) and band.contains(now=6.5, golden=8.0)
    assert not band.contains(now=9.5001, golden=8.0)
    assert band.contains(now=-9.5, golden=-8.0) and not band.contains(now=-9.5001, golden=-8.0)


@given(
    golden=st.floats(1e-9, 1e9) | st.floats(-1e9, -1e-9),
    r=st.floats(-0.99, 0.99),
    rtol=st.sampled_from([1e-4, 0.01, 0.3]),
)
def test_inside_a_fraction_of_the_band_passes_and_beyond_it_fails(
    golden: float, r: float, rtol: float
) -> None:
    band = regress.Band(rtol=rtol, atol=0.0)
    assert band.contains(now=golden * (1 + r * rtol), golden=golden)
    assert not band.contains(now=golden * (1 + 1.01 * rtol), golden=golden)
    assert not band.contains(now=golden * (1 - 1.01 * rtol), golden=golden)


def test_strings_booleans_and_nan_match_exactly() -> None:
    band = regress.Band(rtol=0.5, atol=1.0)
    assert regress.matches(now="compute", golden="compute", band=band)
    assert not regress.matches(now="memory", golden="compute", band=band)
    assert not regress.matches(now=True, golden=1, band=band)  # a boolean is not a number here
    assert not regress.matches(now=None, golden=1.0, band=band)
    assert regress.Band(rtol=0.0, atol=0.0).contains(now=math.nan, golden=math.nan)
    assert not band.contains(now=math.nan, golden=1.0)


def test_band_labels() -> None:
    assert regress.Band(rtol=0.01, atol=0.0).label() == "±1%"
    assert regress.Band(rtol=0.0, atol=0.5).label() == "±0.5"
    assert regress.Band(rtol=0.02, atol=3.0).label() == "±2% + 3"
    assert regress.Band(rtol=0.0, atol=0.0).label() == "±0"


# -- the golden file ------------------------------------------------------------------------------
def test_metric_shorthands_and_band_inheritance(tmp_path: Path) -> None:
    case = {
        **GEMM,
        "atol": 1.0,
        "metrics": {"a": 0.5, "b": {"value": 2.0, "rtol": 0.5}, "c": None, "d": {"atol": 0}},
    }
    golden = load_golden(write_yaml(tmp_path / "g.yaml", {"rtol": 0.02, "cases": [case]}))
    c = golden.cases[0]
    assert {k: m.value for k, m in c.metrics.items()} == {"a": 0.5, "b": 2.0, "c": None, "d": None}
    bands = {k: band_of(m, c, golden) for k, m in c.metrics.items()}
    assert bands["a"] == regress.Band(rtol=0.02, atol=1.0)  # file rtol, case atol
    assert bands["b"] == regress.Band(rtol=0.5, atol=1.0)  # its own rtol
    assert bands["d"] == regress.Band(rtol=0.02, atol=0.0)  # its own atol
    listed = load_golden(
        write_yaml(tmp_path / "l.yaml", {"cases": [{**GEMM, "metrics": ["x", "y"]}]})
    )
    assert list(listed.cases[0].metrics) == ["x", "y"]
    assert band_of(listed.cases[0].metrics["x"], listed.cases[0], listed) == regress.Band(
        rtol=0.01, atol=0.0
    )


BAD_GOLDENS = [
    ({"cases": []}, "cases"),
    ({"cases": [{"name": "x", "flags": {}}]}, "cases.0: a case names exactly one of"),
    ({"cases": [{**GEMM, "bench": "latency"}]}, "cases.0: a case names exactly one of"),
    ({"rtol": -1, "cases": [GEMM]}, "rtol"),
    ({"cases": [{**GEMM, "colour": "red"}]}, "unknown field"),
    ({"cases": [GEMM, GEMM]}, "repeated: gemm"),
    ({"cases": [{**GEMM, "op": "conv"}]}, "cases.0.op.op"),
    ({"cases": [{**GEMM, "metrics": {".x": 1.0}}]}, "dotted path"),
    ({"cases": [{**GEMM, "flags": {"hardware": "h100_sxm", "bogus": 1}}]}, "--bogus"),
    ({"cases": [{**GEMM, "flags": {"hardware": "h999", "m": 1, "n": 1, "k": 1}}]}, "h999"),
    ({"cases": [{"name": "s", "scenario": "nowhere.yaml"}]}, "nowhere.yaml"),
]


@pytest.mark.parametrize(("data", "reason"), BAD_GOLDENS)
def test_bad_golden_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict[str, Any], reason: str
) -> None:
    path = write_yaml(tmp_path / "regress.yaml", data)
    for extra in ([], ["--update"]):
        code, out, err = run_cli(capsys, "regress", str(path), *extra)
        assert code == 2, err
        assert out == ""
        assert err.count("\n") == 1 and err.startswith(f"llmsim: error: {path}")
        assert reason in err


def test_malformed_or_missing_golden_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.yaml").write_text("cases: [\n")
    code, _, err = run_cli(capsys, "regress", str(tmp_path / "bad.yaml"))
    assert code == 2 and "malformed YAML" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "regress", str(tmp_path / "none.yaml"))
    assert code == 2 and "no such golden file" in err
    code, _, err = run_cli(capsys, "regress", str(tmp_path))
    assert code == 2 and f"{tmp_path}: is a folder; give the golden YAML file" in err


# -- check and --update through the CLI -----------------------------------------------------------
def test_perturbed_golden_exits_1_and_the_diff_names_the_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    latency = {
        "name": "lat",
        "bench": "latency",
        "flags": {"model": "llama-3.1-8b", "hardware": "h100_sxm", "batch-size": 4},
        "metrics": ["ttft_s", "tpot_s"],
    }
    path = recorded(tmp_path, GEMM, latency, rtol=0.01)
    assert run_cli(capsys, "regress", str(path))[0] == 0
    perturb(path, 1, "tpot_s", 1.05)  # 5% off, band 1%
    code, out, _ = run_cli(capsys, "regress", str(path))
    assert code == 1
    fail_lines = [line for line in out.splitlines() if "│ FAIL" in line]
    assert len(fail_lines) == 1 and "tpot_s" in fail_lines[0] and "-4.76%" in fail_lines[0]
    assert "1 of 3 metrics left their band: lat/tpot_s (FAIL)" in " ".join(out.split())


def test_change_within_the_band_passes(tmp_path: Path) -> None:
    path = recorded(tmp_path, {**GEMM, "rtol": 0.02})
    perturb(path, 0, "latency_s", 1.019)
    assert regress.check(path, run=run_command).ok
    perturb(path, 0, "latency_s", 1.01)  # now 2.9% off
    assert not regress.check(path, run=run_command).ok


def test_update_round_trips_and_keeps_bands(tmp_path: Path) -> None:
    case = {**GEMM, "atol": 1e-9, "metrics": {"latency_s": {"rtol": 0.5}, "flops": None}}
    path = write_yaml(tmp_path / "regress.yaml", {"rtol": 0.02, "cases": [case]})
    before = regress.check(path, run=run_command)
    assert [r.status for r in before.rows] == ["new", "new"] and not before.ok
    report = regress.update(path, run=run_command)
    assert report.updated and [r.status for r in report.rows] == ["new", "new"]
    golden = load_golden(path)
    metrics = golden.cases[0].metrics
    assert metrics["flops"].value == 2 * 1024**3  # 2 m n k, an exact integer
    assert metrics["latency_s"].rtol == 0.5 and golden.rtol == 0.02
    assert golden.cases[0].atol == 1e-9
    after = regress.check(path, run=run_command)
    assert after.ok and [r.now for r in after.rows] == [r.now for r in report.rows]
    text = path.read_text()
    regress.update(path, run=run_command)
    assert path.read_text() == text  # a second update changes nothing


def test_a_case_without_metrics_fails_until_updated(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "regress.yaml", {"cases": [GEMM]})
    rows = regress.check(path, run=run_command).rows
    assert [(r.metric, r.status) for r in rows] == [("(no metrics)", "new")]
    regress.update(path, run=run_command)
    assert regress.check(path, run=run_command).ok


def test_update_gives_a_new_case_its_default_metrics(tmp_path: Path) -> None:
    cases = [
        {
            "name": "bench",
            "bench": "latency",
            "flags": {"model": "llama-3.1-8b", "hardware": "a100_sxm_80gb"},
        },
        GEMM,
    ]
    path = recorded(tmp_path, *cases)
    golden = load_golden(path)
    assert list(golden.cases[0].metrics) == ["avg_latency", "ttft_s", "tpot_s"]
    assert list(golden.cases[1].metrics) == ["latency_s"]
    assert all(isinstance(m.value, float) and m.value > 0 for m in golden.cases[0].metrics.values())


def test_a_metric_the_output_lacks_fails_and_update_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(tmp_path / "regress.yaml", {"cases": [{**GEMM, "metrics": {"nope": 1.0}}]})
    assert regress.check(path, run=run_command).rows[0].status == "missing"
    assert run_cli(capsys, "regress", str(path))[0] == 1
    code, _, err = run_cli(capsys, "regress", str(path), "--update")
    assert code == 2 and "cases.0.metrics" in err and "'nope'" in err


def test_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = recorded(tmp_path, {**GEMM, "metrics": ["latency_s", "bound", "flops"]})
    code, out, _ = run_cli(capsys, "regress", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] and not data["updated"]
    assert (data["num_cases"], data["num_metrics"], data["num_failed"]) == (1, 3, 0)
    row = data["rows"][0]
    assert set(row) == {"case", "metric", "golden", "now", "change_pct", "rtol", "atol", "status"}
    assert data["rows"][1]["now"] == "compute" and data["rows"][1]["change_pct"] is None


def test_scenario_case_is_relative_to_the_golden_file(tmp_path: Path) -> None:
    scenario = scenario_data(input_len=256, output_len=16, num_prompts=20, request_rate=4)
    (tmp_path / "sub").mkdir()
    write_yaml(tmp_path / "sub" / "tiny.yaml", scenario)
    path = recorded(tmp_path, {"name": "tiny", "scenario": "sub/tiny.yaml"})
    golden = load_golden(path)
    assert golden.cases[0].metrics["request_throughput"].value == pytest.approx(4, rel=0.5)
    assert regress.check(path, run=run_command).ok


def test_flags_become_the_command_line() -> None:
    from simulator.regress.cases import flag_args

    flags = {"batch_size": 8, "enforce-eager": True, "enable-chunked-prefill": False}
    flags |= {"goodput": ["ttft:100", "tpot:50"], "quantization": None, "request-rate": math.inf}
    assert flag_args(flags) == [  # type: ignore[arg-type]
        "--batch-size", "8", "--enforce-eager", "--no-enable-chunked-prefill",
        "--goodput", "ttft:100", "--goodput", "tpot:50", "--request-rate", "inf",
    ]  # fmt: skip


def test_default_golden_is_the_current_directorys_then_the_projects(tmp_path: Path) -> None:
    assert regress.default_golden(tmp_path) == regress.PROJECT_GOLDEN
    write_yaml(tmp_path / "regress.yaml", {"cases": [GEMM]})
    assert regress.default_golden(tmp_path) == tmp_path / "regress.yaml"


@pytest.mark.slow  # the project's golden grid, twice (about 3-5 s)
def test_project_grid_is_deterministic() -> None:
    golden = regress.PROJECT_GOLDEN
    first, second = regress.check(golden, run=run_command), regress.check(golden, run=run_command)
    assert len(first.rows) >= 50
    assert [(r.case, r.metric, r.now) for r in first.rows] == [
        (r.case, r.metric, r.now) for r in second.rows
    ]


def test_project_grid_covers_the_kinds_families_and_an_moe_model() -> None:
    from simulator.regress.cases import kind

    cases = load_golden(regress.PROJECT_GOLDEN).cases
    assert {"op gemm", "op attention", "op allreduce", "scenario"} <= {kind(c) for c in cases}
    assert {"bench latency", "bench throughput", "bench serve"} <= {kind(c) for c in cases}
    serve = [c.flags for c in cases if kind(c) == "bench serve" and not isinstance(c, ScenarioCase)]
    assert {f["hardware"] for f in serve} >= {"h100_sxm", "a100_sxm_80gb", "mi300x"}
    assert {f.get("engine", "vllm") for f in serve} >= {"vllm", "sglang", "trtllm"}
    models = [load_model(str(c.flags["model"])) for c in cases if kind(c).startswith("bench")]
    assert any(m.num_active_params < m.num_params for m in models)  # a mixture of experts


# -- the pytest plugin, as a user's test suite sees it --------------------------------------------
def test_plugin_check_passes_then_fails_with_the_diff(pytester: pytest.Pytester) -> None:
    path = recorded(pytester.path, GEMM)
    pytester.makepyfile(
        "def test_golden(llmsim_regress):\n    llmsim_regress.check('regress.yaml')\n"
    )
    pytester.runpytest().assert_outcomes(passed=1)
    perturb(path, 0, "latency_s", 1.5)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*gemm*latency_s*-33.3%*±1%*FAIL*", "*1 of 1 metrics left*"])
    result.stdout.no_fnmatch_line("*Traceback*")


def test_plugin_update_option_rewrites_the_golden(pytester: pytest.Pytester) -> None:
    path = recorded(pytester.path, GEMM)
    right = load_golden(path).cases[0].metrics["latency_s"].value
    perturb(path, 0, "latency_s", 3.0)
    pytester.makepyfile(
        "def test_golden(llmsim_regress):\n    llmsim_regress.check('regress.yaml')\n"
    )
    pytester.runpytest("--llmsim-update").assert_outcomes(passed=1)
    assert load_golden(path).cases[0].metrics["latency_s"].value == right
    pytester.runpytest().assert_outcomes(passed=1)


def test_plugin_assert_within_and_bad_golden(pytester: pytest.Pytester) -> None:
    (pytester.path / "broken.yaml").write_text("cases: []\n")
    pytester.makepyfile(
        """
        import simulator

        def test_inside(llmsim_regress):
            ttft = simulator.estimate(model="llama-3.1-8b", hardware="h100_sxm").ttft_s
            llmsim_regress.assert_within(ttft, ttft * 1.04, rtol=0.05, name="ttft_s")

        def test_outside(llmsim_regress):
            llmsim_regress.assert_within(1.2, 1.0, rtol=0.1, name="ttft_s")

        def test_broken(llmsim_regress):
            llmsim_regress.check("broken.yaml")
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        ["*ttft_s*1*1.2*+20%*±10%*FAIL*", "*ttft_s = 1.2 is outside 1.0 ±10%*"]
    )
    result.stdout.fnmatch_lines(["*llmsim: error: *broken.yaml: cases: *"])
