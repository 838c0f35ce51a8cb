"""Human labels for the values a sweep varies: what a legend or a table shows instead of the
JSON a results file stores (`[{"count": 2, "hardware": "h100_sxm", ...}]` reads as
"2 x H100 SXM TP2 fp8 (prefill)"), and none for a value that is not set."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

NOT_SET = "none"


def value_label(column: str, value: Any) -> str:
    """`value` of the sweep's varied `column` as a reader would write it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NOT_SET
    if isinstance(value, str) and value[:1] in "[{":
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return value
    if column.split(".")[-1] == "replicas" and isinstance(value, list):
        return " + ".join(replica_label(group) for group in value if isinstance(group, Mapping))
    if isinstance(value, Mapping):
        return mapping_label(value)
    if isinstance(value, list):
        return ", ".join(value_label(column, v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def replica_label(group: Mapping[str, Any]) -> str:
    """One replica group: "2 x h100_sxm TP2 PP2 fp8 (prefill)"."""
    parts = [f"{group.get('count', 1)} x {group.get('hardware', '?')}"]
    for key, short in (
        ("tensor_parallel_size", "TP"),
        ("pipeline_parallel_size", "PP"),
        ("context_parallel_size", "CP"),
    ):
        if group.get(key, 1) != 1:
            parts.append(f"{short}{group[key]}")
    if group.get("data_parallel_size", 1) != 1:
        parts.append(f"DP{group['data_parallel_size']}")
    for key in ("quantization", "engine"):
        if group.get(key):
            parts.append(str(group[key]))
    role = group.get("role")
    return " ".join(parts) + (f" ({role})" if role and role != "both" else "")


def mapping_label(value: Mapping[str, Any]) -> str:
    """{"kind": "auto", "layerwise": true} -> "auto, layerwise"."""
    parts = [str(value["kind"])] if "kind" in value else []
    for key, v in value.items():
        if key == "kind" or v is None or v is False:
            continue
        parts.append(key if v is True else f"{key}={v}")
    return ", ".join(parts) or NOT_SET


def series_columns(frame: pd.DataFrame, by: Sequence[str]) -> list[str]:
    """The columns of `by` that name a series: a column whose value the others fix (varied
    in lockstep with them, a sweep's `zip:`) adds nothing to a label and is left out, the
    replica groups last (they say the most)."""
    keep = list(by)
    for column in sorted(reversed(by), key=_is_replicas):
        others = [c for c in keep if c != column]
        if not others:
            break
        fixed = frame.groupby(others, dropna=False)[column].nunique(dropna=False)
        if int(fixed.max()) <= 1:
            keep.remove(column)
    return keep


def series_label(by: Sequence[str], key: Sequence[Any]) -> str:
    """A series' label: its values, each named by its field ("router: least_kv"), but replica
    groups, which describe themselves."""
    return ", ".join(
        value_label(c, v) if _is_replicas(c) else f"{c.split('.')[-1]}: {value_label(c, v)}"
        for c, v in zip(by, key, strict=True)
    )


def _is_replicas(column: str) -> bool:
    return column.split(".")[-1] == "replicas"
