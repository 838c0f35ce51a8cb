"""Rows the serving simulation records as it runs (no I/O): engine steps and inter-token
latencies. Arrays are appended in chunks and joined once at the end."""

from __future__ import annotations

import numpy as np
import pandas as pd

STEP_COLUMNS = (
    "replica",
    "start_s",
    "end_s",
    "num_seqs",
    "prefill_tokens",
    "decode_tokens",
    "kv_used_blocks",
)


class Recorder:
    def __init__(self) -> None:
        self._steps: list[np.ndarray] = []
        self._itl_values: list[np.ndarray] = []
        self._itl_weights: list[np.ndarray] = []

    def steps(
        self,
        *,
        replica: int,
        start_s: np.ndarray,
        end_s: np.ndarray,
        num_seqs: int,
        prefill_tokens: int,
        decode_tokens: int,
        kv_used_blocks: np.ndarray | int,
    ) -> None:
        """One or more consecutive steps with the same batch (arrays over the steps)."""
        k = len(end_s)
        block = np.empty((k, len(STEP_COLUMNS)))
        block[:, 0] = replica
        block[:, 1] = start_s
        block[:, 2] = end_s
        block[:, 3] = num_seqs
        block[:, 4] = prefill_tokens
        block[:, 5] = decode_tokens
        block[:, 6] = kv_used_blocks
        self._steps.append(block)

    def itl(self, values: np.ndarray, weights: np.ndarray | float) -> None:
        """Inter-token gaps: `weights[i]` tokens arrived `values[i]` after their previous one."""
        values = np.asarray(values, dtype=float)
        self._itl_values.append(values)
        self._itl_weights.append(np.broadcast_to(np.asarray(weights, dtype=float), values.shape))

    def step_frame(self) -> pd.DataFrame:
        data = np.concatenate(self._steps) if self._steps else np.empty((0, len(STEP_COLUMNS)))
        df = pd.DataFrame(data, columns=list(STEP_COLUMNS))
        for col in ("replica", "num_seqs", "prefill_tokens", "decode_tokens", "kv_used_blocks"):
            df[col] = df[col].astype(np.int64)
        return df

    def itl_sample(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._itl_values:
            return np.empty(0), np.empty(0)
        return np.concatenate(self._itl_values), np.concatenate(self._itl_weights)
