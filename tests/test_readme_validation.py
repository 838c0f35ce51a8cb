"""tools/readme_validation.py: the validation tables of README.md and docs/validation.md are
rendered from `llmsim validate --json`, and `--check` fails when a committed block differs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool() -> ModuleType:
    path = ROOT / "tools" / "readme_validation.py"
    spec = importlib.util.spec_from_file_location("readme_validation", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _tool()


def _stats(n: int, mape: float) -> dict[str, Any]:
    spread = {"median_ape_pct": mape / 2, "p90_ape_pct": 2 * mape, "worst_ape_pct": 4 * mape}
    return {"n": n, "mape_pct": mape, **spread}


def _limits(
    suite: str, device: str, stat: str, goal: float | None, ceiling: float
) -> dict[str, Any]:
    return {"suite": suite, "device": device, "stat": stat, "goal": goal, "ceiling": ceiling}


def _suite(fitted: bool, **devices: dict[str, Any]) -> dict[str, Any]:
    n = sum(d["n"] for d in devices.values())
    return {**_stats(n, 10.0), "fitted": fitted, "by_device": devices}


SUMMARY = {
    "suites": {
        "ops": _suite(True, a100_sxm_80gb=_stats(1000, 9.74), h100_sxm=_stats(2000, 9.26)),
        "iteration": _suite(False, a100_sxm_80gb=_stats(20, 5.0)),
        "iteration_prefill": _suite(False, a100_sxm_80gb=_stats(10, 16.86)),
        "iteration_decode": _suite(False, a100_sxm_80gb=_stats(10, 1.74)),
        "e2e_serving": _suite(False, h100_sxm=_stats(8, 29.1)),
    },
    "check": {
        "rows": [
            _limits("ops", "a100_sxm_80gb", "mape_pct", 12.0, 13.0),
            _limits("ops", "a100_sxm_80gb", "median_ape_pct", 8.0, 9.0),
            _limits("e2e_serving", "h100_sxm", "mape_pct", None, 36.0),
        ]
    },
}


def test_unions_are_their_parts() -> None:
    assert tool.unions(SUMMARY["suites"]) == {"iteration"}


def test_headline_lists_suites_but_unions() -> None:
    text = tool.headline(SUMMARY)
    first = text.splitlines()[0]
    assert first.startswith("3,028 predictions against measurements in 4 suites (1 fitted, 3 held")
    assert "`e2e_serving` 10.0%" in first
    assert "| `ops` | 3,000 | 10.0% | 5.0% | fitted |" in text
    assert "| `iteration` |" not in text
    assert "`iteration`, the union of `iteration_prefill` and `iteration_decode`" in text


def test_by_device_shows_goal_and_ceiling() -> None:
    text = tool.by_device(SUMMARY)
    assert (
        "| `ops` | a100_sxm_80gb | 1,000 | 9.7 | 4.9 | 19.5 | 39 | fitted "
        "| 12 (median 8) | 13 (median 9) |"
    ) in text
    assert "| `ops` | h100_sxm | 2,000 | 9.3 | 4.6 | 18.5 | 37 | fitted | - | - |" in text
    assert "| `e2e_serving` | h100_sxm | 8 | 29.1 | 14.6 | 58.2 | 116 | held out | - | 36 |" in text
    assert "`iteration` |" not in text


def test_a_summary_without_check_shows_no_limits() -> None:
    plain = {"suites": SUMMARY["suites"]}
    assert "| fitted | - | - |" in tool.by_device(plain)


def test_replace_block_keeps_the_rest() -> None:
    text = "head\n<!-- x:begin -->\nold\n<!-- x:end -->\ntail\n"
    assert tool.replace_block(text, "x", "new", where=ROOT / "README.md") == (
        "head\n<!-- x:begin -->\nnew\n<!-- x:end -->\ntail\n"
    )
    with pytest.raises(SystemExit):
        tool.replace_block("no markers", "x", "new", where=ROOT / "README.md")


def test_check_fails_with_a_diff_then_passes_once_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readme, doc = tmp_path / "README.md", tmp_path / "docs" / "validation.md"
    doc.parent.mkdir()
    readme.write_text("# r\n<!-- validation:begin -->\n<!-- validation:end -->\n")
    doc.write_text("# v\n<!-- validation-by-device:begin -->\n<!-- validation-by-device:end -->\n")
    saved = tmp_path / "validate.json"
    saved.write_text(json.dumps(SUMMARY))
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    monkeypatch.setattr(tool, "README", readme)
    monkeypatch.setattr(tool, "VALIDATION_DOC", doc)

    assert tool.main(["--check", "--from", str(saved)]) == 1
    assert "+| `ops` | 3,000 |" in capsys.readouterr().out
    assert tool.main(["--from", str(saved)]) == 0
    assert tool.main(["--check", "--from", str(saved)]) == 0
    assert "| `ops` | a100_sxm_80gb |" in doc.read_text()


def test_the_committed_pages_have_their_markers() -> None:
    for path, marker in ((tool.README, tool.HEADLINE), (tool.VALIDATION_DOC, tool.BY_DEVICE)):
        text = path.read_text(encoding="utf-8")
        assert text.count(f"<!-- {marker}:begin -->") == 1
        assert text.count(f"<!-- {marker}:end -->") == 1
