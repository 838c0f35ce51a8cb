"""Per-operator costs of a deployment's representative steps, for the roofline and the time
breakdown: the cost model's op list (`costmodel.step.step_cost`) evaluated on one prefill step
and one decode step, plus the engine's CPU lines of each (`costmodel.latency`).

`step_op_costs` takes the step shapes; `run_op_costs` picks them from a run: the prefill step
is one prompt of the run's median prompt length alone (its first chunk, when chunked prefill
caps the step at max_num_batched_tokens); the decode step holds the run's median decode batch
(over steps without prompt tokens), each sequence attending to the median prompt plus half the
median output. Not modelled: the mixed steps of chunked prefill (the simulation's steps mix
prompt chunks with decodes; these two are the pure cases), the spread of shapes around the
medians, and the step-time tables' interpolation (`serving.steptime`) the simulation uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment
from simulator.costmodel.step import StepCost, engine_overhead_rows, step_cost
from simulator.runs.runner import group_deployment
from simulator.serving.group import default_scheduler
from simulator.specs import load_model
from simulator.specs.scenario import Scenario

OP_COLUMNS = (
    "phase", "op", "kind", "dtype", "count", "time_s", "total_s", "hidden_s", "flops", "bytes",
    "bound", "intensity_flop_per_byte", "achieved_flops_per_s",
)  # fmt: skip


def _op_rows(cost: StepCost, *, phase: str) -> list[dict[str, Any]]:
    rows = []
    for c in cost.costs:
        t = float(np.ravel(c.time_s)[0])
        if t == 0.0:
            continue
        flops = float(np.ravel(c.op.flops)[0]) * c.op.count
        nbytes = float(np.ravel(c.op.bytes)[0] + np.ravel(c.op.msg_bytes)[0]) * c.op.count
        rows.append(
            {
                "phase": phase,
                "op": c.op.name,
                "kind": c.op.kind,
                "dtype": c.op.dtype if c.op.kind != "collective" else "",
                "count": c.op.count,
                "time_s": t,
                "total_s": t * c.op.count,
                "hidden_s": 0.0,
                "flops": flops,
                "bytes": nbytes,
                "bound": str(np.ravel(c.bound)[0]),
            }
        )
    return rows


def _phase(
    dep: Deployment, batch: BatchShape, *, phase: str, num_seqs: float, enforce_eager: bool
) -> pd.DataFrame:
    cost = step_cost(
        dep.model,
        dep.hardware,
        dep.layout,
        dep.precision,
        batch,
        engine=dep.engine,
    )
    engine = engine_overhead_rows(
        cost,
        dep.engine,
        index=0,
        num_tokens=float(np.ravel(batch.num_tokens)[0]),
        num_seqs=num_seqs,
        enforce_eager=enforce_eager,
    ).assign(phase=phase, dtype="")
    return pd.concat([pd.DataFrame(_op_rows(cost, phase=phase)), engine], ignore_index=True)


def step_op_costs(
    dep: Deployment,
    *,
    prompt_tokens: int,
    decode_batch: int,
    context_len: int,
    enforce_eager: bool = False,
) -> pd.DataFrame:
    """One row per op of a prefill step (`prompt_tokens` tokens of one prompt, nothing cached)
    and of a decode step (`decode_batch` sequences, each attending to `context_len` tokens;
    left out when `decode_batch` is 0), then the engine's lines of each (kind `engine`, bound
    `cpu`). Columns `OP_COLUMNS`: times in seconds (per instance and times `count`), `flops`
    and `bytes` (DRAM, or on the wire for collectives) per step, `hidden_s` the launch time
    that overlaps GPU work, `intensity_flop_per_byte` and `achieved_flops_per_s` (NaN where
    there are no FLOPs or bytes)."""
    window = dep.model.attention.batch_window
    parts = [
        _phase(
            dep,
            BatchShape.prefill(batch_size=1, prompt_len=prompt_tokens, window=window),
            phase="prefill",
            num_seqs=1.0,
            enforce_eager=enforce_eager,
        )
    ]
    if decode_batch > 0:
        shape = BatchShape.decode(batch_size=decode_batch, context_len=context_len, window=window)
        parts.append(
            _phase(
                dep,
                shape,
                phase="decode",
                num_seqs=float(decode_batch),
                enforce_eager=enforce_eager,
            )
        )
    df = pd.concat(parts, ignore_index=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        df["intensity_flop_per_byte"] = np.where(
            (df["flops"] > 0) & (df["bytes"] > 0), df["flops"] / df["bytes"], np.nan
        )
        df["achieved_flops_per_s"] = np.where(
            (df["flops"] > 0) & (df["total_s"] > 0), df["flops"] / df["total_s"], np.nan
        )
    return df[list(OP_COLUMNS)]


def representative_shapes(requests: pd.DataFrame, steps: pd.DataFrame) -> tuple[int, int, int]:
    """(prompt tokens, decode batch, decode context length) of a run; see the module
    docstring. The decode batch is 0 when no step decoded."""
    done = requests[requests["finish_s"].notna()]
    rows = done if len(done) else requests
    prompt = max(1, round(float(rows["prompt_tokens"].median()))) if len(rows) else 1
    output = float(rows["output_tokens"].median()) if len(rows) else 1.0
    pure = steps[(steps["prefill_tokens"] == 0) & (steps["num_seqs"] > 0)]
    decoding = steps[steps["decode_tokens"] > 0]
    if len(pure):
        batch = round(float(pure["num_seqs"].median()))
    elif len(decoding):
        batch = round(float(decoding["decode_tokens"].median()))
    else:
        batch = 0
    return prompt, max(batch, 0), prompt + max(1, round(output / 2))


@dataclass(frozen=True)
class RunOps:
    """A replica group's deployment, the shapes of its representative steps and their
    `step_op_costs`."""

    deployment: Deployment
    prompt_tokens: int
    decode_batch: int
    context_len: int
    costs: pd.DataFrame


def run_op_costs(
    scenario: Scenario, requests: pd.DataFrame, steps: pd.DataFrame, *, group: int = 0
) -> RunOps:
    """The representative steps of replica group `group` of a run, from the requests and steps
    of that group's replicas (replicas are numbered group by group, in the scenario's order;
    all requests where none names one of them, as in a disaggregated prefill pool)."""
    spec = scenario.replicas[group]
    first = sum(g.num_replicas for g in scenario.replicas[:group])
    mine = range(first, first + spec.num_replicas)
    dep = group_deployment(load_model(scenario.model), spec)
    served = requests[requests["replica"].isin(mine)]
    # A request's row names the replica that finished it: a prefill pool has none of its own.
    prompt, batch, context = representative_shapes(
        served if len(served) else requests, steps[steps["replica"].isin(mine)]
    )
    sched = default_scheduler(
        dep.engine,
        max_model_len=dep.model.max_position_embeddings,
        model=dep.model,
        **spec.scheduler.model_dump(),
    )
    if sched.chunked_prefill:
        prompt = min(prompt, sched.max_num_batched_tokens)
    costs = step_op_costs(
        dep,
        prompt_tokens=prompt,
        decode_batch=batch,
        context_len=context,
        enforce_eager=spec.enforce_eager,
    )
    return RunOps(dep, prompt, batch, context, costs)
