"""A sweep's varied values as a reader would write them, in legends and tables."""

from __future__ import annotations

import json
import math

import pandas as pd

from simulator.report.labels import series_columns, series_label, value_label

PREFILL = {"hardware": "h100_sxm", "role": "prefill", "count": 2, "tensor_parallel_size": 2}
DECODE = {"hardware": "h100_sxm", "role": "decode", "count": 1, "tensor_parallel_size": 4}


def test_replica_groups_read_as_counts_devices_and_layouts() -> None:
    stored = json.dumps([{**PREFILL, "quantization": "fp8"}, DECODE])  # as results.csv holds it
    assert value_label("replicas", stored) == (
        "2 x h100_sxm TP2 fp8 (prefill) + 1 x h100_sxm TP4 (decode)"
    )
    colocated = [{"hardware": "mi300x", "count": 1, "pipeline_parallel_size": 2, "role": "both"}]
    assert value_label("replicas", colocated) == "1 x mi300x PP2"


def test_mappings_unset_values_and_numbers() -> None:
    assert value_label("router", '{"kind": "least_outstanding"}') == "least_outstanding"
    kv = {"kind": "auto", "layerwise": True, "latency_s": None}
    assert value_label("kv_transfer", kv) == "auto, layerwise"
    assert value_label("decode_router", math.nan) == "none"
    assert value_label("decode_router", None) == "none"
    assert value_label("workload.request_rate", 4.0) == "4"
    assert value_label("hardware", "h100_sxm") == "h100_sxm"


def test_values_varied_in_lockstep_name_a_series_once() -> None:
    # a sweep's zip: router and kv_transfer follow replicas, so replicas alone names the lines
    frame = pd.DataFrame(
        {
            "replicas": ["a", "a", "b", "b"],
            "router": ["r1", "r1", "r2", "r2"],
            "kv_transfer": [math.nan, math.nan, "k", "k"],
            "seed": [0, 1, 0, 1],
        }
    )
    assert series_columns(frame, ["replicas", "router", "kv_transfer"]) == ["replicas"]
    assert series_columns(frame, ["replicas", "seed"]) == ["replicas", "seed"]
    label = series_label(["replicas", "seed"], (json.dumps([PREFILL]), 1.0))
    assert label == "2 x h100_sxm TP2 (prefill), seed: 1"
