"""The `elementwise` suite: the memory-bound kernels of a layer against Vidur's timings.

Vidur's profiles (fp16, Sarathi-Serve on vLLM's kernels of 2024) time, per layer and per GPU
of a TP group, the kernels between the projection GEMMs: `input_layernorm` and
`post_attention_layernorm` (vLLM's RMSNorm, one thread block per token), `attn_rope` (its
rotary embedding, one block per token, on the query and key heads of the GPU), `mlp_act` (its
SiLU-and-mul, one block per token) and `add` (the residual add, a PyTorch elementwise op).

predicted = the cost model's price of an elementwise kernel (`ops.elementwise`: bytes at the
device's streaming efficiency, plus its fixed kernel cost) for the bytes each kernel moves:
RMSNorm reads and writes the hidden state (2 x tokens x hidden x 2 bytes), rotary reads and
writes the GPU's query and key heads, SiLU-and-mul reads the gate and up halves and writes one
(3 x tokens x intermediate / TP), the add reads two hidden states and writes one. Nothing is
fitted to these rows: the suite says how far pricing such kernels by their bytes is from what
they take. Not modelled (what the errors show): the one-block-per-token kernels run well
below the bandwidth their bytes would allow once the tokens are many.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from simulator.costmodel.ops import elementwise
from simulator.specs.hardware import HardwareSpec
from simulator.validate import data
from simulator.validate.frame import finish
from simulator.validate.layers import SHAPE, local_shape, profile_rows
from simulator.validate.operators import default_hardware, op_time

SUITE = "elementwise"
HALF = 2.0  # fp16 bytes
MEDIANS = {op: f"time_stats.{op}.median" for op in data.VIDUR_ELEMENTWISE}


def kernel_bytes(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """Bytes each kernel moves on one GPU, for every row (shapes TP-sharded as in `layers`)."""
    t = rows["num_tokens"].to_numpy(dtype=float)
    h, d, q_local, kv_local, inter = local_shape(rows)
    norm = 2.0 * t * h * HALF
    return {
        "input_layernorm": norm,
        "attn_rope": 2.0 * t * (q_local + kv_local) * d * HALF,
        "post_attention_layernorm": norm,
        "mlp_act": 3.0 * t * inter * HALF,
        "add": 3.0 * t * h * HALF,
    }


def elementwise_cases(hw: HardwareSpec, measured: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, TP, num_tokens, kernel) of a Vidur profile (as `data.vidur`
    returns it), predicted on `hw`."""
    rows = profile_rows(measured, list(MEDIANS.values()))
    keys = ["model", *SHAPE, "num_tensor_parallel_workers", "num_tokens"]
    frames = []
    for name, nbytes in kernel_bytes(rows).items():
        predicted = op_time(elementwise(name, bytes_=nbytes, count=1), hw, len(rows))
        case = (
            name
            + " "
            + rows["model"]
            + " tp"
            + rows["num_tensor_parallel_workers"].astype(str)
            + " tokens="
            + rows["num_tokens"].astype(str)
        )
        frames.append(
            rows[keys].assign(
                kind=name,
                case=case,
                predicted_s=predicted,
                measured_s=rows[MEDIANS[name]].to_numpy(dtype=float) / 1e3,
                device=hw.id,
            )
        )
    return finish(pd.concat(frames, ignore_index=True), suite=SUITE, fitted=False)


def elementwise_suite(hardware: Mapping[str, HardwareSpec] | None = None) -> pd.DataFrame:
    """The `elementwise` suite on every Vidur device. `hardware` maps a data folder (`a100`,
    `h100`) to the spec to predict with; default: data.VIDUR_DEVICES."""
    specs = default_hardware(data.VIDUR_DEVICES) if hardware is None else hardware
    frames = [elementwise_cases(hw, data.vidur(folder)) for folder, hw in specs.items()]
    return pd.concat(frames, ignore_index=True)
