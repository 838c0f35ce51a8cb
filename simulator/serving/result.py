"""What a serving run produced (`SimResult`). Its own module, outside the compiled engine
(simulator/native.py), so that a result pickles and copies as any frozen dataclass does: a
compiled one restores its fields through its frozen `__setattr__`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.costmodel.memory import MemoryPlan


@dataclass(frozen=True)
class SimResult:
    """What a serving run produced: one row per request and per engine step, the weighted
    inter-token-latency sample, and each replica's memory plan and KV peak; with KV tiers,
    samples of their state (`metrics.recorder.TIER_COLUMNS`)."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    itl_s: np.ndarray
    itl_weight: np.ndarray
    memory: MemoryPlan | None  # None when run on a bare KV size (`serve`)
    kv_peak_fraction: float
    num_replicas: int
    wall_s: float
    kv_tiers: pd.DataFrame | None = None
    lora: dict[str, float] | None = None  # multi-LoRA: adapter loads (serving.lora_summary)
    # with autoscaled groups (serving.fleet): their replica counts over time, and each one's
    # GPU seconds (by group index) from the start to the last request's end
    fleet: pd.DataFrame | None = None
    fleet_gpu_seconds: dict[int, float] | None = None
    # with a distributed KV pool (serving.kv_pool): what it lent and what that cost
    kv_pool: dict[str, float] | None = None
    # with intra-GPU P/D partitioning, dynamic (serving.pd_partition.split_summary): its
    # split's choices
    pd_partition: dict[str, float] | None = None
    # with a power budget (serving.power): the fleet's sampled draw, and replica-seconds capped
    power: pd.DataFrame | None = None
    power_capped_replica_s: float | None = None
    power_caps: pd.DataFrame | None = None  # when each replica was capped, released
