"""The bundled measurements (`simulator/data/measured/`), read into DataFrames.

The only place that reads the measured CSVs. Each loader checks the columns the suites use and
returns a fresh copy (callers may add columns). Provenance and column meanings are in
`simulator/data/README.md`; every device name is mapped here to a hardware id.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pandas as pd

from simulator.errors import SpecError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
MEASURED_DIR = DATA_DIR / "measured"

# aiconfigurator's system folder -> our hardware id
AIC_DEVICES = {
    "a100_sxm": "a100_sxm_80gb",
    "h100_sxm": "h100_sxm",
    "h200_sxm": "h200_sxm",
    "b200_sxm": "b200",
}
# the vLLM release whose kernels a folder's tables time (aiconfigurator's runtime folder)
AIC_VLLM = {"a100_sxm": "0.14.0", "h100_sxm": "0.14.0", "h200_sxm": "0.14.0", "b200_sxm": "0.19.0"}
# the attention kernels its attention tables time (their kernel_source: vllm_flash_attn, or
# vllm_flashinfer, FlashInfer's backend, which calls trtllm-gen's kernels on Blackwell)
AIC_ATTENTION = {
    "a100_sxm": "flash-attention",
    "h100_sxm": "flash-attention",
    "h200_sxm": "flash-attention",
    "b200_sxm": "FlashInfer",
}
# this project's own GEMM timings (tools/measure_gpu.py) folder -> hardware id
LLMSIM_DEVICES = {"h100_sxm": "h100_sxm", "h200_sxm": "h200_sxm"}
# AMD aiter's tuned-GEMM timings (measured/aiter/<folder>/) -> hardware id
AITER_DEVICES = {"mi300x": "mi300x"}
# Vidur's profiling folder -> hardware id (Vidur profiled SXM parts in 8-GPU nodes)
VIDUR_DEVICES = {"a100": "a100_sxm_80gb", "h100": "h100_sxm"}
# Vidur's file stem -> a short model name for case strings (not all are catalogue ids)
VIDUR_MODELS = {
    "Llama-2-7b-hf": "llama-2-7b",
    "Llama-2-70b-hf": "llama-2-70b",
    "Meta-Llama-3-8B": "llama-3-8b",
}
# Splitwise's model and hardware names -> catalogue model id / hardware id
SPLITWISE_MODELS = {"llama2-70b": "llama-2-70b", "bloom-176b": "bloom-176b"}
SPLITWISE_HARDWARE = {"a100-80gb": "a100_sxm_80gb", "h100-80gb": "h100_sxm"}
# The profile's files by device: its DGX-A100 and DGX-H100 rows (its `h100-80gb-pcap` rows are
# the H100 rows with prompt_time x 1.3 and token_time as they are, every one: a derived
# power-capping scenario, not a measurement, so not bundled).
SPLITWISE_FILES = {
    "a100_sxm_80gb": "splitwise/perf_model_a100.csv",
    "h100_sxm": "splitwise/perf_model_h100.csv",
}

_ATTENTION = [
    "batch_size",
    "isl",
    "num_heads",
    "num_key_value_heads",
    "head_dim",
    "attn_dtype",
    "kv_cache_dtype",
    "step",
    "latency_ms",
]
AIC_COLUMNS: dict[str, list[str]] = {
    "gemm": ["gemm_dtype", "m", "n", "k", "latency_ms"],
    "context_attention": _ATTENTION,
    "generation_attention": _ATTENTION,
    "nccl": ["op_name", "nccl_dtype", "num_gpus", "message_size_elements", "latency_ms"],
}
# vLLM's fused MoE (`fused_experts`) under balanced routing (every expert hit that the
# tokens can hit), one node's layouts; aiconfigurator's `moe` table, the folders that hold one
AIC_MOE_COLUMNS = [
    "moe_dtype",
    "num_tokens",
    "hidden_size",
    "inter_size",
    "topk",
    "num_experts",
    "moe_tp_size",
    "moe_ep_size",
    "latency_ms",
]
AIC_MOE_DEVICES = ("h100_sxm", "h200_sxm", "b200_sxm")
VIDUR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# the memory-bound kernels between them: RMSNorm, rotary embedding, SiLU-and-mul (one thread
# block per token each, vLLM's custom kernels) and the residual add (a PyTorch elementwise op)
VIDUR_ELEMENTWISE = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
VIDUR_COLUMNS = [
    *(f"time_stats.{op}.median" for op in (*VIDUR_OPS, *VIDUR_ELEMENTWISE)),
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
]
SPLITWISE_COLUMNS = [
    "model",
    "hardware",
    "prompt_size",
    "batch_size",
    "token_size",
    "prompt_time",
    "token_time",
    "e2e_time",
    "tensor_parallel",
]


@cache
def _read(relpath: str, columns: tuple[str, ...]) -> pd.DataFrame:
    path = MEASURED_DIR / relpath
    try:
        df = pd.read_csv(path)
    except OSError as exc:
        raise SpecError(f"cannot read measured data ({exc.strerror})", source=str(path)) from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise SpecError(f"missing columns {missing}", source=str(path))
    return df


def read_measured(relpath: str, columns: list[str]) -> pd.DataFrame:
    """A measured CSV under `simulator/data/measured/` (a copy; read once per process)."""
    return _read(relpath, tuple(columns)).copy()


def aiconfigurator(device: str, table: str) -> pd.DataFrame:
    """One aiconfigurator table (`gemm`, `context_attention`, `generation_attention`, `nccl`)
    of one system folder (`a100_sxm`, `h100_sxm`, `h200_sxm`, `b200_sxm`)."""
    if device not in AIC_DEVICES:
        raise SpecError(f"unknown device {device!r} ({', '.join(AIC_DEVICES)})", field="device")
    if table not in AIC_COLUMNS:
        raise SpecError(f"unknown table {table!r} ({', '.join(AIC_COLUMNS)})", field="table")
    return read_measured(f"aiconfigurator/{device}/{table}.csv", AIC_COLUMNS[table])


def aiconfigurator_moe(device: str) -> pd.DataFrame:
    """The fused-MoE table of one system folder of AIC_MOE_DEVICES."""
    if device not in AIC_MOE_DEVICES:
        raise SpecError(
            f"no MoE table for {device!r} ({', '.join(AIC_MOE_DEVICES)})", field="device"
        )
    return read_measured(f"aiconfigurator/{device}/moe.csv", AIC_MOE_COLUMNS)


def llmsim_gemm(device: str) -> pd.DataFrame:
    """The GEMMs this project timed on one device folder (`h100_sxm`, `h200_sxm`) with
    tools/measure_gpu.py: aiconfigurator's `gemm` columns; the fp8 rows are the scaled GEMM
    alone, without an activation-quantisation kernel."""
    if device not in LLMSIM_DEVICES:
        raise SpecError(f"unknown device {device!r} ({', '.join(LLMSIM_DEVICES)})", field="device")
    return read_measured(f"llmsim/{device}/gemm.csv", AIC_COLUMNS["gemm"])


def aiter_gemm(device: str) -> pd.DataFrame:
    """The 8-bit GEMMs AMD's aiter tuner timed on one device folder (`mi300x`): aiconfigurator's
    `gemm` columns (`gemm_dtype` int8: the tuner's data)."""
    if device not in AITER_DEVICES:
        raise SpecError(f"unknown device {device!r} ({', '.join(AITER_DEVICES)})", field="device")
    return read_measured(f"aiter/{device}/gemm_a8w8.csv", AIC_COLUMNS["gemm"])


def vidur_files(device: str) -> list[Path]:
    """The Vidur per-layer profiles bundled for one device folder (`a100`, `h100`)."""
    return sorted((MEASURED_DIR / "vidur" / device).glob("*.mlp.csv"))


def vidur(device: str) -> pd.DataFrame:
    """Every bundled Vidur MLP/projection profile of one device folder, with a `model` column
    (short name from VIDUR_MODELS). Times are in ms."""
    if device not in VIDUR_DEVICES:
        raise SpecError(f"unknown device {device!r} ({', '.join(VIDUR_DEVICES)})", field="device")
    frames = []
    for path in vidur_files(device):
        stem = path.name.removesuffix(".mlp.csv")
        df = read_measured(f"vidur/{device}/{path.name}", VIDUR_COLUMNS)
        frames.append(df.assign(model=VIDUR_MODELS.get(stem, stem)))
    if not frames:
        raise SpecError("no Vidur profiles bundled", source=str(MEASURED_DIR / "vidur" / device))
    return pd.concat(frames, ignore_index=True)


def splitwise(device: str = "a100_sxm_80gb") -> pd.DataFrame:
    """Splitwise's iteration profile of one device (`a100_sxm_80gb`: DGX-A100, with power
    readings; `h100_sxm`: DGX-H100, power columns 0 = not recorded); every repeat, times in ms."""
    if device not in SPLITWISE_FILES:
        raise SpecError(f"unknown device {device!r} ({', '.join(SPLITWISE_FILES)})", field="device")
    return read_measured(SPLITWISE_FILES[device], SPLITWISE_COLUMNS)
