"""Weight formats per linear layer: what a real checkpoint stores each matrix in.

Real checkpoints mix formats. Meta's FP8 Llama 3.1 405B quantises only the MLPs of layers 1-124
and keeps attention, the first and last layers and the LM head in bf16; ModelOpt,
compressed-tensors, AWQ and FBGEMM configs carry lists of modules left unquantised; a GGUF file
of a "mostly" type (Q4_K_M) stores some tensors in more bits (Q6_K) than the rest. A
`WeightFormats` says, for each linear of each layer, which format it is in: a default and rules
that override it for named linears, in all layers or in listed ones (the last matching rule
wins).

Linears are named by their Hugging Face modules: `embed` (the token embedding), `q`, `k`, `v`,
`o` (attention), `gate`, `up`, `down` (the MLP, and the experts and shared experts of a MoE
layer) and `lm_head`. MLA attention's projections take the names `q` (q_proj, or q_a_proj and
q_b_proj), `k` (kv_a_proj_with_mqa) and `v` (kv_b_proj).

Sources (bytes per weight of each format, and which tensors a GGUF type keeps in more bits):
  [G1] ggml-org/llama.cpp ggml/src/ggml-common.h: the block structs and their static_asserts:
       block_q4_0 = fp16 scale + 16 bytes of nibbles = 18 bytes per 32 weights; block_q4_1 = 20
       (scale and min); block_q5_0 = 22 (+ 4 bytes of 5th bits); block_q5_1 = 24; block_q8_0 =
       34 per 32; block_q4_K = 144 per 256 (d, dmin, 12 bytes of 6-bit scales, 128 of nibbles);
       block_q5_K = 176 per 256 (+ 32 bytes of 5th bits); block_q6_K = 210 per 256 (128 + 64
       bytes of quants, 16 int8 scales, fp16 d).
  [G2] ggml-org/llama.cpp@007dbbf3 src/llama-quant.cpp, llama_tensor_get_type_impl: the output
       tensor (and a tied token embedding) goes to Q6_K unless the file type's base is Q8_0;
       attn_v and ffn_down go to Q6_K in Q4_K_M and Q5_K_M where use_more_bits(i, n) (i < n/8,
       i >= 7n/8, or (i - n/8) % 3 == 2: about half the layers); Q4_K_S puts attn_v of the
       first 4 layers and ffn_down of the first n/8 in Q5_K; a 70B Llama (80 layers) lifts a
       Q4_K attn_v to Q5_K; an 8-expert model (Mixtral) keeps attn_v and attn_k in Q8_0 and,
       in Q4_K_S/M, attn_output in Q5_K. The base type of each file type: llama_model_quantize_impl.
  [A1] AWQ / GPTQ: 4-bit weights with one fp16 scale per group of 128 (their default group size;
       vLLM's Marlin kernels read the same layout).
  [N1] NVFP4: one fp8 (E4M3) scale per block of 16 e2m1 values, plus one fp32 scale per tensor
       (NVIDIA technical blog "Introducing NVFP4 for Efficient and Accurate Low-Precision
       Inference", 2025-06-24); the per-tensor scale is negligible.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Literal, get_args

from pydantic import Field

from simulator.specs._base import Frozen

GgufFormat = Literal["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"]
WeightDtype = Literal[
    "fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4",
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k",
]  # fmt: skip
UNQUANTISED = ("fp32", "bf16", "fp16")

INT4_GROUP_SIZE = 128  # [A1]
FP4_BLOCK_SIZE = 16  # [N1]
# Storage bytes per weight, block scales included.
BYTES_PER_WEIGHT: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,  # per-channel or per-tensor scales: negligible
    "int8": 1.0,
    "int4": 0.5 + 2.0 / INT4_GROUP_SIZE,  # [A1]
    "fp4": 0.5 + 1.0 / FP4_BLOCK_SIZE,  # [N1]
    "q4_0": 18 / 32,  # [G1]
    "q4_1": 20 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
    "q8_0": 34 / 32,
    "q4_k": 144 / 256,
    "q5_k": 176 / 256,
    "q6_k": 210 / 256,
}

LinearName = Literal["embed", "q", "k", "v", "o", "gate", "up", "down", "lm_head"]
LINEARS: tuple[LinearName, ...] = get_args(LinearName)
LAYERLESS = ("embed", "lm_head")  # not in a decoder layer


def bytes_per_weight(fmt: str) -> float:
    """Storage bytes per weight of `fmt`, its block scales included."""
    return BYTES_PER_WEIGHT[fmt]


class FormatRule(Frozen):
    """`linears` (in `layers`, or in every layer when None) are stored in `format`."""

    linears: tuple[LinearName, ...] = Field(min_length=1)
    format: WeightDtype
    layers: tuple[int, ...] | None = None


class WeightFormats(Frozen):
    """Which format each linear of each layer is stored in: `default`, overridden by `rules`
    (the last that matches wins). `source` says where it was read from."""

    default: WeightDtype
    rules: tuple[FormatRule, ...] = ()
    source: str = ""

    def format_of(self, linear: LinearName, layer: int | None = None) -> str:
        """The format of `linear` in `layer` (None for the embedding and the LM head)."""
        found: str = self.default
        for rule in self.rules:
            if linear in rule.linears and (
                rule.layers is None or (layer is not None and layer in rule.layers)
            ):
                found = rule.format
        return found

    def resolved(self, activations: str) -> WeightFormats:
        """These formats with every unquantised one (fp32, bf16, fp16) read as `activations`:
        what an engine serving at that dtype holds."""

        def act(fmt: str) -> str:
            return activations if fmt in UNQUANTISED else fmt

        return self.model_copy(
            update={
                "default": act(self.default),
                "rules": tuple(r.model_copy(update={"format": act(r.format)}) for r in self.rules),
            }
        )

    def layer_bytes(self, linear: LinearName, num_layers: int) -> tuple[float, ...]:
        """Bytes per weight of `linear` in each of `num_layers` layers."""
        return _layer_bytes(self, linear, num_layers)

    def formats(self) -> set[str]:
        """Every format a linear may be stored in."""
        return {self.default, *(r.format for r in self.rules)}


@lru_cache(maxsize=4096)
def _layer_bytes(formats: WeightFormats, linear: LinearName, num_layers: int) -> tuple[float, ...]:
    return tuple(bytes_per_weight(formats.format_of(linear, i)) for i in range(num_layers))


@lru_cache(maxsize=4096)
def _mix(
    formats: WeightFormats, parts: tuple[tuple[LinearName, float], ...], layers: tuple[int, int]
) -> tuple[float, str]:
    """(mean bytes per weight, the format holding the most weights) of a GEMM whose weight is
    the concatenation of `parts` (linear, fraction of the weights), over layers [start, stop)."""
    start, stop = layers
    share: dict[str, float] = {}
    count = max(stop - start, 0)
    for linear, fraction in parts:
        indices: Iterable[int | None] = (
            [None] if linear in LAYERLESS or count == 0 else range(start, stop)
        )
        n = 1 if linear in LAYERLESS or count == 0 else count
        for i in indices:
            fmt = formats.format_of(linear, i)
            share[fmt] = share.get(fmt, 0.0) + fraction / n
    main = max(share, key=lambda f: share[f])
    if len(share) == 1:  # one format: its bytes exactly, whatever the shares sum to in floats
        return bytes_per_weight(main), main
    total = sum(share.values())
    return sum(s * bytes_per_weight(f) for f, s in share.items()) / total, main


def mix(
    formats: WeightFormats, parts: Mapping[LinearName, float], layers: tuple[int, int]
) -> tuple[float, str]:
    """(mean bytes per weight, main format) of a GEMM over `parts` in layers [start, stop):
    the mean over the layers of each part's bytes weighted by its share of the GEMM's weights,
    and the format most of those weights are in (its compute dtype prices the GEMM)."""
    return _mix(formats, tuple(parts.items()), layers)


# -- ignore lists of Hugging Face quantization configs -------------------------------------
def _matches(pattern: str, name: str) -> bool:
    """Whether a config's module pattern names module `name`: `re:` a regular expression
    matched at the start (compressed-tensors), a glob with * or ? (ModelOpt), else a module
    path that is `name` or contains it on dot boundaries (`lm_head`, `model.layers.0`,
    `self_attn`, `model.layers.3.self_attn`). A trailing `.weight` is ignored."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    pattern = pattern.removesuffix(".weight")
    return f".{pattern}." in f".{name}."


def _module_names(linear: LinearName, layer: int | None, *, moe: bool, mla: bool) -> list[str]:
    """Hugging Face module paths of `linear` in `layer` (a MoE layer's experts by their first)."""
    if linear == "embed":
        return ["model.embed_tokens"]
    if linear == "lm_head":
        return ["lm_head"]
    base = f"model.layers.{layer}"
    attn = {
        "q": ["q_a_proj", "q_b_proj", "q_proj"] if mla else ["q_proj"],
        "k": ["kv_a_proj_with_mqa"] if mla else ["k_proj"],
        "v": ["kv_b_proj"] if mla else ["v_proj"],
        "o": ["o_proj"],
    }
    if linear in attn:
        return [f"{base}.self_attn.{p}" for p in attn[linear]]
    proj = f"{linear}_proj"
    if moe:
        return [f"{base}.mlp.experts.0.{proj}", f"{base}.mlp.shared_experts.{proj}"]
    return [f"{base}.mlp.{proj}"]


def check_patterns(patterns: object, key: str) -> list[str]:
    """`patterns` as a list of module names; ValueError naming `key` if it is not one, or if a
    `re:` pattern is no regular expression."""
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ValueError(f"{key} must be a list of module names, got {patterns!r}")
    for p in patterns:
        if p.startswith("re:"):
            try:
                re.compile(p[3:])
            except re.error as exc:
                raise ValueError(f"{key}: {p!r} is not a regular expression ({exc})") from None
    return patterns


def from_ignore_list(
    quantised: WeightDtype,
    unquantised: WeightDtype,
    patterns: Sequence[str],
    *,
    num_layers: int,
    moe_layers: Sequence[bool],
    mla: bool,
    source: str,
) -> WeightFormats:
    """Formats of a checkpoint whose linears are `quantised` except the modules `patterns`
    name (and the embedding and LM head, which these methods leave in `unquantised` unless a
    pattern-free config quantises them: vLLM's FP8, ModelOpt, compressed-tensors, AWQ and GPTQ
    linear methods do not replace them)."""
    rules = [FormatRule(linears=("embed", "lm_head"), format=unquantised)]
    for linear in LINEARS:
        if linear in LAYERLESS:
            continue
        skipped = tuple(
            i
            for i in range(num_layers)
            if any(
                _matches(p, name)
                for p in patterns
                for name in _module_names(linear, i, moe=moe_layers[i], mla=mla)
            )
        )
        if skipped:
            every = len(skipped) == num_layers
            rules.append(
                FormatRule(linears=(linear,), format=unquantised, layers=None if every else skipped)
            )
    return WeightFormats(default=quantised, rules=_merged(rules), source=source)


def _merged(rules: list[FormatRule]) -> tuple[FormatRule, ...]:
    """`rules` with those of equal format and layers joined into one."""
    out: list[FormatRule] = []
    for rule in rules:
        same = next(
            (i for i, r in enumerate(out) if (r.format, r.layers) == (rule.format, rule.layers)),
            None,
        )
        if same is None:
            out.append(rule)
        else:
            prev = out[same]
            out[same] = prev.model_copy(update={"linears": prev.linears + rule.linears})
    return tuple(out)


# -- GGUF file types ------------------------------------------------------------------------
# llama.cpp's file types ("mostly" types) and the base type of their tensors [G2]
GGUF_TYPES: dict[str, WeightDtype] = {
    "F16": "fp16",
    "BF16": "bf16",
    "Q4_0": "q4_0",
    "Q4_1": "q4_1",
    "Q5_0": "q5_0",
    "Q5_1": "q5_1",
    "Q8_0": "q8_0",
    "Q4_K_S": "q4_k",
    "Q4_K_M": "q4_k",
    "Q5_K_S": "q5_k",
    "Q5_K_M": "q5_k",
    "Q6_K": "q6_k",
}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers that get more bits in the _M types [G2]."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def gguf_formats(
    file_type: str, *, num_layers: int, num_experts: int = 1, tied_embeddings: bool = False
) -> WeightFormats:
    """The formats llama.cpp's `llama-quantize` gives a model's tensors for a file type such
    as Q4_K_M [G2] (without an importance matrix, without --pure or per-tensor overrides).
    ValueError naming the known types for an unknown one."""
    name = file_type.upper()
    base = GGUF_TYPES.get(name)
    if base is None:
        raise ValueError(f"unknown GGUF type {file_type!r} (known: {', '.join(GGUF_TYPES)})")
    source = f"gguf {name}"
    if base in UNQUANTISED:
        return WeightFormats(default=base, source=source)
    n = num_layers
    rules: list[FormatRule] = []
    output: WeightDtype = "q8_0" if base == "q8_0" else "q6_k"
    rules.append(
        FormatRule(linears=("lm_head", "embed") if tied_embeddings else ("lm_head",), format=output)
    )

    def layers(pred: Callable[[int], bool]) -> tuple[int, ...]:
        return tuple(i for i in range(n) if pred(i))

    v: dict[int, WeightDtype] = {}
    if name in ("Q4_K_M", "Q5_K_M"):
        v = {i: "q6_k" for i in layers(lambda i: use_more_bits(i, n))}
    elif name == "Q4_K_S":
        v = {i: "q5_k" for i in range(min(4, n))}
    if n == 80:  # llama.cpp's LLM_TYPE_70B: a Q4_K attn_v is lifted to Q5_K
        v = {i: v.get(i, base) for i in range(n)}
        v = {i: ("q5_k" if f == "q4_k" else f) for i, f in v.items()}
    if num_experts == 8:  # Mixtral: attn_v and attn_k in Q8_0
        v = {i: "q8_0" for i in range(n)}
        rules.append(FormatRule(linears=("k",), format="q8_0"))
        if name in ("Q4_K_S", "Q4_K_M"):
            rules.append(FormatRule(linears=("o",), format="q5_k"))
    for fmt in sorted(set(v.values())):
        picked = tuple(i for i, f in v.items() if f == fmt)
        rules.append(FormatRule(linears=("v",), format=fmt, layers=picked))
    down: tuple[int, ...] = ()
    if name in ("Q4_K_M", "Q5_K_M"):
        down = layers(lambda i: use_more_bits(i, n))
        rules.append(FormatRule(linears=("down",), format="q6_k", layers=down))
    elif name == "Q4_K_S":
        down = tuple(range(n // 8))
        rules.append(FormatRule(linears=("down",), format="q5_k", layers=down))
    return WeightFormats(
        default=base, rules=tuple(r for r in rules if r.layers != ()), source=source
    )


def parse_gguf(quantization: str) -> str | None:
    """The GGUF file type of a `--quantization gguf:TYPE` value; None for any other value."""
    head, sep, tail = quantization.partition(":")
    return tail if sep and head.lower() == "gguf" else None
