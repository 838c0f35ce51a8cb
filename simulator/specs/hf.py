"""Read a Hugging Face `config.json` into a ModelSpec.

Knows the key spellings of the Llama/Mistral/Qwen family, Mixtral, Qwen-MoE, DeepSeek-V2/V3
and BLOOM; other decoder-only configs that use the Llama key names work too. Anything the
cost model needs but the config lacks is an error naming the key.
"""

from __future__ import annotations

from typing import Any, Literal

from simulator.errors import did_you_mean
from simulator.specs.model import MLP, CCAttention, GQAttention, MLAttention, ModelSpec, MoE
from simulator.specs.weights import WeightFormats, check_patterns, from_ignore_list

_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_ALIASES = {  # our name -> config keys tried in order
    "hidden_size": ("hidden_size", "n_embd", "n_embed", "d_model"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads"),
}
_GATED_ACTS = {"silu", "swiglu", "swish"}

# Every top-level key `from_hf_config` reads. A config key one edit away from one of these,
# with that one absent, is a typo: left alone it would be ignored and the model silently
# changed (`num_key_value_head: 8` would leave every head a KV head: 4x the KV bytes).
READ_KEYS = frozenset(
    {"_name_or_path", "model_type", "torch_dtype", "dtype", "hidden_size", "n_embd", "n_embed",
     "d_model", "num_hidden_layers", "n_layer", "num_layers", "num_attention_heads", "n_head",
     "num_heads", "num_key_value_heads", "head_dim", "kv_lora_rank", "q_lora_rank",
     "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "attention_bias",
     "use_sliding_window", "sliding_window", "hidden_act", "activation_function",
     "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "mlp_bias",
     "num_local_experts", "n_routed_experts", "num_experts", "moe_intermediate_size",
     "n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace",
     "mlp_only_layers", "decoder_sparse_step", "moe_layer_freq", "num_experts_per_tok",
     "quantization_config", "alibi", "tie_word_embeddings", "max_position_embeddings",
     "seq_length", "n_positions", "vocab_size", "layer_types", "sliding_window_pattern",
     "max_window_layers", "cca_time0", "cca_time1", "cca_compression"}
)  # fmt: skip
# Hugging Face keys of other meanings that are one edit away from a key read above: never
# typos (MPT's n_heads and n_layers, GPT-2's n_ctx, and plural or singular forms in use).
OTHER_HF_KEYS = frozenset(
    {"n_heads", "n_layers", "n_embed_dim", "num_expert", "num_key_value_head_dim", "head_dims",
     "max_seq_length", "model_types", "dtypes", "n_ctx", "n_experts", "n_shared_expert",
     "num_layer", "sliding_windows", "alibi_bias", "mlp_biases"}
)  # fmt: skip

# Architectures whose MLP width is 4 x hidden unless the config says otherwise, as their
# transformers config documents it (GPT-2 and GPT-BigCode `n_inner`, Falcon
# `ffn_hidden_size`: None means 4 * hidden; BLOOM has no such key, its MLP is always 4x).
# Every other architecture must give its MLP width.
_FOUR_X_MLP = frozenset({"gpt2", "gpt_bigcode", "falcon", "bloom"})
# Position schemes without a table of positions: no max_position_embeddings to read (BLOOM,
# MPT); the context length then defaults to 4096. Every other architecture must give it.
_ALIBI_TYPES = frozenset({"bloom", "mpt"})


def _one_edit(a: str, b: str) -> bool:
    """Whether `a` becomes `b` by one insertion, deletion, substitution or swap of neighbours."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return len(diff) == 1 or (
            len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
            and a[diff[1]] == b[diff[0]]
        )  # fmt: skip
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((k for k, (x, y) in enumerate(zip(short, long, strict=False)) if x != y), len(short))
    return short[i:] == long[i + 1 :]


def check_key_typos(cfg: dict[str, Any]) -> None:
    """ConfigKeyError for a key one edit away from a key llmsim reads, that key being absent
    and the key itself no Hugging Face key of another meaning: "did you mean ...?"."""
    for key in cfg:
        if not isinstance(key, str) or key in READ_KEYS or key in OTHER_HF_KEYS:
            continue
        close = sorted(k for k in READ_KEYS if k not in cfg and _one_edit(key.lower(), k))
        if close:
            raise ConfigKeyError(
                key,
                "not a key llmsim reads, and one letter from one it does"
                f"{did_you_mean(close[0], close)} (left as it is, the model would silently "
                "take that key's default)",
            )


class ConfigKeyError(KeyError):
    """A key the cost model needs is missing or has the wrong type."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}")


def _model_type(cfg: dict[str, Any]) -> str:
    """The config's `model_type` ("" when absent); anything but text is a ConfigKeyError."""
    value = cfg.get("model_type") or ""
    if not isinstance(value, str):
        raise ConfigKeyError("model_type", f"expected a name, got {value!r}")
    return value


def _get(cfg: dict[str, Any], name: str, default: Any = ...) -> Any:
    for key in _ALIASES.get(name, (name,)):
        if cfg.get(key) is not None:
            return cfg[key]
    if default is ...:
        raise ConfigKeyError(_ALIASES.get(name, (name,))[0], "missing")
    return default


def _int(cfg: dict[str, Any], name: str, default: Any = ...) -> int:
    """A size the config gives (a count or a dimension): an integer of at least 1."""
    value = _get(cfg, name, default)
    key = next((k for k in _ALIASES.get(name, (name,)) if cfg.get(k) is not None), name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigKeyError(key, f"expected an integer, got {value!r}")
    if value < 1:
        raise ConfigKeyError(key, f"must be at least 1, got {value}")
    return value


def _first_int(cfg: dict[str, Any], *keys: str, default: int) -> int:
    """The first of `keys` present (and truthy) in the config, as an integer; else `default`."""
    for key in keys:
        value = cfg.get(key)
        if value is None or value is False or value == 0:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigKeyError(key, f"expected an integer, got {value!r}")
        return value
    return default


def _size(cfg: dict[str, Any], *keys: str, default: int) -> int:
    """The first of `keys` the config gives (not null), a size of at least 1; else `default`.
    Unlike `_first_int`, a 0 is an error, not "absent"."""
    key = next((k for k in keys if cfg.get(k) is not None), None)
    return default if key is None else _int(cfg, key)


def _attention(cfg: dict[str, Any], hidden: int) -> GQAttention | MLAttention:
    heads = _int(cfg, "num_heads")
    if cfg.get("head_dim") is None and not cfg.get("kv_lora_rank") and hidden % heads:
        key = next(k for k in _ALIASES["num_heads"] if cfg.get(k) is not None)
        raise ConfigKeyError(
            key,
            f"{heads} heads do not divide hidden_size {hidden} (and no head_dim is given): "
            "the head size would not be a whole number",
        )
    if cfg.get("kv_lora_rank"):
        return MLAttention(
            num_heads=heads,
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=_int(cfg, "kv_lora_rank"),
            qk_nope_head_dim=_int(cfg, "qk_nope_head_dim"),
            qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
            v_head_dim=_int(cfg, "v_head_dim"),
        )
    model_type = _model_type(cfg)
    bias = bool(cfg.get("attention_bias", False)) or model_type in ("qwen2", "qwen2_moe", "bloom")
    use_window = cfg.get("use_sliding_window", True) and cfg.get("sliding_window")
    window_layers = _window_layers(cfg) if use_window else None
    cca = any(cfg.get(k) is not None for k in ("cca_time0", "cca_time1", "cca_compression"))
    head_dim = hidden // heads
    if cca and cfg.get("head_dim") is None:  # the paper's d_head = d_model / (C x heads)
        head_dim = max(1, hidden // (_int(cfg, "cca_compression", 1) * heads))
    extra: dict[str, Any] = {}
    if cca:
        extra["conv_kernels"] = (_int(cfg, "cca_time0", 2), _int(cfg, "cca_time1", 2))
    return (CCAttention if cca else GQAttention)(
        num_heads=heads,
        num_kv_heads=_int(cfg, "num_key_value_heads", heads),
        head_dim=_int(cfg, "head_dim", head_dim),
        qkv_bias=bias,
        o_bias=bool(cfg.get("attention_bias", False)) or model_type == "bloom",
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        sliding_window=_first_int(cfg, "sliding_window", default=0) or None if use_window else None,
        sliding_window_layers=window_layers,
        **extra,
    )


def _window_layers(cfg: dict[str, Any]) -> int | None:
    """How many layers attend within the sliding window when not all do (None: all). Read
    from transformers' `layer_types` ("sliding_attention" / "full_attention" per layer, as
    Gemma-2/3, Qwen2/3 and GPT-OSS configs write it), else Gemma-3's `sliding_window_pattern`
    (every n-th layer global, modeling_gemma3.py: `bool((layer_idx + 1) % pattern)`), else
    Gemma-2's alternation (even layers local, modeling_gemma2.py), else Qwen2's
    `max_window_layers` (layers from that index on use the window, configuration_qwen2.py)."""
    layers = _int(cfg, "num_layers")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ConfigKeyError("layer_types", f"expected a list of {layers} layer types")
        sliding = {"sliding_attention", "hybrid_sliding"}  # hybrid*: ZAYA1's CCA layers
        known = ["sliding_attention", "full_attention", "hybrid", "hybrid_sliding"]
        odd = next((t for t in types if t not in known), None)
        if odd is not None:
            raise ConfigKeyError("layer_types", f"unknown layer type {odd!r} ({', '.join(known)})")
        local = sum(t in sliding for t in types)
    elif cfg.get("sliding_window_pattern") is not None:
        pattern = _int(cfg, "sliding_window_pattern")
        local = sum(1 for i in range(layers) if (i + 1) % pattern)
    elif _model_type(cfg) == "gemma2":
        local = (layers + 1) // 2
    elif cfg.get("max_window_layers") is not None and _model_type(cfg).startswith("qwen"):
        local = layers - min(layers, _int(cfg, "max_window_layers"))
    else:
        return None
    return None if local == layers else local


def _dense_mlp(cfg: dict[str, Any], hidden: int) -> MLP:
    model_type = _model_type(cfg)
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu"))).lower()
    gated = act in _GATED_ACTS and model_type != "bloom"
    keys = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
    if model_type in _FOUR_X_MLP:
        size = _size(cfg, *keys, default=4 * hidden)
    elif all(cfg.get(k) is None for k in keys):
        raise ConfigKeyError("intermediate_size", "missing (the MLP's width)")
    else:
        size = _size(cfg, *keys, default=0)
    bias = model_type == "bloom" or bool(cfg.get("mlp_bias", False))  # Llama configs: mlp_bias
    return MLP(intermediate_size=size, gated=gated, bias=bias)


def _moe(cfg: dict[str, Any], num_layers: int) -> MoE | None:
    experts = _first_int(cfg, "num_local_experts", "n_routed_experts", "num_experts", default=0)
    if experts <= 1:
        return None
    expert_size = _size(cfg, "moe_intermediate_size", default=0) or _int(cfg, "intermediate_size")
    shared = _first_int(cfg, "n_shared_experts", default=0)
    shared_size = _first_int(cfg, "shared_expert_intermediate_size", default=0)
    if shared_size:  # Qwen-MoE: one shared expert of its own size
        shared = 1
    elif shared:  # DeepSeek: n_shared_experts of the routed-expert size
        shared_size = expert_size
    first_dense = _first_int(cfg, "first_k_dense_replace", default=0)
    only = cfg.get("mlp_only_layers")
    if only is not None and not (
        isinstance(only, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in only)
    ):
        raise ConfigKeyError("mlp_only_layers", f"expected a list of layer indices, got {only!r}")
    if only:
        first_dense = len(only)
    sparse_step = _first_int(cfg, "decoder_sparse_step", default=1)
    if _first_int(cfg, "moe_layer_freq", default=1) != 1 or sparse_step != 1:
        raise ConfigKeyError("moe_layer_freq", "only MoE in every layer after the dense ones")
    return MoE(
        num_experts=experts,
        top_k=_int(cfg, "num_experts_per_tok"),
        expert=MLP(intermediate_size=expert_size),
        num_shared_experts=shared,
        shared_expert=MLP(intermediate_size=shared_size) if shared and shared_size else None,
        first_dense_layers=min(first_dense, num_layers),
    )


# Hugging Face model types whose layers are not (all) attention: no KV cache to size, other
# kernels (transformers' model_type names).
_NOT_ATTENTION = frozenset(
    {"mamba", "mamba2", "falcon_mamba", "jamba", "bamba", "rwkv", "rwkv5", "rwkv6",
     "recurrent_gemma", "xlstm", "zamba", "zamba2", "nemotron_h", "granitemoehybrid"}
)  # fmt: skip

# Weight formats of compressed-tensors' (num_bits, type) (vLLM's CompressedTensorsConfig).
_COMPRESSED_WEIGHTS = {
    (8, "float"): "fp8",
    (8, "int"): "int8",
    (4, "int"): "int4",
    (4, "float"): "fp4",
}


# Where each method's config lists the modules it leaves unquantised (the keys vLLM and
# transformers read): FBGEMM FP8 and transformers' FP8 `modules_to_not_convert` (Meta's
# Llama-3.1-405B-Instruct-FP8 lists its first and last layers, every self_attn and lm_head:
# huggingface/transformers@613b59f5 src/transformers/models/llama/quantize_fp8_llama.py, after
# Meta's recipe in "The Llama 3 Herd of Models" sec. 6.2), vLLM's FP8 `ignored_layers`, ModelOpt
# `exclude_modules`, compressed-tensors `ignore`, AWQ/GPTQ `modules_to_not_convert`,
# bitsandbytes `llm_int8_skip_modules`.
_IGNORE_KEYS = (
    "modules_to_not_convert", "ignored_layers", "exclude_modules", "ignore",
    "llm_int8_skip_modules",
)  # fmt: skip


def _weight_dtype(
    cfg: dict[str, Any], dtype: str, *, num_layers: int, moe: MoE | None, mla: bool
) -> tuple[str, WeightFormats | None]:
    """The checkpoint's main linear-weight format (its `quantization_config`, read as vLLM reads
    these methods, else `dtype`) and, for a quantised one, the format of each linear: the
    modules its ignore list names stay in `dtype`. A method or format llmsim cannot price is an
    error naming it, not a silent 16-bit model."""
    quant = cfg.get("quantization_config") or {}
    if not isinstance(quant, dict):
        raise ConfigKeyError("quantization_config", f"expected a mapping, got {quant!r}")
    if not quant:
        return dtype, None
    method = str(quant.get("quant_method", "")).lower()
    found: str | None = None
    if method in ("fp8", "fbgemm_fp8"):
        found = "fp8"
    elif method == "modelopt":  # NVIDIA ModelOpt exports: quant_algo FP8 or NVFP4
        algo = str(quant.get("quant_algo", "")).upper()
        found = "fp8" if algo.startswith("FP8") else "fp4" if algo == "NVFP4" else None
        method = f"modelopt {algo or '(no quant_algo)'}"
    elif method in ("awq", "gptq"):
        bits = _first_int(quant, "bits", default=16)
        found = {4: "int4", 8: "int8"}.get(bits)
        method = f"{method} {bits}-bit"
    elif method == "bitsandbytes":
        found = (
            "int4" if quant.get("load_in_4bit") else "int8" if quant.get("load_in_8bit") else None
        )
    elif method == "compressed-tensors":
        found, method = _compressed_tensors(quant)
    if found is None:
        raise ConfigKeyError(
            "quantization_config",
            f"{method or 'no quant_method'} is not a weight format llmsim prices (fp8, "
            "fbgemm_fp8, modelopt FP8/NVFP4, awq/gptq 4- or 8-bit, bitsandbytes, "
            "compressed-tensors int4/int8/fp8/fp4); remove it and pass --quantization",
        )
    patterns: list[str] = []
    for key in _IGNORE_KEYS:
        if quant.get(key) is not None:
            try:
                patterns += check_patterns(quant[key], key)
            except ValueError as exc:
                raise ConfigKeyError("quantization_config", str(exc)) from None
    first_moe = num_layers if moe is None else moe.first_dense_layers
    formats = from_ignore_list(
        found,  # type: ignore[arg-type]
        dtype,  # type: ignore[arg-type]
        patterns,
        num_layers=num_layers,
        moe_layers=[i >= first_moe for i in range(num_layers)],
        mla=mla,
        source=f"quantization_config ({method})",
    )
    return found, formats


def _weight_block(cfg: dict[str, Any]) -> tuple[int, int] | None:
    """The block of an fp8 checkpoint's block-wise weight scales (`weight_block_size`, as vLLM's
    Fp8Config reads it); None: scaled per tensor or channel."""
    block = (cfg.get("quantization_config") or {}).get("weight_block_size")
    if block is None:
        return None
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise ConfigKeyError(
            "quantization_config", f"weight_block_size: expected two positive ints, got {block!r}"
        )
    return (block[0], block[1])


def _compressed_tensors(quant: dict[str, Any]) -> tuple[str | None, str]:
    """(weight format, description) of a compressed-tensors config: its groups' weights must
    agree on one format."""
    groups = quant.get("config_groups")
    formats: set[tuple[Any, str]] = set()
    for group in groups.values() if isinstance(groups, dict) else []:
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict):
            bits = weights.get("num_bits")
            if isinstance(bits, bool) or not isinstance(bits, int):
                raise ConfigKeyError(
                    "quantization_config",
                    f"config_groups: num_bits must be an integer, got {bits!r}",
                )
            formats.add((bits, str(weights.get("type", "")).lower()))
    if len(formats) != 1:
        return None, "compressed-tensors without one weight format in config_groups"
    bits, kind = formats.pop()
    return _COMPRESSED_WEIGHTS.get((bits, kind)), f"compressed-tensors {kind} {bits}-bit"


def _position(cfg: dict[str, Any], model_type: str) -> Literal["rope", "alibi", "learned"]:
    """Rotary unless the architecture adds ALiBi biases in attention (BLOOM, MPT, Falcon with
    `alibi`) or learns position embeddings (GPT-2, OPT)."""
    if model_type in ("bloom", "mpt") or (model_type == "falcon" and cfg.get("alibi")):
        return "alibi"
    if model_type in ("gpt2", "opt"):
        return "learned"
    return "rope"


def _context(cfg: dict[str, Any], model_type: str) -> int:
    """The model's context length: required, except for ALiBi models (no position table)."""
    keys = ("max_position_embeddings", "seq_length", "n_positions")
    if model_type not in _ALIBI_TYPES and all(cfg.get(k) is None for k in keys):
        raise ConfigKeyError("max_position_embeddings", "missing (the model's context length)")
    return _size(cfg, *keys, default=4096)


def from_hf_config(cfg: dict[str, Any], *, name: str = "") -> ModelSpec:
    """Build a ModelSpec from a parsed Hugging Face config. Raises ConfigKeyError on a missing
    or malformed key and pydantic's ValidationError on inconsistent values."""
    model_type = _model_type(cfg)
    if model_type in _NOT_ATTENTION:
        raise ConfigKeyError(
            "model_type",
            f"{model_type!r} is a state-space or recurrent model; llmsim prices attention "
            "transformers (their layers, KV cache and kernels)",
        )
    check_key_typos(cfg)
    hidden = _int(cfg, "hidden_size")
    num_layers = _int(cfg, "num_layers")
    dtype = _TORCH_DTYPES.get(str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))), "bf16")
    attention = _attention(cfg, hidden)
    moe = _moe(cfg, num_layers)
    weights, formats = _weight_dtype(
        cfg, dtype, num_layers=num_layers, moe=moe, mla=isinstance(attention, MLAttention)
    )
    return ModelSpec(
        name=name or str(cfg.get("_name_or_path") or model_type or "model"),
        hidden_size=hidden,
        num_layers=num_layers,
        vocab_size=_int(cfg, "vocab_size"),
        attention=attention,
        mlp=_dense_mlp(cfg, hidden),
        moe=moe,
        norm="layer" if model_type in ("bloom", "gpt2", "gpt_neox", "opt", "falcon") else "rms",
        position=_position(cfg, model_type),
        embedding_norm=model_type == "bloom",
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", model_type == "bloom")),
        dtype=dtype,
        weight_dtype=weights,
        weight_formats=formats,
        weight_block_size=_weight_block(cfg) if weights == "fp8" else None,
        max_position_embeddings=_context(cfg, model_type),
    )
