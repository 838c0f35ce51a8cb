"""A tiny run, saved as `llmsim run --out` saves it, shared by the report tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator import runner

TINY_SCENARIO = {
    "name": "tiny",
    "model": "llama-3.1-8b",
    "replicas": [{"hardware": "h100_sxm", "engine": "vllm"}],
    "workload": {
        "dataset": {"name": "random", "input_len": 256, "output_len": 32, "range_ratio": 0.5},
        "num_prompts": 40,
        "request_rate": 20,
    },
    "slo": {"ttft_ms": 200, "tpot_ms": 30},
    "seed": 0,
}


@pytest.fixture(scope="session")
def tiny_scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY_SCENARIO))
    return path


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory: pytest.TempPathFactory, tiny_scenario: Path) -> Path:
    """The tiny scenario's run folder (summary, requests, steps, ITL, scenario, memory)."""
    return runner.save_run(runner.run(tiny_scenario), tmp_path_factory.mktemp("run"))
