"""Per-linear weight formats: ignore lists of Hugging Face quantization configs, GGUF file
types' mixes (llama.cpp's rules), bytes per weight of each format, and bad values refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simulator.errors import SpecError
from simulator.specs import load_model
from simulator.specs.deployment import check_quantization
from simulator.specs.weights import (
    BYTES_PER_WEIGHT,
    WeightFormats,
    gguf_formats,
    use_more_bits,
)

TINY: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 4096,
}
FP8_GROUPS = {"g": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}}


def _formats(tmp_path: Path, quant: dict[str, Any]) -> WeightFormats:
    path = tmp_path / str(len(list(tmp_path.iterdir()))) / "config.json"  # loads are cached
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**TINY, "quantization_config": quant}), encoding="utf-8")
    formats = load_model(str(path)).weight_formats
    assert formats is not None
    return formats


def test_ggml_block_sizes() -> None:
    # bytes per block over weights per block, as ggml-common.h's static_asserts give them
    assert BYTES_PER_WEIGHT["q4_0"] * 8 == 4.5
    assert BYTES_PER_WEIGHT["q8_0"] * 8 == 8.5
    assert BYTES_PER_WEIGHT["q4_k"] * 256 == 144
    assert BYTES_PER_WEIGHT["q5_k"] * 256 == 176
    assert BYTES_PER_WEIGHT["q6_k"] * 256 == 210


def test_fbgemm_fp8_ignore_list_keeps_attention_and_edge_layers_in_bf16(tmp_path: Path) -> None:
    quant = {
        "quant_method": "fbgemm_fp8",
        "modules_to_not_convert": [
            "model.layers.0",
            "model.layers.3",
            "lm_head",
            *(f"model.layers.{i}.self_attn" for i in (1, 2)),
        ],
    }
    formats = _formats(tmp_path, quant)
    for layer in range(4):
        for linear in ("q", "k", "v", "o"):
            assert formats.format_of(linear, layer) == "bf16"
        edge = layer in (0, 3)
        for linear in ("gate", "up", "down"):
            assert formats.format_of(linear, layer) == ("bf16" if edge else "fp8")
    assert formats.format_of("lm_head") == formats.format_of("embed") == "bf16"


def test_compressed_tensors_ignore_regex_and_modelopt_globs(tmp_path: Path) -> None:
    ct = _formats(
        tmp_path,
        {
            "quant_method": "compressed-tensors",
            "config_groups": FP8_GROUPS,
            "ignore": ["lm_head", r"re:.*layers\.1\.mlp\.down_proj"],
        },
    )
    assert [ct.format_of("down", i) for i in range(4)] == ["fp8", "bf16", "fp8", "fp8"]
    assert ct.format_of("up", 1) == ct.format_of("q", 1) == "fp8"
    mo = _formats(
        tmp_path,
        {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["*self_attn.o*"]},
    )
    assert {mo.format_of("o", i) for i in range(4)} == {"bf16"}
    assert {mo.format_of("q", i) for i in range(4)} == {"fp8"}
    awq = _formats(
        tmp_path, {"quant_method": "awq", "bits": 4, "modules_to_not_convert": ["down_proj"]}
    )
    assert (awq.format_of("down", 2), awq.format_of("up", 2)) == ("bf16", "int4")


@pytest.mark.parametrize(
    ("ignore", "reason"),
    [("lm_head", "must be a list of module names"), (["re:("], "not a regular expression")],
)
def test_a_bad_ignore_list_names_the_key(tmp_path: Path, ignore: object, reason: str) -> None:
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    quant = {"quant_method": "compressed-tensors", "config_groups": FP8_GROUPS, "ignore": ignore}
    path.write_text(json.dumps({**TINY, "quantization_config": quant}), encoding="utf-8")
    with pytest.raises(SpecError, match=reason) as err:
        load_model(str(path))
    assert err.value.field == "quantization_config"


def test_q4_k_m_puts_half_the_attn_v_and_ffn_down_in_q6_k() -> None:
    formats = gguf_formats("Q4_K_M", num_layers=32)
    more = [i for i in range(32) if use_more_bits(i, 32)]
    assert len(more) == 16  # i < 4, i >= 28, and every third layer between
    for linear in ("v", "down"):
        assert [i for i in range(32) if formats.format_of(linear, i) == "q6_k"] == more
    assert {formats.format_of(x, i) for x in ("q", "k", "o", "gate", "up") for i in range(32)} == {
        "q4_k"
    }
    assert formats.format_of("lm_head") == "q6_k"
    assert formats.format_of("embed") == "q4_k"  # untied: the base type
    tied = gguf_formats("q4_k_m", num_layers=32, tied_embeddings=True)
    assert tied.format_of("embed") == "q6_k"
    assert gguf_formats("Q8_0", num_layers=32).formats() == {"q8_0"}  # the output stays Q8_0


def test_llama_cpp_special_cases() -> None:
    seventy = gguf_formats("Q4_K_M", num_layers=80)  # LLM_TYPE_70B lifts a Q4_K attn_v
    assert {seventy.format_of("v", i) for i in range(80)} == {"q5_k", "q6_k"}
    mixtral = gguf_formats("Q4_K_M", num_layers=32, num_experts=8)
    assert {mixtral.format_of(x, 5) for x in ("v", "k")} == {"q8_0"}
    assert mixtral.format_of("o", 5) == "q5_k"
    small = gguf_formats("Q4_K_S", num_layers=32)
    assert [small.format_of("v", i) for i in (3, 4)] == ["q5_k", "q4_k"]
    assert [small.format_of("down", i) for i in (3, 4)] == ["q5_k", "q4_k"]


@pytest.mark.parametrize("value", ["fp8", "int4", "gguf:Q4_K_M", "GGUF:q6_k", None])
def test_quantization_values_accepted(value: str | None) -> None:
    assert check_quantization(value) == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [("gguf:Q9_K", "unknown GGUF type 'Q9_K'"), ("nf4", "unknown quantization 'nf4'")],
)
def test_quantization_values_refused(value: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        check_quantization(value)
