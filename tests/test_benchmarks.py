"""The benchmark scripts' own logic (benchmarks/ is run by hand, not timed here): the speed
table that `make bench-doc` writes into docs/speed.md, and the Vidur comparison's workload."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """benchmarks/NAME.py as a module (its folder on sys.path, as when run)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


HOST = {
    "date": "2026-01-01 00:00 UTC",
    "cpu_model": "x",
    "cores": 2,
    "python": "3.11",
    "load_average": (1.0, 1.0, 1.0),
    "load_average_after": (1.0, 1.0, 1.0),
}


def run(cpu: float, inner: float, **extra: Any) -> dict[str, Any]:
    figures = {"cpu_s": cpu, "wall_s": cpu, "peak_mib": 200.0, "inner_cpu_s": inner}
    return figures | {"inner_wall_s": inner, "requests": 10, "steps": 20} | extra


def rows_of(block: str) -> dict[str, list[str]]:
    return {
        cells[0]: cells[1:]
        for line in block.splitlines()
        if line.startswith("| ") and not line.startswith("| what")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }


def test_the_in_process_target_is_judged_on_the_run_call_beside_the_whole_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bench = script("bench_serving", monkeypatch)
    labels = {"azure": "hour, in process", "azure-cli": "the same, CLI"}
    for inner, verdict in ((1.5, "(met)"), (2.1, "(not met)")):
        figures = {"azure": {"here": run(2.3, inner)}, "azure-cli": {"here": run(2.4, 0.0)}}
        rows = rows_of(bench.doc_block(HOST, figures, labels, 100, 3))
        call = rows["hour, in process: the `runner.run` call"]
        assert call[0] == f"{inner:.2f}" and call[-1] == f"<= 2 s CPU {verdict}"
        whole = rows["the same, the whole process (start-up included)"]
        assert whole[0] == "2.30" and whole[-1] == "-"  # no target of its own
        assert rows["the same, CLI"][-1] == "<= 3 s CPU (met)"


def test_the_million_is_judged_on_its_cpu_and_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = script("bench_serving", monkeypatch)
    labels = {"synthetic": "a million"}
    for mib, verdict in ((1500.0, "(met)"), (1950.0, "(not met)")):  # 2 GB is 1,907 MiB
        figures = {"synthetic": {"here": run(70.0, 69.0, peak_mib=mib)}}
        rows = rows_of(bench.doc_block(HOST, figures, labels, 1_000_000, 1))
        assert rows["a million"][-1] == f"<= 120 s CPU, < 2,000 MB {verdict}"


def test_write_doc_replaces_only_its_block(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bench = script("bench_serving", monkeypatch)
    page = tmp_path / "speed.md"
    page.write_text(f"head\n{bench.BEGIN}\nold\n{bench.END}\ntail\n")
    bench.write_doc(page, "new")
    assert page.read_text() == f"head\n{bench.BEGIN}\nnew\n{bench.END}\ntail\n"
    (tmp_path / "bare.md").write_text("no block\n")
    with pytest.raises(SystemExit, match=r"no .* block"):
        bench.write_doc(tmp_path / "bare.md", "new")


def test_llmsim_gets_the_arrival_rate_vidur_really_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vidur caps each exponential gap at 3 / qps, which raises its mean rate above qps."""
    vidur = script("bench_vidur", monkeypatch)
    setup = vidur.Setup(
        requests=10, input_len=1, output_len=1, rate=10.0, max_num_seqs=1, chunk=1,
        model="m", hardware="h", vidur_model="m", vidur_profile_model="m", vidur_device="d",
        vidur_network_device="n",
    )  # fmt: skip
    gaps = np.minimum(np.random.default_rng(0).exponential(1 / 10.0, 400_000), 3 / 10.0)
    assert vidur.llmsim_rate(setup) == pytest.approx(1 / gaps.mean(), rel=5e-3)


def test_both_scripts_head_their_tables_with_one_machine_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bench = script("bench_serving", monkeypatch)
    vidur = script("bench_vidur", monkeypatch)
    host = HOST | {"load_average": (0.5, 0.25, 0.125), "load_average_after": (2.0, 1.0, 0.0)}
    line = bench.machine_line(host, "least CPU of 3")
    assert line == (
        "2026-01-01 00:00 UTC; x, 2 cores; Python 3.11; load average (1/5/15 min) "
        "0.50/0.25/0.12 before, 2.00/1.00/0.00 after; least CPU of 3"
    )
    assert vidur.machine_line is bench.machine_line  # one function, not a copy
