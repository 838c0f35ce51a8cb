"""The built-in model catalogue: every entry loads and its parameter counts match the published
figures; KV-cache sizes match hand arithmetic; user-supplied config.json paths work and bad ones
fail as SpecError naming the file and the key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from simulator.errors import SpecError
from simulator.specs import list_models, load_model

CATALOGUE = [
    "bloom-176b",
    "deepseek-v3",
    "llama-2-13b",
    "llama-2-70b",
    "llama-2-7b",
    "llama-3.1-405b",
    "llama-3.1-70b",
    "llama-3.1-8b",
    "mistral-7b",
    "mixtral-8x22b",
    "mixtral-8x7b",
    "qwen2.5-72b",
    "qwen3-30b-a3b",
]

# Published total parameter counts, in billions. Every one is pinned within 1%.
PUBLISHED_TOTAL = {
    # Llama 2 paper (arXiv:2307.09288) and the HF model pages: 6.74B / 13.0B / 69.0B
    "llama-2-7b": 6.74,
    "llama-2-13b": 13.0,
    "llama-2-70b": 69.0,
    # HF model pages meta-llama/Llama-3.1-{8B,70B,405B} ("Model size"): 8.03B / 70.6B / 406B
    # (405.9B before rounding)
    "llama-3.1-8b": 8.03,
    "llama-3.1-70b": 70.6,
    "llama-3.1-405b": 405.9,
    # HF model page mistralai/Mistral-7B-v0.1 ("Model size: 7.24B params")
    "mistral-7b": 7.24,
    # Mixtral paper (arXiv:2401.04088): 46.7B total; Mistral's Mixtral 8x22B announcement: 141B
    "mixtral-8x7b": 46.7,
    "mixtral-8x22b": 141.0,
    # Qwen2.5 model card Qwen/Qwen2.5-72B: "Number of Parameters: 72.7B"
    "qwen2.5-72b": 72.7,
    # Qwen3 model card Qwen/Qwen3-30B-A3B: "30.5B in total and 3.3B activated"
    "qwen3-30b-a3b": 30.5,
    # DeepSeek-V3 technical report (arXiv:2412.19437): 671B total (excluding the 14B MTP module)
    "deepseek-v3": 671.0,
    # BLOOM model card bigscience/bloom: 176,247,271,424 parameters (also pinned exactly below)
    "bloom-176b": 176.2,
}

# Published activated-per-token counts, in billions, pinned within 1%.
# Sources: Mixtral paper (12.9B active); Mixtral 8x22B announcement (39B active).
PUBLISHED_ACTIVE = {
    "mixtral-8x7b": 12.9,
    "mixtral-8x22b": 39.0,
}

# Headline active counts that the vendor states to two significant figures, truncated rather
# than rounded: the exact count from the config lies in [published, published + one unit of the
# last digit). Each is also pinned exactly, by hand arithmetic:
# DeepSeek-V3 "37B activated" (tech report, arXiv:2412.19437):
#   embedding + LM head 2 * 129280 * 7168                                  =  1,853,358,080
#   61 layers * (MLA 187,107,328 + 2 RMSNorms 14,336)                      = 11,414,421,504
#     MLA = q_a 7168*1536 + q_a_norm 1536 + q_b 1536*128*192 + kv_a 7168*576
#           + kv_a_norm 512 + kv_b 512*128*256 + o 128*128*7168
#   3 dense MLPs 3 * (3 * 7168 * 18432)                                    =  1,189,085,184
#   58 MoE layers * (9 experts (8 routed + 1 shared) * 3*7168*2048 + router 7168*256)
#                                                                          = 23,095,410,688
#   final norm 7168                                               total    = 37,552,282,624
# Qwen3-30B-A3B "3.3B activated" (model card Qwen/Qwen3-30B-A3B):
#   embedding + LM head 2 * 151936 * 2048                                  =    622,329,856
#   48 layers * (attention 2048*4096*2 + 2048*512*2 + qk-norms 256 = 18,874,624
#                + 2 RMSNorms 4096 + 8 experts * 3*2048*768 + router 2048*128 = 38,010,880)
#                                                                          =  2,730,700,800
#   final norm 2048                                               total    =  3,353,032,704
TRUNCATED_ACTIVE = {
    "deepseek-v3": (37.0, 1.0),
    "qwen3-30b-a3b": (3.3, 0.1),
}
EXACT_ACTIVE = {"deepseek-v3": 37_552_282_624, "qwen3-30b-a3b": 3_353_032_704}


def test_catalogue_lists_every_model() -> None:
    assert set(CATALOGUE) <= set(list_models())


@pytest.mark.parametrize("model_id", CATALOGUE)
def test_catalogue_entry_loads(model_id: str) -> None:
    spec = load_model(model_id)
    assert spec.id == model_id
    assert spec.name == model_id
    assert spec.num_params >= spec.num_active_params > 0


@pytest.mark.parametrize("model_id", sorted(PUBLISHED_TOTAL))
def test_total_params_match_published(model_id: str) -> None:
    spec = load_model(model_id)
    assert spec.num_params / 1e9 == pytest.approx(PUBLISHED_TOTAL[model_id], rel=0.01)


@pytest.mark.parametrize("model_id", sorted(PUBLISHED_ACTIVE))
def test_active_params_match_published(model_id: str) -> None:
    spec = load_model(model_id)
    assert spec.num_active_params / 1e9 == pytest.approx(PUBLISHED_ACTIVE[model_id], rel=0.01)


@pytest.mark.parametrize("model_id", sorted(TRUNCATED_ACTIVE))
def test_active_params_match_truncated_headline(model_id: str) -> None:
    spec = load_model(model_id)
    published, unit = TRUNCATED_ACTIVE[model_id]
    assert published <= spec.num_active_params / 1e9 < published + unit
    assert spec.num_active_params == EXACT_ACTIVE[model_id]


@pytest.mark.parametrize(
    "model_id",
    [m for m in CATALOGUE if m not in PUBLISHED_ACTIVE and m not in TRUNCATED_ACTIVE],
)
def test_dense_models_activate_everything(model_id: str) -> None:
    spec = load_model(model_id)
    assert not spec.is_moe
    assert spec.num_active_params == spec.num_params


@pytest.mark.parametrize(
    ("model_id", "expected"),
    [
        # 2 (K and V) * 8 kv heads * 128 head_dim * 32 layers * 2 bytes (bf16) = 131072
        ("llama-3.1-8b", 131_072),
        # 2 * 32 kv heads (MHA) * 128 * 32 layers * 2 bytes (fp16) = 524288
        ("llama-2-7b", 524_288),
        # 2 * 8 * 128 * 80 layers * 2 bytes = 327680
        ("llama-3.1-70b", 327_680),
        # 2 * 8 * 128 * 32 layers * 2 bytes = 131072 (window layers counted in full)
        ("mistral-7b", 131_072),
        # 2 * 4 kv heads * 128 head_dim * 48 layers * 2 bytes = 98304
        ("qwen3-30b-a3b", 98_304),
        # MLA caches only the latent: (kv_lora_rank 512 + rope dim 64) * 61 layers * 2 bytes
        ("deepseek-v3", 70_272),
        # 2 * 14336 (112 heads * 128) * 70 layers * 2 bytes = 4014080
        ("bloom-176b", 4_014_080),
    ],
)
def test_kv_bytes_per_token(model_id: str, expected: int) -> None:
    assert load_model(model_id).kv_bytes_per_token() == expected


def test_kv_bytes_at_fp8() -> None:
    # 2 * 8 * 128 * 32 layers * 1 byte
    assert load_model("llama-3.1-8b").kv_bytes_per_token("fp8") == 65_536


def test_architecture_details() -> None:
    mistral = load_model("mistral-7b")
    assert mistral.attention.sliding_window == 4096
    assert load_model("mixtral-8x7b").attention.sliding_window is None
    assert load_model("qwen2.5-72b").attention.sliding_window is None  # use_sliding_window false

    mixtral = load_model("mixtral-8x7b").moe
    assert mixtral is not None
    assert (mixtral.top_k, mixtral.num_experts) == (2, 8)

    qwen3 = load_model("qwen3-30b-a3b")
    assert qwen3.moe is not None
    assert (qwen3.moe.top_k, qwen3.moe.num_experts) == (8, 128)
    assert qwen3.attention.head_dim == 128  # explicit head_dim, not hidden / heads = 64

    ds = load_model("deepseek-v3")
    assert ds.attention.kind == "mla"
    assert ds.moe is not None
    assert (ds.moe.top_k, ds.moe.num_experts, ds.moe.num_shared_experts) == (8, 256, 1)
    assert ds.num_dense_layers == 3
    assert ds.weight_dtype == "fp8"

    bloom = load_model("bloom-176b")
    assert bloom.norm == "layer"
    assert bloom.tie_word_embeddings
    assert not bloom.mlp.gated

    assert load_model("llama-2-7b").dtype == "fp16"
    assert load_model("llama-3.1-8b").dtype == "bf16"


def test_catalogue_files_record_their_source() -> None:
    from simulator.specs.loader import MODELS_DIR

    for model_id in CATALOGUE:
        cfg = json.loads((MODELS_DIR / f"{model_id}.json").read_text(encoding="utf-8"))
        assert cfg["_source"].startswith("https://huggingface.co/")


# -- user-supplied config.json ----------------------------------------------------------------
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_config_json_by_path(tmp_path: Path) -> None:
    path = _write(tmp_path / "tiny" / "config.json", json.dumps(TINY))
    spec = load_model(str(path))
    # per layer: q 256*256 + k,v 2*256*128 + o 256*256 + MLP 3*256*512 + 2 norms 2*256
    layer = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 3 * 256 * 512 + 2 * 256
    assert spec.num_params == 2 * 1000 * 256 + 2 * layer + 256
    # 2 * 2 kv heads * 64 head_dim * 2 layers * 2 bytes
    assert spec.kv_bytes_per_token() == 1024
    # a folder holding config.json works too
    assert load_model(str(path.parent)).num_params == spec.num_params


def _groups(bits: int, kind: str) -> dict[str, object]:
    """compressed-tensors' config_groups with one group of `bits`-bit `kind` weights."""
    return {"group_0": {"targets": ["Linear"], "weights": {"num_bits": bits, "type": kind}}}


@pytest.mark.parametrize(
    ("quant", "weights"),
    [
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "fp4"),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
        ({"quant_method": "fp8"}, "fp8"),
        ({"quant_method": "awq", "bits": 4}, "int4"),
        ({"quant_method": "gptq", "bits": 8}, "int8"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4"),
        ({"quant_method": "compressed-tensors", "config_groups": _groups(8, "float")}, "fp8"),
        ({"quant_method": "compressed-tensors", "config_groups": _groups(4, "int")}, "int4"),
        ({}, "bf16"),
    ],
)
def test_quantised_checkpoints_give_their_weight_format(
    tmp_path: Path, quant: dict[str, object], weights: str
) -> None:
    path = _write(
        tmp_path / "q" / "config.json", json.dumps({**TINY, "quantization_config": quant})
    )
    assert load_model(str(path)).weight_dtype == weights


@pytest.mark.parametrize(
    ("quant", "named"),
    [
        ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "modelopt W4A8_AWQ"),
        ({"quant_method": "modelopt", "quant_algo": "BOGUS"}, "modelopt BOGUS"),
        ({"quant_method": "gptq", "bits": 3}, "gptq 3-bit"),
        ({"quant_method": "hqq"}, "hqq"),
        ({"bits": 4}, "no quant_method"),
        (
            {"quant_method": "compressed-tensors", "config_groups": {}},
            "compressed-tensors without one weight format in config_groups",
        ),
    ],
)
def test_a_weight_format_it_cannot_price_is_named_not_run_as_16_bit(
    tmp_path: Path, quant: dict[str, object], named: str
) -> None:
    path = _write(
        tmp_path / "q" / "config.json", json.dumps({**TINY, "quantization_config": quant})
    )
    with pytest.raises(SpecError, match=f"{named} is not a weight format") as err:
        load_model(str(path))
    assert err.value.field == "quantization_config"


def test_a_state_space_model_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "m" / "config.json", json.dumps({**TINY, "model_type": "mamba"}))
    with pytest.raises(SpecError, match="'mamba' is a state-space or recurrent model") as err:
        load_model(str(path))
    assert err.value.field == "model_type"


def test_missing_key_names_file_and_key(tmp_path: Path) -> None:
    cfg = {k: v for k, v in TINY.items() if k != "num_attention_heads"}
    path = _write(tmp_path / "no_heads" / "config.json", json.dumps(cfg))
    with pytest.raises(SpecError) as excinfo:
        load_model(str(path))
    message = str(excinfo.value)
    assert str(path.resolve()) in message
    assert "num_attention_heads" in message
    assert excinfo.value.field == "num_attention_heads"


@pytest.mark.parametrize(
    "key",
    [
        "num_attention_heads",
        "num_hidden_layers",
        "hidden_size",
        "intermediate_size",  # was taken for absent: 4 x hidden
        "max_position_embeddings",  # likewise: 4096
    ],
)
def test_a_zero_size_names_file_and_key(tmp_path: Path, key: str) -> None:
    path = _write(tmp_path / key / "config.json", json.dumps({**TINY, key: 0}))
    with pytest.raises(SpecError) as excinfo:
        load_model(str(path))
    assert excinfo.value.field == key and "must be at least 1, got 0" in excinfo.value.reason


def test_malformed_json_is_spec_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "broken" / "config.json", '{"hidden_size": 256,,}')
    with pytest.raises(SpecError, match="malformed JSON") as excinfo:
        load_model(str(path))
    assert str(path.resolve()) in str(excinfo.value)


def test_missing_file_is_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_model(str(tmp_path / "absent" / "config.json"))


def test_unknown_id_lists_the_catalogue() -> None:
    with pytest.raises(SpecError, match=re.escape("llama-3.1-8b")):
        load_model("no-such-model")


def test_bloom_matches_model_card_exactly() -> None:
    # the bigscience/bloom model card states 176,247,271,424 parameters
    assert load_model("bloom-176b").num_params == 176_247_271_424
