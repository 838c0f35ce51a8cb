"""The CPU work between steps of engines without an overlap scheduler, pinned on the published
figures the profiles derive it from (the sources are named in each profile's YAML)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.runs.runner import run
from simulator.specs import load_engine

ENGINE_DIR = Path(__file__).resolve().parents[2] / "simulator" / "specs" / "engines"

# sglang PR #5608: Llama-3.1-8B TP4 decode at 16 running requests, gen throughput (tok/s) with
# the normal loop and with the overlap loop.
PR5608_NORMAL, PR5608_OVERLAP, PR5608_RUNNING = 3053.86, 3458.31, 16
# sglang PR #1738 and LMSYS's v0.4 blog: the overlap loop serves 1.1x the normal loop's rate.
PR1738_SPEEDUP = 1.10


def _cpu(engine_id: str, running: int) -> float:
    ov = load_engine(engine_id).overhead
    return ov.step_s + ov.per_seq_s * running


def test_sglang_03_exposes_pr5608s_gap_at_16_requests() -> None:
    """What a 16-request decode step of sglang-0.3's loop costs on the CPU over the overlapped
    residual (`sglang`) is the step time PR #5608 measured the normal loop to add: 0.613 ms."""
    measured = PR5608_RUNNING / PR5608_NORMAL - PR5608_RUNNING / PR5608_OVERLAP
    gap = _cpu("sglang-0.3", PR5608_RUNNING) - _cpu("sglang", PR5608_RUNNING)
    assert measured == pytest.approx(0.613e-3, abs=0.5e-6)
    assert gap == pytest.approx(measured, rel=0.02)


def test_sglang_03_costs_more_cpu_per_step_than_04_at_every_batch() -> None:
    """0.4's overlap scheduler hides what 0.3's loop pays between steps (LMSYS, v0.4 blog)."""
    for running in (1, 16, 256, 2048):
        assert _cpu("sglang-0.3", running) > 2 * _cpu("sglang-0.4", running)


def _scenario(tmp_path: Path, engine: Path) -> Path:
    """PR #1738's benchmark: Llama-3.1-8B-Instruct, 3,000 ShareGPT prompts sent at once
    (`sglang.bench_serving --num-prompt 3000`), radix cache off, on one H100."""
    path = tmp_path / f"pr1738_{engine.stem}.yaml"
    path.write_text(
        "name: pr1738\nmodel: llama-3.1-8b\nreplicas:\n"
        f"  - {{hardware: h100_sxm, engine: {engine}, enable_prefix_caching: false}}\n"
        "workload:\n  dataset: {name: sharegpt}\n  num_prompts: 3000\nseed: 0\n"
    )
    return path


@pytest.mark.slow  # two 3,000-request runs (about 6 s of simulation each)
def test_sglang_03_loop_serves_pr1738s_benchmark_a_tenth_slower(tmp_path: Path) -> None:
    """The same profile with the `sglang` profile's overlapped CPU costs (PR #1738's overlap
    mode, on the 0.3 line) serves the benchmark 1.10x as fast as sglang-0.3 (its normal mode)."""
    overlapped = load_engine("sglang").overhead
    overlap = tmp_path / "overlap.yaml"
    overlap.write_text(
        f"base: {ENGINE_DIR / 'sglang-0.3.yaml'}\n"
        f"overhead: {{step_s: {overlapped.step_s!r}, per_seq_s: {overlapped.per_seq_s!r}}}\n"
    )
    normal = tmp_path / "normal.yaml"
    normal.write_text(f"base: {ENGINE_DIR / 'sglang-0.3.yaml'}\n")
    fast = run(_scenario(tmp_path, overlap)).summary["request_throughput"]
    slow = run(_scenario(tmp_path, normal)).summary["request_throughput"]
    assert fast / slow == pytest.approx(PR1738_SPEEDUP, abs=0.01)
