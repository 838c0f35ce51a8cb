"""The `iteration` suites: whole engine steps against Splitwise's DGX-A100 and DGX-H100 profiles.

Splitwise (ISCA'24) ran vLLM of late 2023 (fp16, no CUDA graphs, no chunked prefill) on
DGX-A100 and DGX-H100 nodes: `batch_size` prompts of `prompt_size` tokens, each generating
`token_size` tokens, `tensor_parallel` GPUs. Per configuration we take the median over its
repeats and predict, with `--engine vllm-0.2` (that release's profile; eager) and dtype float16:

- prefill: one step that prefills batch_size x prompt_size tokens (step_cost +
  engine_step_time), against `prompt_time`;
- decode: the mean over the decode steps with context prompt+1 .. prompt+token-1 of one decode
  step of batch_size sequences, against `token_time` (which is (e2e_time - prompt_time) /
  (token_size - 1) in the data).

The engine's CPU overheads are fitted (by `python -m simulator.calibrate`) to the DGX-A100
llama-2-70b rows, suite `iteration_engine_fit`; the DGX-A100 bloom-176b rows and every DGX-H100
row are the held-out check, suites `iteration_prefill` and `iteration_decode` (by device). The
GPU side comes from the operator calibration alone. On DGX-H100 the fitted CPU costs run on
that node's CPU (Xeon 8480C against the fit's EPYC 7742): scaled by the CPUs' single-thread
scores (`specs.host_cpu`), which are public benchmark figures, not fitted to these rows.

Excluded, with the reason in `df.attrs["skipped"]`:
- capped rows: a configuration whose median prompt_time is below that of a smaller batch of
  the same (model, TP, prompt, output) -- the profile cannot have prefilled more tokens in less
  time, so the batch was cut short (this flags exactly the TP2 batch-64 llama2-70b rows the
  data README calls capped; both phases are dropped);
- configurations that do not fit by the memory plan (weights + activations of a
  batch_size x prompt_size profiling step + reserve, and KV blocks for batch x (prompt +
  output) tokens), at the engine's gpu_memory_utilization.
Not modelled: prompts beyond the model's max_position_embeddings are costed like any other.

Prefill rows are of two kinds. The profile's prefill time steps up, on both nodes and both
models, at TP4 and TP8 once a step's tensor-parallel all-reduce carries 64 MiB or more (tokens
x hidden x 2 bytes; 4,096 Llama-2-70B tokens): twice the tokens take 2.3-2.8x the time, where
TP2, and the predicted steps, stay near 2x. The operators at those shapes are priced within
9% per layer of Vidur's timings (GEMMs, elementwise kernels) and no faster than
aiconfigurator's NCCL all-reduce, which the step would need to run 4x slower; those rows
(kind `STEP_KIND`) measure something of that setup the model does not have
(docs/validation.md, "iteration, prefill").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.memory import plan_memory
from simulator.costmodel.step import engine_step_time, step_cost
from simulator.specs import load_engine, load_hardware, load_model
from simulator.specs.deployment import Parallelism, Precision, resolve_precision
from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import HardwareSpec
from simulator.specs.host_cpu import engine_on_host
from simulator.specs.model import DTYPE_BYTES, ModelSpec
from simulator.validate import data
from simulator.validate.frame import finish, median_repeats

PREFILL, DECODE = "iteration_prefill", "iteration_decode"
# The engine's CPU overheads (`vllm-0.2`) are fitted to this model's rows (both phases) on
# this device; the other model's rows, and every row of the other device, are the held-out check.
ENGINE_FIT = "iteration_engine_fit"
ENGINE_FIT_MODELS = ("llama-2-70b",)
ENGINE_FIT_DEVICE = "a100_sxm_80gb"
ENGINE = "vllm-0.2"
# Prefill rows whose step all-reduces at least this many bytes per call at TP >= STEP_MIN_TP.
STEP_BYTES = 64 * 2**20
STEP_MIN_TP = 4
STEP_KIND = "prefill, TP4+ AR >= 64 MiB"
KEYS = ["model", "hardware", "tensor_parallel", "batch_size", "prompt_size", "token_size"]


def configurations(measured: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration: median prompt_time / token_time (ms) over its repeats,
    catalogue `model_id` and `hardware_id`, and `capped` (see the module docstring)."""
    conf = median_repeats(measured, KEYS, ["prompt_time", "token_time", "e2e_time"])
    conf["model_id"] = conf["model"].map(data.SPLITWISE_MODELS)
    conf["hardware_id"] = conf["hardware"].map(data.SPLITWISE_HARDWARE)
    conf = conf.sort_values(KEYS, ignore_index=True)
    same = ["model", "hardware", "tensor_parallel", "prompt_size", "token_size"]
    best_smaller = conf.groupby(same)["prompt_time"].transform(
        lambda s: s.cummax().shift(1, fill_value=0.0)
    )
    conf["capped"] = conf["prompt_time"] < best_smaller
    return conf


def _fit_reason(
    model: ModelSpec,
    hw: HardwareSpec,
    layout: Parallelism,
    prec: Precision,
    engine: EngineSpec,
    row: pd.Series,
) -> str:
    """Why a configuration cannot run by the memory plan, or "" if it fits."""
    b, p, t = int(row["batch_size"]), int(row["prompt_size"]), int(row["token_size"])
    plan = plan_memory(
        model,
        hw,
        layout,
        prec,
        engine,
        max_num_batched_tokens=max(b * p, engine.scheduler.max_num_batched_tokens),
        max_num_seqs=max(b, engine.scheduler.max_num_seqs),
    )
    if not plan.fits:
        return f"weights do not fit ({plan.summary()})"
    needed = b * -(-(p + t) // plan.block_size)
    if needed > plan.kv_capacity_blocks:
        return f"KV cache: needs {needed} blocks, {plan.kv_capacity_blocks} fit"
    return ""


def _predict_group(
    conf: pd.DataFrame,
    model: ModelSpec,
    hw: HardwareSpec,
    layout: Parallelism,
    prec: Precision,
    engine: EngineSpec,
) -> tuple[np.ndarray, np.ndarray]:
    """(prefill step s, mean decode step s) of each configuration of one (model, TP)."""
    b = conf["batch_size"].to_numpy(dtype=float)
    p = conf["prompt_size"].to_numpy(dtype=float)
    t = conf["token_size"].to_numpy(dtype=int)
    window = model.attention.batch_window

    pre = BatchShape.prefill(batch_size=b, prompt_len=p, window=window)
    pre_step = step_cost(model, hw, layout, prec, pre, engine=engine)
    prefill = engine_step_time(
        pre_step, engine, num_tokens=pre.num_tokens, num_seqs=b, enforce_eager=True
    )

    # All decode steps of all configurations in one vectorised call, then a mean per config.
    steps = np.maximum(t - 1, 0)
    owner = np.repeat(np.arange(len(conf)), steps)
    first = np.repeat(np.cumsum(steps) - steps, steps)
    context = np.repeat(p, steps) + 1.0 + (np.arange(steps.sum()) - first)
    batch = np.repeat(b, steps)
    dec = BatchShape.decode(batch_size=batch, context_len=context, window=window)
    dec_step = step_cost(model, hw, layout, prec, dec, engine=engine)
    per_step = engine_step_time(
        dec_step, engine, num_tokens=batch, num_seqs=batch, enforce_eager=True
    )
    per_step = np.broadcast_to(per_step, context.shape)
    total = np.bincount(owner, weights=per_step, minlength=len(conf))
    decode = np.divide(total, steps, out=np.full(len(conf), np.nan), where=steps > 0)
    return np.broadcast_to(prefill, b.shape).astype(float), decode


def prefill_kinds(
    tokens: np.ndarray, hidden_size: int, tp: int, *, bytes_per_element: float = 2.0
) -> np.ndarray:
    """Kind of each prefill row of `tokens` tokens per step: "prefill", or `STEP_KIND` where its
    tensor-parallel all-reduce (tokens x hidden x element bytes per call) reaches
    `STEP_BYTES` at TP >= `STEP_MIN_TP` (see the module docstring)."""
    message = np.asarray(tokens, dtype=float) * hidden_size * bytes_per_element
    past = (message >= STEP_BYTES) & (tp >= STEP_MIN_TP)
    return np.where(past, STEP_KIND, "prefill")


def case_labels(conf: pd.DataFrame) -> pd.Series:
    """Labels "<model> tp<N> b<batch> p<prompt> o<output>" of Splitwise configurations."""
    return (
        conf["model_id"].fillna(conf["model"])
        + " tp"
        + conf["tensor_parallel"].astype(str)
        + " b"
        + conf["batch_size"].astype(str)
        + " p"
        + conf["prompt_size"].astype(str)
        + " o"
        + conf["token_size"].astype(str)
    )


def iteration_cases(
    hw: HardwareSpec,
    engine: EngineSpec,
    measured: pd.DataFrame,
    *,
    models: dict[str, ModelSpec] | None = None,
) -> pd.DataFrame:
    """Prefill and decode rows (suites iteration_prefill / iteration_decode) of every
    configuration of a Splitwise profile (as `data.splitwise` returns it) predicted on `hw`
    under `engine` in eager mode, its CPU costs on `hw`'s host CPU (`engine_on_host`);
    `models` maps catalogue ids to specs (default: load them).
    Skipped configurations are listed in `attrs["skipped"]` as "case: reason"."""
    engine = engine_on_host(engine, hw)
    conf = configurations(measured)
    specs = models or {m: load_model(m) for m in conf["model_id"].dropna().unique()}
    conf["case"] = case_labels(conf)
    skipped = [f"{c}: capped (prompt_time below a smaller batch's)" for c in conf.case[conf.capped]]
    frames = []
    for (model_id, tp), group in conf[~conf["capped"]].groupby(["model_id", "tensor_parallel"]):
        model = specs[str(model_id)]
        layout = Parallelism(tp=int(tp))
        layout.check(model, hw)
        prec = resolve_precision(model, hw, dtype="float16")
        reasons = [_fit_reason(model, hw, layout, prec, engine, r) for _, r in group.iterrows()]
        fits = np.array([r == "" for r in reasons], dtype=bool)
        skipped += [f"{c}: {r}" for c, r in zip(group["case"], reasons, strict=True) if r]
        group = group[fits]
        if group.empty:
            continue
        prefill, decode = _predict_group(group, model, hw, layout, prec, engine)
        base = group.assign(device=hw.id, engine=engine.id)
        frames += [
            base.assign(
                suite=PREFILL,
                kind=prefill_kinds(
                    group["batch_size"].to_numpy() * group["prompt_size"].to_numpy(),
                    model.hidden_size,
                    int(tp),
                    bytes_per_element=DTYPE_BYTES[prec.activations],
                ),
                case="prefill " + group["case"],
                predicted_s=prefill,
                measured_s=group["prompt_time"].to_numpy(dtype=float) / 1e3,
            ),
            base.assign(
                suite=DECODE,
                kind="decode",
                case="decode " + group["case"],
                predicted_s=decode,
                measured_s=group["token_time"].to_numpy(dtype=float) / 1e3,
            ),
        ]
    df = pd.concat(frames, ignore_index=True)
    df = df[np.isfinite(df["predicted_s"])]
    fit = df["model_id"].isin(ENGINE_FIT_MODELS) & (df["device"] == ENGINE_FIT_DEVICE)
    df.loc[fit, "suite"] = ENGINE_FIT
    df = pd.concat(
        [
            finish(g, suite=str(s), fitted=s == ENGINE_FIT)
            for s, g in df.groupby("suite", sort=False)
        ],
        ignore_index=True,
    )
    df.attrs["skipped"] = skipped
    return df


def iteration_suite(engine: EngineSpec | None = None) -> pd.DataFrame:
    """The iteration suites on Splitwise's DGX-A100 and DGX-H100 profiles, each on its device
    (`a100_sxm_80gb`, `h100_sxm`; engine `vllm-0.2` unless given): held-out prefill and decode
    rows, and the rows the engine was fitted to. `attrs["skipped"]` lists what was left out."""
    eng = engine or load_engine(ENGINE)
    frames, skipped = [], []
    for device in data.SPLITWISE_FILES:
        df = iteration_cases(load_hardware(device), eng, data.splitwise(device))
        frames.append(df)
        # The other suites that skip DGX-A100 cases (power) name them without the device.
        prefix = "" if device == ENGINE_FIT_DEVICE else f"{device} "
        skipped += [prefix + case for case in df.attrs["skipped"]]
    df = pd.concat(frames, ignore_index=True)
    df.attrs["skipped"] = skipped
    return df
