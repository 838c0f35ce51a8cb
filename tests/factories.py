"""Small factories shared by the tests (as vLLM's test helpers): requests, schedulers and a step
timer whose every number can be checked on paper, the cost model's exact step time, scenario
data, and a YAML writer. `import factories` works from every test folder (pyproject's pytest
`pythonpath`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment
from simulator.costmodel.offload import OffloadPlan
from simulator.costmodel.step import StepCost, engine_step_time, step_cost
from simulator.serving.cluster import ReplicaGroup
from simulator.serving.kv_cache import BlockManager
from simulator.serving.request import Request
from simulator.specs.serving import SchedulerSpec
from simulator.workload.requests import RequestTable

MS = 1e-3


# -- the serving engine on paper ------------------------------------------------------------------
class FixedTimer:
    """Step times of the narrative tests: 10 ms + 10 us per prefill token for a step with
    chunks, 5 ms for a decode-only step; remembers every chunk (tokens, cached offset, last) it
    priced."""

    penalises = False  # no sampling penalties (`StepTimer.penalises`)

    def __init__(self) -> None:
        self.chunks: list[tuple[int, int, bool]] = []

    def decode_run(
        self, *, num_seqs: int, total_context: float, steps: int, outputs: tuple[int, int] = (0, 0)
    ) -> np.ndarray:
        return np.full(steps, 5 * MS)

    def decode_ends(
        self, *, start: float, num_seqs: int, total_context: float, steps: int
    ) -> list[float] | None:
        return None  # no short-run path (`StepTimer.decode_ends`): the replica sums decode_run

    def mixed(
        self,
        *,
        chunks: Sequence[tuple[int, int, bool]],
        decode_contexts: Sequence[int],
        outputs: tuple[int, int] = (0, 0),
    ) -> float:
        self.chunks += chunks
        return 10 * MS + 0.01 * MS * sum(c[0] for c in chunks)


def make_requests(*rows: tuple[float, int, int], **columns: Sequence[float]) -> RequestTable:
    """(arrival s, prompt tokens, output tokens) per request; `columns`: RequestTable's optional
    columns (shared prefixes, sessions), one value per request."""
    arrival, prompt, output = zip(*rows, strict=True)
    arrays = {name: np.asarray(values) for name, values in columns.items()}
    return RequestTable(
        arrival_s=np.array(arrival),
        prompt_len=np.array(prompt),
        output_len=np.array(output),
        **arrays,
    )


def make_scheduler(**overrides: object) -> SchedulerSpec:
    """8 sequences, 2048 tokens a step, no watermark; `overrides` replace any of them."""
    values: dict[str, object] = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 2048,
        "watermark": 0.0,
    }
    values.update(overrides)
    return SchedulerSpec(**values)  # type: ignore[arg-type]


def fixed_group(
    *,
    scheduler: SchedulerSpec | None = None,
    timer: object | None = None,
    num_blocks: int = 1000,
    block_size: int = 16,
    **fields: Any,
) -> ReplicaGroup:
    """A replica group on `FixedTimer` (or `timer`) under `make_scheduler()` (or `scheduler`),
    with `num_blocks` KV blocks of `block_size` tokens; `fields`: more ReplicaGroup fields
    (count, loop, host_blocks, ...)."""
    return ReplicaGroup(
        scheduler=scheduler or make_scheduler(),
        timer=timer or FixedTimer(),  # type: ignore[arg-type]
        num_blocks=num_blocks,
        block_size=block_size,
        **fields,
    )


def times_ms(df: pd.DataFrame, column: str) -> list[float]:
    """A request frame's `column` in ms, by request id (rounded to 1 ns)."""
    return [round(x / MS, 6) for x in df.sort_values("request_id")[column]]


def request_latencies(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each request's TTFT and TPOT in seconds (TPOT 0 with one output token), by request id."""
    rows = requests.sort_values("request_id")
    ttft = (rows["first_token_s"] - rows["arrival_s"]).to_numpy()
    out = rows["output_tokens"].to_numpy()
    decode_s = (rows["finish_s"] - rows["first_token_s"]).to_numpy()
    tpot = np.where(out > 1, decode_s / np.maximum(out - 1, 1), 0.0)
    return ttft, tpot


# -- the cost model -------------------------------------------------------------------------------
def cost_model_step_s(
    dep: Deployment,
    batch: BatchShape,
    *,
    num_seqs: int,
    offload: OffloadPlan | None = None,
    enforce_eager: bool = False,
) -> float:
    """The cost model's own step of `batch` on `dep` (no step-time tables): `step_cost` plus the
    engine's launches and overheads for `num_seqs` sequences (the first element if vectorised)."""
    cost = gpu_step(dep, batch, offload=offload)
    time = engine_step_time(
        cost,
        dep.engine,
        num_tokens=batch.num_tokens,
        num_seqs=num_seqs,
        enforce_eager=enforce_eager,
    )
    return float(np.ravel(time)[0])


def gpu_step(dep: Deployment, batch: BatchShape, *, offload: OffloadPlan | None = None) -> StepCost:
    """`step_cost` of `batch` on `dep` as its engine runs it (GPU time only)."""
    return step_cost(
        dep.model,
        dep.hardware,
        dep.layout,
        dep.precision,
        batch,
        engine=dep.engine,
        offload=offload,
    )


# -- files ----------------------------------------------------------------------------------------
def scenario_data(
    *,
    input_len: int,
    output_len: int,
    num_prompts: int,
    request_rate: float | None = None,
    range_ratio: float | None = None,
    name: str = "tiny",
    model: str = "llama-3.1-8b",
    group: dict[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A scenario as its YAML mapping: one replica group (`group`, default one H100) serving
    random prompts (`request_rate` None: vLLM's default, all at t=0); `fields` are more
    top-level keys (slo, seed, replicas, ...)."""
    dataset: dict[str, Any] = {"name": "random", "input_len": input_len, "output_len": output_len}
    if range_ratio is not None:
        dataset["range_ratio"] = range_ratio
    workload: dict[str, Any] = {"dataset": dataset, "num_prompts": num_prompts}
    if request_rate is not None:
        workload["request_rate"] = request_rate
    replicas = [group or {"hardware": "h100_sxm"}]
    return {"name": name, "model": model, "replicas": replicas, "workload": workload, **fields}


def plan_data(**overrides: Any) -> dict[str, Any]:
    """A small plan: Llama-3.1-8B, short prompts, two single-GPU layouts, a quick search, judged
    at the point predictions on one seed (the planner's mechanics; tests of the margin and the
    seeds turn them on)."""
    data: dict[str, Any] = {
        "name": "tiny",
        "model": "llama-3.1-8b",
        "workload": {
            "dataset": {"name": "random", "input_len": 512, "output_len": 64, "range_ratio": 0.5},
            "request_rate": 12,
        },
        "slo": {"ttft_ms": {"p": 99, "max": 1500}, "tpot_ms": 60},
        "candidates": {"hardware": ["h100_sxm", "l40s"]},
        "search": {
            "duration_s": 4,
            "min_prompts": 40,
            "max_prompts": 80,
            "max_probes": 5,
            "tolerance": 0.15,
            "band_margin": False,
        },
        "seeds": 1,
    }
    data.update(overrides)
    return data


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    """`data` as YAML at `path` (keys in their order); returns the path."""
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def speculative_steps(
    kv: BlockManager, plain: BlockManager, *, prompt: int, accepted: Sequence[int], k: int
) -> Iterator[tuple[Request, Request]]:
    """One request on `kv` and its twin on `plain`: the prompt computed, then a speculative step
    per entry of `accepted` (1 + k slots taken, the rejected rolled back, as
    `Replica._accepted` does), the pair yielded after each step's allocation."""
    req = Request(id=0, arrival_s=0.0, prompt_len=prompt, output_len=1000)
    twin = Request(id=0, arrival_s=0.0, prompt_len=prompt, output_len=1000)
    assert kv.allocate(req, prompt) and plain.allocate(twin, prompt)
    req.num_computed = twin.num_computed = prompt
    for a in accepted:
        assert kv.allocate(req, 1 + k) and plain.allocate(twin, 1 + k)
        yield req, twin
        for r in (req, twin):
            r.num_computed += 1 + a
            r.num_output += 1 + a
