"""The engine flags the `llmsim bench` commands share, spelled as in `vllm bench`, and the one
function that turns their parsed values into an `EngineArgs`.

Typer needs each flag in each command's signature; passing them on happens once, in
`engine_args`, which reads the parsed values by parameter name: a command's parameter for
an `EngineArgs` field must carry the field's name.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from simulator.cli.common import note, write_json
from simulator.errors import SpecError, did_you_mean

if TYPE_CHECKING:
    from simulator.specs.engine_args import EngineArgs
    from simulator.specs.offload import OffloadSpec

ModelOpt = Annotated[str, typer.Option("--model", help="model id or path to config.json")]
TpOpt = Annotated[int, typer.Option("--tensor-parallel-size", "-tp")]
PpOpt = Annotated[int, typer.Option("--pipeline-parallel-size", "-pp")]
CpOpt = Annotated[
    int,
    typer.Option(
        "--context-parallel-size",
        "-cp",
        help="context-parallel ranks of tp x pp GPUs: every prompt's tokens and KV split "
        "over them (GPUs = tp x pp x cp)",
    ),
]
DpOpt = Annotated[
    int,
    typer.Option(
        "--data-parallel-size",
        "-dp",
        help="replicas (with --enable-expert-parallel: DP-attention ranks of one replica)",
    ),
]
DtypeOpt = Annotated[str, typer.Option("--dtype")]
QuantOpt = Annotated[
    str | None,
    typer.Option(
        "--quantization",
        "-q",
        help="weight format: fp8, int8, int4, fp4, or gguf:TYPE (a GGUF file type such as "
        "gguf:Q4_K_M); default: the checkpoint's own",
    ),
]
KvDtypeOpt = Annotated[
    str,
    typer.Option(
        "--kv-cache-dtype",
        help="auto, fp8 (vLLM's), int4 (COMET's KV4) or int2 (KIVI); docs/long-context.md",
    ),
]
KvBudgetOpt = Annotated[
    int | None,
    typer.Option(
        "--kv-budget",
        min=1,
        help="tokens of KV each sequence keeps once its prompt is in (turns prefix caching "
        "off unless it is set); docs/long-context.md",
    ),
]


ShadowKvOpt = Annotated[
    bool,
    typer.Option(
        "--shadowkv",
        help="ShadowKV: low-rank keys on the GPU, values in host memory, sparse decode over "
        "the host link (no vLLM flag); docs/long-context.md",
    ),
]
ShadowKvRankOpt = Annotated[
    int | None, typer.Option("--shadowkv-rank", min=1, help="rank of the keys [160]")
]
ShadowKvBudgetOpt = Annotated[
    int | None,
    typer.Option("--shadowkv-budget", min=1, help="tokens a decode attends to [2048]"),
]
ShadowKvChunkOpt = Annotated[
    int | None, typer.Option("--shadowkv-chunk", min=1, help="tokens per landmark chunk [8]")
]
SwiftKvOpt = Annotated[
    float | None,
    typer.Option(
        "--swiftkv-layers",
        min=0.0,
        max=0.99,
        help="SwiftKV: fraction of the last layers prompt tokens skip (only their KV "
        "projections run; no vLLM flag); docs/long-context.md",
    ),
]
AcrossKvOpt = Annotated[
    int | None,
    typer.Option(
        "--acrosskv", min=1, help="with --swiftkv-layers: skipped layers sharing one KV [1]"
    ),
]


def kv_technique_args(params: dict[str, Any]) -> dict[str, Any]:
    """EngineArgs' `shadowkv` and `swiftkv` from the flags above (SpecError for a setting
    without the flag that turns its technique on)."""
    out: dict[str, Any] = {}
    shadow = {
        key: params.get(f"shadowkv_{key}")
        for key in ("rank", "budget", "chunk")
        if params.get(f"shadowkv_{key}") is not None
    }
    if params.get("shadowkv_on"):
        out["shadowkv"] = shadow
    elif shadow:
        key = next(iter(shadow))
        raise SpecError("needs --shadowkv", field=f"shadowkv_{key}")
    layers, across = params.get("swiftkv_layers"), params.get("acrosskv")
    if layers is not None:
        out["swiftkv"] = {"skip_fraction": layers, "across": across or 1}
    elif across is not None:
        raise SpecError("needs --swiftkv-layers", field="acrosskv")
    return out


class KvEviction(str, Enum):
    snapkv = "snapkv"
    h2o = "h2o"
    streaming = "streaming"


KvEvictionOpt = Annotated[
    KvEviction,
    typer.Option("--kv-eviction", help="what --kv-budget keeps: SnapKV, H2O or StreamingLLM"),
]
EngineOpt = Annotated[str, typer.Option("--engine")]
EagerOpt = Annotated[bool, typer.Option("--enforce-eager")]
MaxModelLenOpt = Annotated[
    int | None,
    typer.Option(
        "--max-model-len",
        min=1,
        help="longest request served (prompt + output); default: the model's context length",
    ),
]
AsyncOpt = Annotated[
    bool,
    typer.Option(
        "--async-scheduling/--no-async-scheduling",
        help="schedule and prepare the next step while the GPU runs this one (vLLM V1)",
    ),
]
HostCpuOpt = Annotated[
    str | None,
    typer.Option(
        "--host-cpu",
        help="the node's CPU where it is not the hardware's (llmsim hardware cpus lists them); "
        "the engine's CPU costs scale by single-thread speed",
    ),
]
OverlapTpOpt = Annotated[
    bool,
    typer.Option(
        "--overlap-tp-comm/--no-overlap-tp-comm",
        help="fuse each tensor-parallel all-reduce with the GEMM producing its input "
        "(T3-style): it runs under that GEMM",
    ),
]
NanoOpt = Annotated[
    int | None,
    typer.Option(
        "--nano-batches",
        min=1,
        max=16,
        help="split each step into N nano-batches whose compute, memory and network kernels "
        "overlap (NanoFlow); default: the engine profile's (nanoflow: 2, others: 1)",
    ),
]
PdPartitionOpt = Annotated[
    str | None,
    typer.Option(
        "--pd-partition",
        help="intra-GPU prefill/decode partitioning (Nexus): a prefill and a decode stream run "
        "at once on shares of the SMs over one KV cache; static:SHARE (the prefill stream's SM "
        "share, 0-1) or dynamic:TBT_MS (decode gets the least SMs meeting that TBT); then "
        ",prefill=spf (the prefill queue shortest prompt first) and, dynamic, ,hysteresis=H "
        "(the decode share falls only to one within (1-H) x the TBT)",
    ),
]
EnableLoraOpt = Annotated[
    bool,
    typer.Option("--enable-lora", help="serve LoRA adapters on the base model (docs/lora.md)"),
]
MaxLorasOpt = Annotated[
    int | None,
    typer.Option("--max-loras", help="most distinct adapters in one batch (vLLM's default: 1)"),
]
MaxLoraRankOpt = Annotated[
    int | None,
    typer.Option(
        "--max-lora-rank", help="rank of the adapter slots (8, 16, 32, ... 512; default 16)"
    ),
]
MaxCpuLorasOpt = Annotated[
    int | None,
    typer.Option("--max-cpu-loras", help="adapters cached in host memory (default: --max-loras)"),
]
NumLoraAdaptersOpt = Annotated[
    int | None,
    typer.Option(
        "--num-lora-adapters",
        min=1,
        help="each request names one of this many adapters (needs --enable-lora)",
    ),
]


class LoraPopularity(str, Enum):
    uniform = "uniform"
    zipf = "zipf"


LoraPopularityOpt = Annotated[
    LoraPopularity,
    typer.Option("--lora-popularity", help="how requests pick adapters: uniform or zipf"),
]
LoraZipfAlphaOpt = Annotated[
    float, typer.Option("--lora-zipf-alpha", help="zipf: adapter i weighs 1 / (i + 1) ** alpha")
]


def adapter_mix(
    num: int | None, popularity: LoraPopularity, alpha: float
) -> dict[str, object] | None:
    """The workload's `adapters` from the --num-lora-adapters, --lora-popularity and
    --lora-zipf-alpha flags (None without a number of adapters)."""
    if num is None:
        return None
    return {"num_adapters": num, "distribution": popularity.value, "alpha": alpha}


GmuOpt = Annotated[float | None, typer.Option("--gpu-memory-utilization")]
SeqsOpt = Annotated[int | None, typer.Option("--max-num-seqs")]
TokensOpt = Annotated[int | None, typer.Option("--max-num-batched-tokens")]
ChunkedOpt = Annotated[
    bool | None, typer.Option("--enable-chunked-prefill/--no-enable-chunked-prefill")
]
OutJsonOpt = Annotated[str | None, typer.Option("--output-json")]
TokenizerOpt = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        help="with --dataset-name sharegpt --dataset-path: a local tokenizer.json (or its "
        "folder) that counts the file's tokens",
    ),
]
SaveResultOpt = Annotated[
    bool,
    typer.Option("--save-result", help="write the metrics to --result-dir as vLLM names them"),
]
ResultDirOpt = Annotated[str | None, typer.Option("--result-dir", help="default: here")]
ResultFileOpt = Annotated[
    str | None,
    typer.Option(
        "--result-filename",
        help="default: vLLM's {backend}-{rate}qps[-concurrency{C}]-{model}-{time}.json",
    ),
]


class SchedulingPolicy(str, Enum):
    fcfs = "fcfs"
    priority = "priority"


class PreemptionMode(str, Enum):
    recompute = "recompute"
    swap = "swap"


PolicyOpt = Annotated[
    SchedulingPolicy | None,
    typer.Option("--scheduling-policy", help="queue order (priority: the workload's classes)"),
]
PreemptOpt = Annotated[
    PreemptionMode | None,
    typer.Option("--preemption-mode", help="on KV exhaustion: recompute, or swap to host"),
]
SwapOpt = Annotated[float, typer.Option("--swap-space", help="host swap space per GPU, GiB")]
StepsOpt = Annotated[
    int | None,
    typer.Option(
        "--num-scheduler-steps",
        min=1,
        help="vLLM V0 multi-step scheduling: decode steps per scheduler call (--engine vllm-0.6)",
    ),
]
StreamStepsOpt = Annotated[
    bool | None,
    typer.Option(
        "--multi-step-stream-outputs/--no-multi-step-stream-outputs",
        help="with multi-step scheduling, return each step's tokens as it ends (vLLM >= 0.6.2's "
        "default); --no-...: a block's tokens at the block's end, as vLLM 0.6.0-0.6.1 did",
    ),
]


class OffloadingBackend(str, Enum):
    native = "native"
    lmcache = "lmcache"


class KvPoolMode(str, Enum):
    off = "off"
    distributed = "distributed"


KvPoolOpt = Annotated[
    KvPoolMode,
    typer.Option(
        "--kv-pool",
        help="distributed: the -dp replicas pool their KV caches, a full one borrowing others' "
        "free blocks (Infinite-LLM; no vLLM flag)",
    ),
]
KvOffloadSizeOpt = Annotated[
    float | None,
    typer.Option(
        "--kv-offloading-size",
        help="GiB of host memory per replica for KV blocks evicted from the GPU (vLLM's flag; "
        "needs prefix caching)",
    ),
]
KvOffloadBackendOpt = Annotated[
    OffloadingBackend | None,
    typer.Option(
        "--kv-offloading-backend",
        help="native: a hit loads between steps, the request waits (default); lmcache: before "
        "the step, the batch waits",
    ),
]
EpOpt = Annotated[
    bool,
    typer.Option(
        "--enable-expert-parallel",
        help="MoE experts over EP ranks; with -dp N: N DP-attention ranks, EP = tp x N",
    ),
]
MicroBatchOpt = Annotated[
    bool,
    typer.Option(
        "--pipeline-micro-batching/--no-pipeline-micro-batching",
        help="with -pp > 1: up to pp batches in flight (vLLM V1); default: one at a time",
    ),
]
PrefixCachingOpt = Annotated[
    bool | None,
    typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        help="reuse the KV blocks of shared prompt prefixes (vLLM's automatic prefix caching); "
        "default: the engine's (on in vLLM V1, SGLang, TensorRT-LLM)",
    ),
]
CpuOffloadOpt = Annotated[
    float,
    typer.Option(
        "--cpu-offload-gb", help="GiB of weights per GPU kept in host memory, streamed each step"
    ),
]
OffloadConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--offload-config",
        help='JSON: {"resident_layers": N, "source": "host"|"nvme", "transfer": '
        '"prefetch"|"uva"|"sync", "host_memory_bytes": "128 GB", "expert_offload": '
        '{"cache_fraction": F, "hit_rate": H, "zipf_skew": S, "cpu_compute": true}}',
    ),
]
SpecOpt = Annotated[
    str | None,
    typer.Option(
        "--speculative-config",
        help='vLLM\'s JSON ({"method": "eagle", "num_speculative_tokens": 3, ...}) plus '
        "acceptance_rate or acceptance_rates",
    ),
]


def engine_args(ctx: typer.Context) -> EngineArgs:
    """The EngineArgs of a bench command's parsed flags: each field from the parameter of the
    same name (a choice as its value); a field the command has no flag for keeps its default."""
    from simulator.specs.engine_args import EngineArgs

    names = {field.name for field in dataclasses.fields(EngineArgs)}
    values = {
        name: value.value if isinstance(value, Enum) else value
        for name, value in ctx.params.items()
        if name in names
    }
    return EngineArgs(**(values | kv_technique_args(ctx.params)))


def save_result(
    summary: dict[str, Any],
    *,
    result_dir: str | None,
    result_filename: str | None,
    setup: dict[str, Any],
) -> Path:
    """vLLM's --save-result: the serve metrics with the run's setup (`setup`: backend,
    model_id, num_prompts, request_rate, burstiness, max_concurrency) and the date, in
    `result_dir` (default: the working directory) under `result_filename` or vLLM's
    default name."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    if result_filename is None:
        concurrency = setup["max_concurrency"]
        tail = f"-concurrency{concurrency}" if concurrency is not None else ""
        model = str(setup["model_id"]).rstrip("/").split("/")[-1]
        rate = f"{setup['request_rate']}qps"
        if "ramp_up_strategy" in setup:  # vLLM's name under a ramp-up
            rate = (
                f"ramp-up-{setup['ramp_up_strategy']}-{setup['ramp_up_start_rps']}qps-"
                f"{setup['ramp_up_end_rps']}qps"
            )
        result_filename = f"{setup['backend']}-{rate}{tail}-{model}-{stamp}.json"
    path = Path(result_dir or ".") / result_filename
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(str(path), {"date": stamp, **setup, **summary})
    return path


def parse_offload_flag(text: str | None) -> OffloadSpec | None:
    """--offload-config as an OffloadSpec (None when not given); bad JSON is a SpecError."""
    from simulator.specs.offload import parse_offload

    return parse_offload(text, source="--offload-config") if text else None


# vLLM benchmark flags about the client, the tokenizer or warm-up, not the engine: accepted so
# that a `vllm bench` command line runs as it is, with no effect on the prediction. True: the
# flag takes a value. (--ignore-eos is `bench serve`'s own option: it changes the lengths.)
NOOP_FLAGS = {
    "--backend": True,
    "--endpoint": True,
    "--endpoint-type": True,
    "--base-url": True,
    "--host": True,
    "--port": True,
    "--tokenizer": True,
    "--tokenizer-mode": True,
    "--label": True,
    "--num-warmups": True,
    "--num-iters-warmup": True,
    "--served-model-name": True,
    "--request-id-prefix": True,
    "--ready-check-timeout-sec": True,
    "--append-result": False,
    "--profile": False,
    "--disable-tqdm": False,
    "--trust-remote-code": False,
    "--disable-detokenize": False,
    "--save-detailed": False,
}
# A bench command's context: arguments it has no parameter for reach `ignored_flags`.
PASS_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


def ignored_flags(ctx: typer.Context) -> None:
    """Accept vLLM's client-side flags among the command's extra arguments (NOOP_FLAGS) with
    one note on stderr naming them; anything else is a SpecError."""
    args, names, i = list(ctx.args), [], 0
    while i < len(args):
        name, eq, _ = args[i].partition("=")
        if name not in NOOP_FLAGS:
            flags = [o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts)]
            hint = did_you_mean(name, [*flags, *NOOP_FLAGS])
            raise SpecError(f"no such option: {args[i]}{hint}", field=ctx.info_name or "")
        takes_value = NOOP_FLAGS[name] and not eq
        if takes_value and (i + 1 >= len(args) or args[i + 1].startswith("--")):
            raise SpecError(f"{name} needs a value", field=ctx.info_name or "")
        names.append(name)
        i += 2 if takes_value else 1
    if names:
        note(f"no effect on the prediction: {', '.join(names)} (vLLM client flags)")


# Sources of the SpecErrors raised while a bench command validates the scenario its flags make.
BENCH_SOURCES = frozenset({"bench", "bench serve"})
# Fields the checks before a run name without a source (the run's size, its step budget).
_SIZE_FIELDS = frozenset(
    {"workload.num_prompts", "max_num_batched_tokens", "batch_size", "num_iters", "input_len"}
)


def flag_error(exc: SpecError, flags: set[str]) -> SpecError:
    """`exc` with its scenario field named as the bench command's flag (one of `flags`) that
    set it, where there is one: `replicas.0.count` is --data-parallel-size,
    `dataset.random.input_len` --random-input-len (serve) or --input-len (throughput)."""
    if exc.source not in BENCH_SOURCES and not (exc.source == "" and _SIZE_FIELDS & {exc.field}):
        return exc
    for flag in _flag_candidates(exc.field):
        if flag in flags:
            return SpecError(exc.reason, field=flag)
    return exc


_ADAPTER_FLAGS = {
    "num_adapters": "--num-lora-adapters",
    "distribution": "--lora-popularity",
    "alpha": "--lora-zipf-alpha",
}


def _flag_candidates(field: str) -> list[str]:
    """The flags that may have set scenario `field`, most likely first."""
    keys = field.split(".")
    if keys == ["replicas", "0", "count"]:
        return ["--data-parallel-size"]
    if keys == ["replicas", "0", "swap_space_gib"]:
        return ["--swap-space"]
    if keys[:1] == ["workload"]:
        keys = keys[1:]
    if keys[:1] == ["adapters"] and len(keys) == 2:  # the workload's LoRA adapter mix
        return [_ADAPTER_FLAGS[keys[1]]]
    if keys[:3] in (["replicas", "0", "scheduler"], ["replicas", "0", "lora"]):
        keys = keys[3:]
    elif keys[:2] == ["replicas", "0"]:
        keys = keys[2:]
    elif keys[:1] in (["sampling"], ["workload"]):
        keys = keys[1:]
    elif keys[:1] == ["dataset"]:  # only the random dataset's lengths have flags
        if keys[:2] != ["dataset", "random"] or len(keys) != 3:
            return []
        return [f"--random-{keys[2]}".replace("_", "-"), f"--{keys[2]}".replace("_", "-")]
    return [f"--{keys[0]}".replace("_", "-")] if len(keys) == 1 else []
