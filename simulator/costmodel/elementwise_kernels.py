"""Elementwise kernels with one thread block per token: how engines launch them, and what
their launch costs beyond their bytes.

vLLM's CUDA kernels for the rotary embedding, the gated activation and (before it was
vectorised) the RMSNorm give each token a thread block whose threads loop over the row one
16-bit element per trip. A thread waits for a trip's loads before the next, so the bytes in
flight are a few per resident thread, far fewer than DRAM needs to stream at speed (Little's
law): such a kernel runs at a third to a half of the bandwidth its bytes would allow
(Vidur's A100/H100 profiles, suites `elementwise`, `elementwise_fit`). Priced as

    time = row_fixed_s + max(bytes at the streaming efficiency,
                             trips x max(row_latency_s, waves x row_wave_s[kernel] x L2))

with `trips` the loop trips of a block's slowest thread (`RowLaunch.trips`). One trip alone
costs a load's round trip on an idle device (`row_latency_s`); a full wave of resident
blocks (`waves` = rows / resident blocks) costs the kernel's `row_wave_s` per trip, the
loaded memory system's pace for that kernel's loads and stores, less when the kernel's bytes
fit in L2 (`row_l2_factor`, blended from half to twice the L2 size). Which kernels an engine
runs this way is its `scalar_row_kernels`; vectorised or fused kernels (FlashInfer,
TensorRT-LLM, vLLM's Inductor-generated ones) are priced by their bytes alone.

`rms_norm`, `rotary` and `gated_act` build these ops with their bytes and launch, for the
step's op list, `llmsim op elementwise` and the `elementwise` validation suites alike.
"""

from __future__ import annotations

import numpy as np

from simulator.costmodel.batch import Num
from simulator.costmodel.op import Op, RowLaunch, ScalesWith, elementwise
from simulator.specs.hardware import HardwareSpec

# Resident thread blocks per SM at most (CUDA compute capability 8.0-9.0: 32).
MAX_BLOCKS_PER_UNIT = 32
# vLLM csrc/layernorm_kernels.cu rms_norm and (0.2-0.3) fused_add_rms_norm: grid(num_tokens),
# block(min(hidden_size, 1024)), a thread loops over its share of the row twice (sum of
# squares; then scale and store).
NORM_MAX_THREADS = 1024
# vLLM csrc/pos_encoding_kernels.cu rotary_embedding: grid(num_tokens),
# block(min(num_heads * rot_dim / 2, 512)); a thread loops over the query heads' rotation
# pairs, then over the key heads'.
ROTARY_MAX_THREADS = 512
# vLLM csrc/activation_kernels.cu act_and_mul (silu_and_mul): grid(num_tokens),
# block(min(d, 1024)), a thread loops over the d outputs of its row.
ACT_MAX_THREADS = 1024


def norm_launch(tokens: Num, hidden: Num) -> RowLaunch:
    threads = np.minimum(hidden, NORM_MAX_THREADS)
    return RowLaunch("norm", tokens, threads, 2.0 * _loops(hidden, threads))


def rotary_launch(tokens: Num, heads: Num, kv_heads: Num, rot_dim: Num) -> RowLaunch:
    q_pairs = np.multiply(heads, rot_dim) / 2.0
    k_pairs = np.multiply(kv_heads, rot_dim) / 2.0
    threads = np.minimum(q_pairs, ROTARY_MAX_THREADS)
    return RowLaunch("rotary", tokens, threads, _loops(q_pairs, threads) + _loops(k_pairs, threads))


def act_launch(rows: Num, d: Num) -> RowLaunch:
    threads = np.minimum(d, ACT_MAX_THREADS)
    return RowLaunch("act", rows, threads, _loops(d, threads))


def rms_norm(
    name: str,
    tokens: Num,
    hidden: Num,
    *,
    act_bytes: float,
    count: float,
    tensors: float = 3.0,
    launched: bool = True,
) -> Op:
    """An RMSNorm over `tokens` rows of `hidden` that moves `tensors` rows of activations per
    token (3: the fused residual add + norm a layer runs; 2: a plain norm); `launched`: with
    vLLM's one-block-per-token launch (not for a LayerNorm, PyTorch's kernel)."""
    nbytes = np.multiply(tokens, hidden) * act_bytes * tensors
    launch = norm_launch(tokens, hidden) if launched else None
    return elementwise(name, bytes_=nbytes, count=count, launch=launch)


def rotary(
    tokens: Num, heads: Num, kv_heads: Num, head_dim: Num, *, act_bytes: float, count: float
) -> Op:
    """The rotary embedding of the query and key heads of `tokens` tokens: each read and
    written once."""
    nbytes = np.multiply(tokens, np.add(heads, kv_heads)) * head_dim * act_bytes * 2.0
    launch = rotary_launch(tokens, heads, kv_heads, head_dim)
    return elementwise("rotary", bytes_=nbytes, count=count, launch=launch)


def gated_act(
    name: str,
    rows: Num,
    d: Num,
    *,
    act_bytes: float,
    count: float,
    scales_with: ScalesWith = "tokens",
) -> Op:
    """SiLU-and-mul over `rows` rows of `d` outputs: reads the gate and up halves, writes one."""
    nbytes = np.multiply(rows, 3.0 * np.asarray(d, dtype=float)) * act_bytes
    launch = act_launch(rows, d)
    return elementwise(name, bytes_=nbytes, count=count, scales_with=scales_with, launch=launch)


def _loops(elems: Num, threads: Num) -> np.ndarray:
    """Iterations of a block's slowest thread over `elems` elements (at least one)."""
    return np.maximum(np.ceil(np.divide(elems, threads)), 1.0)


def resident_blocks(hw: HardwareSpec, threads: Num) -> np.ndarray:
    """Blocks of `threads` threads the device holds at once (by threads per SM)."""
    fit = hw.compute.threads_per_unit // np.maximum(np.asarray(threads, dtype=float), 1.0)
    return hw.compute.units * np.clip(fit, 1.0, MAX_BLOCKS_PER_UNIT)


def l2_blend(hw: HardwareSpec, nbytes: np.ndarray) -> np.ndarray:
    """0 where the kernel's bytes fit in half the L2, 1 from twice the L2, log-linear between."""
    l2 = float(hw.memory.l2_cache_bytes)
    if l2 <= 0:
        return np.ones_like(nbytes)
    return np.clip(np.log(np.maximum(nbytes, 1.0) / l2) / np.log(4.0) + 0.5, 0.0, 1.0)


def priced(hw: HardwareSpec, op: Op, kernels: frozenset[str]) -> bool:
    """Whether `op`'s launch is priced: it has one, the engine runs it as a one-block-per-
    token kernel (`kernels`) and the device has a wave time for it."""
    return (
        op.launch is not None
        and op.launch.kernel in kernels
        and hw.efficiency.memory.row_wave_s.get(op.launch.kernel, 0.0) > 0
    )


def fixed_s(hw: HardwareSpec) -> float:
    """Fixed cost of one call of a one-block-per-token kernel."""
    fixed = hw.efficiency.memory.row_fixed_s
    return hw.efficiency.kernel_latency_s if fixed is None else fixed


def row_time_s(hw: HardwareSpec, op: Op) -> np.ndarray:
    """Seconds `op`'s launch (`op.launch`) costs beyond its fixed cost, as the module
    docstring prices it (without the bytes term), never falling as the rows grow; 0 without
    a launch or a wave time for its kernel."""
    mem = hw.efficiency.memory
    if op.launch is None:
        return np.zeros(1)
    launch = op.launch
    wave_s = mem.row_wave_s.get(launch.kernel, 0.0)
    rows = np.asarray(launch.rows, dtype=float)
    nbytes = np.asarray(op.bytes, dtype=float)
    l2 = mem.row_l2_factor + (1.0 - mem.row_l2_factor) * l2_blend(hw, nbytes)
    waves = rows / resident_blocks(hw, launch.threads)
    per_trip = np.maximum(mem.row_latency_s, waves * wave_s * l2)
    return np.where((rows > 0) & (wave_s > 0), launch.trips * per_trip, 0.0)
