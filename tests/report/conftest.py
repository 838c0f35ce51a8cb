"""A tiny run, saved as `llmsim run --out` saves it, shared by the report tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import scenario_data, write_yaml

from simulator.runs import runner

TINY_SCENARIO = scenario_data(
    input_len=256,
    output_len=32,
    range_ratio=0.5,
    num_prompts=40,
    request_rate=20,
    slo={"ttft_ms": 200, "tpot_ms": 30},
    seed=0,
)


@pytest.fixture(scope="session")
def tiny_scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_yaml(tmp_path_factory.mktemp("scenario") / "tiny.yaml", TINY_SCENARIO)


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory: pytest.TempPathFactory, tiny_scenario: Path) -> Path:
    """The tiny scenario's run folder (summary, requests, steps, ITL, scenario, memory)."""
    return runner.save_run(runner.run(tiny_scenario), tmp_path_factory.mktemp("run"))
