"""Decode attention's split-KV choice in the calibration: it is the hand-written spec's, the fit
never changes it, and the factors that exist for one kernel only are fitted only there."""

from __future__ import annotations

from simulator import calibrate
from simulator.specs import load_hardware

A100 = load_hardware("a100_sxm_80gb", calibrated=False)
H100 = load_hardware("h100_sxm", calibrated=False)


def test_a_split_specific_factor_applies_only_to_its_kernel() -> None:
    fa2_only = calibrate.Param("attention.decode_gqa_copy_s", 5e-6, 0.0, 2e-5, splits=("fa2",))
    everywhere = calibrate.Param("attention.decode_fixed_s", 1e-5, 1e-6, 5e-5)
    assert fa2_only.applies(A100) and not fa2_only.applies(H100)
    assert everywhere.applies(A100) and everywhere.applies(H100)


def test_the_decode_family_fits_the_block_rate_and_the_fa2_relayout() -> None:
    decode = next(f for f in calibrate.FAMILIES if f.name == "attention_decode")
    paths = {p.path: p for p in decode.params}
    assert "attention.decode_block_bytes_per_s" in paths
    assert paths["attention.decode_gqa_copy_s"].splits == ("fa2",)
    assert {"decode_block_bytes_per_s", "decode_gqa_copy_s"} <= set(
        calibrate.FITTED_KEYS["attention"]
    )
    assert "decode_split" not in calibrate.FITTED_KEYS["attention"]


def test_the_committed_overlays_keep_the_hand_written_split() -> None:
    a100, h100 = load_hardware("a100_sxm_80gb"), load_hardware("h100_sxm")
    assert a100.efficiency.attention.decode_split == A100.efficiency.attention.decode_split
    assert h100.efficiency.attention.decode_split == H100.efficiency.attention.decode_split
    # fitted where the data has them; the FA2 re-layout stays at its written 0 on FA3
    assert a100.efficiency.attention.decode_gqa_copy_s > 0
    assert h100.efficiency.attention.decode_gqa_copy_s == 0
    for hw in (a100, h100):
        rate = hw.efficiency.attention.decode_block_bytes_per_s
        assert rate is not None and 1e9 <= rate <= 2e11


def test_the_page_walk_is_fitted_on_fa3_only() -> None:
    decode = next(f for f in calibrate.FAMILIES if f.name == "attention_decode")
    paths = {p.path: p for p in decode.params}
    for name in ("decode_walk_tokens_per_s", "decode_walk_seqs"):
        param = paths[f"attention.{name}"]
        assert param.splits == ("fa3",)
        assert param.applies(H100) and not param.applies(A100)
        assert name in calibrate.FITTED_KEYS["attention"]
