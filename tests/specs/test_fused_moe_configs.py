"""Which routed-expert shapes a vLLM release ships a tuned fused-MoE configuration for
(`simulator/specs/fused_moe_configs.yaml`, written by tools/import_vllm_moe_configs.py from the
releases' wheels), and how a profile names its release."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest

from simulator.errors import SpecError
from simulator.specs import load_engine
from simulator.specs.loader import NO_MOE_CONFIGS, tuned_moe_shapes

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> object:
    spec = importlib.util.spec_from_file_location(
        "imp", ROOT / "tools" / "import_vllm_moe_configs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_releases_list_the_files_they_ship() -> None:
    """Mixtral 8x7B's experts: files for TP2-8 on H100 in every release, for TP1 (N=14336) on
    H200 but not H100; Qwen3-30B-A3B's (E=128, N=768) bf16 file for B200 came with 0.14
    (vllm-project/vllm PR #31448), not in 0.11.1."""
    h100 = tuned_moe_shapes("vllm-0.14.0", "h100_sxm")
    assert {(8, 1792, "bf16"), (8, 3584, "bf16"), (8, 7168, "bf16")} <= h100
    assert (8, 14336, "bf16") not in h100
    assert (8, 14336, "bf16") in tuned_moe_shapes("vllm-0.14.0", "h200_sxm")
    assert (128, 768, "bf16") in tuned_moe_shapes("vllm-0.14.0", "b200")
    assert (128, 768, "bf16") not in tuned_moe_shapes("vllm-0.11.1", "b200")
    assert tuned_moe_shapes("vllm-0.14.0", "gaudi3") == frozenset()  # no file: all default
    assert tuned_moe_shapes(NO_MOE_CONFIGS, "h100_sxm") == frozenset()


def test_profiles_name_the_release_they_ran() -> None:
    assert load_engine("vllm").fused_moe_configs == "vllm-0.14.0"
    assert load_engine("vllm-0.11").fused_moe_configs == "vllm-0.11.1"
    assert load_engine("vllm-0.9").fused_moe_configs == "vllm-0.9.2"
    assert load_engine("vllm-0.8").fused_moe_configs == "vllm-0.8.5"
    assert load_engine("vllm-0.7").fused_moe_configs == "vllm-0.7.3"
    for engine in ("sglang", "trtllm", "llamacpp", "vllm-0.6"):
        assert load_engine(engine).fused_moe_configs is None
    # vllm-0.7 starts from vllm-0.6, so it carries the vllm profile's fitted fractions as copies
    vllm, v07 = load_engine("vllm"), load_engine("vllm-0.7")
    assert v07.fused_moe_fraction == vllm.fused_moe_fraction
    assert v07.fused_moe_default_fraction == vllm.fused_moe_default_fraction


def test_an_unknown_release_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        tuned_moe_shapes("vllm-0.14", "h100_sxm")
    assert "vllm-0.14.0" in str(info.value) and "none" in str(info.value)
    profile = tmp_path / "mine.yaml"
    profile.write_text("base: vllm\nfused_moe_configs: vllm-9.9\n")
    with pytest.raises(SpecError) as info:
        load_engine(str(profile))
    assert info.value.field == "fused_moe_configs" and str(profile) in str(info.value)


def test_the_tool_reads_the_file_names_of_a_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-1.2.3-cp38-abi3-manylinux1_x86_64.whl"
    folder = "vllm/model_executor/layers/fused_moe/configs/"
    names = [
        "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json",
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        "E=16,N=1024,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
        "E=64,N=640,device_name=NVIDIA_H100_80GB_HBM3,dtype=int8_w8a16.json",  # not priced
        "E=8,N=7168,device_name=NVIDIA_H20.json",  # no llmsim device
        "README",
    ]
    with zipfile.ZipFile(wheel, "w") as z:
        for name in names:
            z.writestr(folder + name, "{}")
    release, table = _tool().shapes(wheel)  # type: ignore[attr-defined]
    assert release == "vllm-1.2.3"
    assert table == {
        "h100_sxm": {"bf16": [[8, 7168]]},
        "h200_sxm": {"fp8": [[16, 1024]], "fp8_block": [[256, 256]]},
    }


def test_block_wise_fp8_checkpoints_keep_their_blocks() -> None:
    """DeepSeek-V3's checkpoint scales its fp8 weights per 128 x 128 block: served as fp8 it
    looks up vLLM's block-wise files; `--quantization fp8` on a bf16 checkpoint is per tensor."""
    import simulator as sim

    deepseek = sim.deployment(model="deepseek-v3", hardware="h200_sxm", tensor_parallel_size=8)
    assert deepseek.model.weight_block_size == (128, 128) and deepseek.precision.fp8_blocks
    qwen = sim.deployment(model="qwen3-30b-a3b", hardware="h100_sxm", quantization="fp8")
    assert qwen.precision.weights == "fp8" and not qwen.precision.fp8_blocks
    assert (256, 256, "fp8_block") in tuned_moe_shapes("vllm-0.14.0", "h200_sxm")


def test_a_malformed_block_size_names_the_key() -> None:
    from simulator.specs.hf import ConfigKeyError, from_hf_config

    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128]},
    }
    with pytest.raises(ConfigKeyError) as info:
        from_hf_config(config)
    assert "weight_block_size" in str(info.value)
