"""The shipped hardware specs (`hardware_specs/*.yaml`): every file loads, the interface ids are
there, a few datasheet numbers are pinned, and the numbers are mutually sane."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from clitools import run_cli

import simulator
from simulator.errors import SpecError
from simulator.specs import HardwareSpec, load_hardware
from simulator.units import GB, TFLOPS, MiB

SPEC_DIR = Path(__file__).resolve().parents[2] / "hardware_specs"
SPEC_FILES = sorted(SPEC_DIR.glob("*.yaml"))

# Ids other parts of the simulator (CLI, scenarios, docs) refer to; they must always exist.
INTERFACE_IDS = [
    "h100_sxm",
    "h100_pcie",
    "h200_sxm",
    "a100_sxm_80gb",
    "a100_sxm_40gb",
    "a100_pcie_80gb",
    "l40s",
    "rtx_4090",
    "b200",
    "mi300x",
    "mi325x",
    "l4",
    "a10g",
    "rtx_3090",
    "rtx_6000_ada",
    "mi250x",
    "gh200_144gb",
]


def _load(path: Path) -> HardwareSpec:
    # By path, so a user's LLMSIM_HARDWARE_PATH cannot shadow the shipped file.
    return load_hardware(str(path))


@pytest.fixture(scope="module")
def specs() -> dict[str, HardwareSpec]:
    return {p.stem: _load(p) for p in SPEC_FILES}


def test_spec_dir_is_not_empty() -> None:
    assert SPEC_FILES, f"no YAML files in {SPEC_DIR}"


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_every_file_loads_and_takes_its_id_from_the_file_name(path: Path) -> None:
    spec = _load(path)
    assert spec.id == path.stem
    assert spec.name


def test_interface_ids_are_present() -> None:
    shipped = {p.stem for p in SPEC_FILES}
    missing = sorted(set(INTERFACE_IDS) - shipped)
    assert not missing, f"missing hardware specs: {missing}"


def test_interface_ids_resolve_by_id() -> None:
    for hw in INTERFACE_IDS:
        assert load_hardware(hw).id == hw


# -- pinned datasheet numbers (docs/hardware_sources.md) -----------------------------------------
def test_h100_sxm_bf16_is_the_dense_peak(specs: dict[str, HardwareSpec]) -> None:
    # 1,830 MHz x 528 tensor cores x 512 FMA x 2 = 989.4 TFLOP/s dense; 1,979 is the sparse figure.
    assert specs["h100_sxm"].peak_flops("bf16") == pytest.approx(989.4 * TFLOPS)


@pytest.mark.parametrize("hw", ["a100_sxm_80gb", "a100_sxm_40gb", "a100_pcie_80gb"])
def test_a100_has_no_fp8(specs: dict[str, HardwareSpec], hw: str) -> None:
    # Ampere has no FP8 matrix unit: the key is absent, so the cost model runs fp8 weight-only.
    spec = specs[hw]
    assert "fp8" not in spec.compute.peak_flops_per_s
    assert not spec.supports("fp8")
    assert spec.peak_flops("bf16") == pytest.approx(312 * TFLOPS)


def test_rtx_4090_bf16_uses_fp32_accumulate(specs: dict[str, HardwareSpec]) -> None:
    # 165.2 with FP32 accumulate (what PyTorch/cuBLAS use); 330.3 is the FP16-accumulate rate.
    spec = specs["rtx_4090"]
    assert spec.peak_flops("bf16") == pytest.approx(165.2 * TFLOPS)
    assert spec.peak_flops("fp8") == pytest.approx(330.3 * TFLOPS)
    assert spec.interconnect.topology == "pcie"


def test_l40s_bf16_is_full_rate_dense(specs: dict[str, HardwareSpec]) -> None:
    # 362 dense (full-rate FP32 accumulate); 733 is sparse, 183 is a wrong "dense" halving.
    assert specs["l40s"].peak_flops("bf16") == pytest.approx(362 * TFLOPS)


def test_mi300x_is_a_mesh_with_64_gb_s_per_peer(specs: dict[str, HardwareSpec]) -> None:
    # xGMI full mesh: 7 links x 64 GB/s per direction; any one peer gets only one link.
    ic = specs["mi300x"].interconnect
    assert ic.topology == "mesh"
    assert ic.peer_bw_bytes_per_s == pytest.approx(64 * GB)
    assert ic.link_bw_bytes_per_s == pytest.approx(448 * GB)


@pytest.mark.parametrize("hw", ["mi300x", "mi325x"])
def test_amd_fp8_is_present(specs: dict[str, HardwareSpec], hw: str) -> None:
    # FNUZ FP8, but a real matrix unit: 2,614.9 TFLOP/s dense.
    assert specs[hw].peak_flops("fp8") == pytest.approx(2614.9 * TFLOPS)


def test_b200_has_fp4_and_driver_memory(specs: dict[str, HardwareSpec]) -> None:
    spec = specs["b200"]
    assert spec.supports("fp4")
    assert spec.peak_flops("fp4") == pytest.approx(9000 * TFLOPS)
    assert spec.memory.capacity_bytes == pytest.approx(183359 * MiB)
    assert spec.memory.bandwidth_bytes_per_s == pytest.approx(7.67e12)


def test_driver_visible_capacities(specs: dict[str, HardwareSpec]) -> None:
    assert specs["h200_sxm"].memory.capacity_bytes == pytest.approx(143771 * MiB)
    assert specs["a100_sxm_40gb"].memory.capacity_bytes == pytest.approx(40441 * MiB)
    assert specs["mi300x"].memory.capacity_bytes == pytest.approx(192 * 1024**3)


@pytest.mark.parametrize("hw", ["h100_pcie", "a100_pcie_80gb", "l40s", "rtx_4090"])
def test_parts_without_nvswitch_are_pcie(specs: dict[str, HardwareSpec], hw: str) -> None:
    assert specs[hw].interconnect.topology == "pcie"


# -- sanity of every spec ---------------------------------------------------------------------
@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_peak_ordering(path: Path) -> None:
    spec = _load(path)
    peak = spec.compute.peak_flops_per_s
    assert all(v > 0 for v in peak.values())
    half = peak.get("bf16", peak.get("fp16", 0.0))
    if "fp8" in peak:
        assert peak["fp8"] >= half
    if "fp4" in peak:
        assert peak["fp4"] >= peak.get("fp8", half)
    if "bf16" in peak and "tf32" in peak:
        assert peak["bf16"] >= peak["tf32"]
    if "tf32" in peak and "fp32" in peak:
        assert peak["tf32"] >= peak["fp32"]
    if "bf16" in peak and "fp32" in peak:
        assert peak["bf16"] >= peak["fp32"]


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_power_and_price(path: Path) -> None:
    spec = _load(path)
    assert 0 < spec.power.idle_w < spec.power.tdp_w
    assert spec.price.usd_per_hour > 0
    assert spec.price.source and spec.price.date


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_efficiencies_are_fractions(path: Path) -> None:
    eff = _load(path).efficiency
    fractions = {
        **{f"gemm.{k}": v for k, v in eff.gemm.peak_fraction.items()},
        "memory.stream_fraction": eff.memory.stream_fraction,
        "attention.prefill_fraction": eff.attention.prefill_fraction,
        "attention.decode_fraction": eff.attention.decode_fraction,
        "host_link_fraction": eff.host_link_fraction,
    }
    for name, value in fractions.items():
        assert 0 < value <= 1, f"{name} = {value}"
    # NVLS busbw may exceed the wire speed, so the collective fraction may reach 1.2.
    assert 0 < eff.collective.busbw_fraction <= 1.2
    assert eff.collective.latency_s >= 0
    assert eff.kernel_latency_s >= 0


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_gemm_fractions_cover_exactly_the_supported_dtypes(path: Path) -> None:
    # plus block-scaled fp8's own where the device's fp8 GEMMs were timed with block scales
    spec = _load(path)
    fractions = set(spec.efficiency.gemm.peak_fraction)
    assert fractions - {"fp8_block"} == set(spec.compute.peak_flops_per_s)
    assert "fp8_block" not in fractions or "fp8" in fractions


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_interconnect_is_consistent(path: Path) -> None:
    ic = _load(path).interconnect
    assert ic.peer_bw_bytes_per_s <= ic.link_bw_bytes_per_s
    if ic.topology == "mesh":
        # a full mesh splits the aggregate evenly over the other GPUs
        per_peer = ic.link_bw_bytes_per_s / (ic.gpus_per_node - 1)
        assert ic.peer_bw_bytes_per_s == pytest.approx(per_peer, rel=0.01)
    if ic.topology == "switch":
        assert ic.peer_bw_bytes_per_s == ic.link_bw_bytes_per_s


# -- attention_from: a device of the same die takes its sibling's fitted attention ---------------
SIBLINGS = {
    "h200_sxm": "h100_sxm",
    "gh200": "h100_sxm",
    "gh200_144gb": "h100_sxm",
    "h100_pcie": "h100_sxm",
    "a100_sxm_40gb": "a100_sxm_80gb",
    "a100_pcie_80gb": "a100_sxm_80gb",
}


# Devices whose own calibration fits the lent parts anew (aiconfigurator's H200 and B200
# tables): the sibling's is their prior, the uncalibrated spec's.
REFITTED = {"h200_sxm", "b200"}


@pytest.mark.parametrize(("hw", "sibling"), sorted(SIBLINGS.items()))
def test_same_die_takes_the_siblings_fitted_attention(hw: str, sibling: str) -> None:
    """Calibrated: the sibling's fit (curves, fixed costs, split rule); uncalibrated: its
    hand-written prior. Peaks, bandwidth and every other factor stay the device's own."""
    for calibrated in (False,) if hw in REFITTED else (True, False):
        spec = load_hardware(hw, calibrated=calibrated).efficiency.model_dump()
        other = load_hardware(sibling, calibrated=calibrated).efficiency.model_dump()
        assert spec["attention"] == other["attention"]
        assert spec["attention_kernels"] == other["attention_kernels"]
        for key in ("quant_fraction", "quant_size_curve"):  # vLLM's fp8 activation quantisation
            assert spec["gemm"][key] == other["gemm"][key]
    fitted = load_hardware(hw).efficiency.attention.model_dump()
    assert fitted != load_hardware(hw, calibrated=False).efficiency.attention.model_dump()
    assert load_hardware(hw).memory != load_hardware(sibling).memory


# -- collective_from: a device on the same fabric takes its sibling's fitted collectives --------
COLLECTIVE_SIBLINGS = {
    "h200_sxm": "h100_sxm",
    "gh200": "h100_sxm",
    "gh200_144gb": "h100_sxm",
    "mi250x": "mi300x",
    "b200": "h100_sxm",
    "a100_sxm_40gb": "a100_sxm_80gb",
}


@pytest.mark.parametrize(("hw", "sibling"), sorted(COLLECTIVE_SIBLINGS.items()))
def test_same_fabric_takes_the_siblings_fitted_collectives(hw: str, sibling: str) -> None:
    """The sibling's fit (latency, its growth with the group, size curve), with the keys the
    device's own `collective` gives (its measured busbw fraction) laid over it."""
    own = {"h200_sxm": 0.82, "b200": 0.76}
    for calibrated in (False,) if hw in REFITTED else (True, False):
        spec = load_hardware(hw, calibrated=calibrated).efficiency.collective
        other = load_hardware(sibling, calibrated=calibrated).efficiency.collective
        assert spec.busbw_fraction == own.get(hw, other.busbw_fraction)
        assert spec.model_dump(exclude={"busbw_fraction"}) == other.model_dump(
            exclude={"busbw_fraction"}
        )
    # A small all-reduce costs what it costs on the sibling's fabric, whatever the group
    # (GH200: one GPU a node, no group to time); a refitted device, what its own timings say.
    if hw in REFITTED:
        assert (
            load_hardware(hw).efficiency.collective != load_hardware(sibling).efficiency.collective
        )
        return
    for n in [n for n in (2, 4, 8) if n <= load_hardware(hw).interconnect.gpus_per_node]:
        mine = simulator.allreduce_cost(hardware=hw, num_devices=n, size_bytes=8192)
        theirs = simulator.allreduce_cost(hardware=sibling, num_devices=n, size_bytes=8192)
        assert mine.time_s[0] == pytest.approx(theirs.time_s[0], rel=0.05)


def test_bad_collective_from_names_the_file_and_field(tmp_path: Path) -> None:
    text = (SPEC_DIR / "h200_sxm.yaml").read_text(encoding="utf-8")
    path = tmp_path / "variant.yaml"
    path.write_text(text.replace("collective_from: h100_sxm", "collective_from: b200"))
    with pytest.raises(SpecError) as info:
        load_hardware(str(path))
    assert (info.value.source, info.value.field) == (str(path), "efficiency.collective_from")
    assert "b200 takes its collectives from another device" in info.value.reason


def test_h200_decode_reads_at_its_own_bandwidth() -> None:
    """The same fitted fraction of a larger bandwidth: a large decode is faster on H200, by
    less than 4.8 / 3.35 where the fitted latency limits (the page walk, per-block rate) that
    do not scale with bandwidth take part (64 x 8K: 684 us on H100, 521 on H200)."""
    kw = dict(phase="decode", batch_size=64, seq_len=8192, num_heads=64, num_kv_heads=8)
    h100 = simulator.attention_cost(hardware="h100_sxm", head_dim=128, **kw)
    h200 = simulator.attention_cost(hardware="h200_sxm", head_dim=128, **kw)
    ratio = float(h100.time_s[0] / h200.time_s[0])
    assert 1.2 < ratio < 4.8 / 3.35


def _variant(tmp_path: Path, efficiency_lines: str) -> str:
    """h200_sxm.yaml with its attention lines replaced."""
    text = (SPEC_DIR / "h200_sxm.yaml").read_text(encoding="utf-8")
    text = text.replace("  attention_from: h100_sxm\n", efficiency_lines)
    path = tmp_path / "variant.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        ("  attention_from: no_such_gpu\n", "unknown hardware id"),
        ("  attention_from: gh200\n", "gh200 takes its attention from another device"),
        ("  attention_from: [h100_sxm]\n", "expected a hardware id"),
        (
            "  attention_from: h100_sxm\n"
            "  attention: {prefill_fraction: 0.5, decode_fraction: 0.8}\n",
            "give either 'attention' or 'attention_from', not both",
        ),
    ],
)
def test_bad_attention_from_names_the_file_and_field(
    tmp_path: Path, lines: str, reason: str
) -> None:
    path = _variant(tmp_path, lines)
    with pytest.raises(SpecError) as info:
        load_hardware(path)
    assert (info.value.source, info.value.field) == (path, "efficiency.attention_from")
    assert reason in info.value.reason


def test_curves_compare_by_their_points_once_used() -> None:
    from simulator.specs._base import Curve

    a, b = Curve(points=((1.0, 0.5), (10.0, 1.0))), Curve(points=((1.0, 0.5), (10.0, 1.0)))
    a(3.0), b(4.0)  # interpolating caches numpy arrays on each
    assert a == b and hash(a) == hash(b) and a != Curve(points=((1.0, 0.5),))


@pytest.mark.parametrize(
    ("size_bytes", "time_us"),
    [
        (1 << 10, 13.11),
        (1 << 14, 13.54),
        (1 << 20, 27.42),
        (1 << 24, 148.8),
        (1 << 25, 244.1),
        (1 << 27, 797.4),
        (1 << 34, 94254.0),
    ],
)
def test_mi300x_all_reduce_follows_rccl_by_message_size(size_bytes: int, time_us: float) -> None:
    """8 x MI300X all-reduce time at sizes of AMD's bare-metal rccl-tests table its latency and
    size curve were solved from (RCCL 2.22.3, out of place; hardware_specs/mi300x.yaml [S69]).
    On the Azure VM's table it had before, 1 KB took 45 us and 1 MB 78 us; MI325X shares it."""
    for hw in ("mi300x", "mi325x"):
        cost = simulator.allreduce_cost(hardware=hw, num_devices=8, size_bytes=size_bytes)
        seconds = float(np.asarray(cost.time_s).ravel()[0])
        assert seconds * 1e6 == pytest.approx(time_us, rel=0.03), hw


# -- base: a spec that starts from another -------------------------------------------------------
def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def _dump_without(spec: HardwareSpec, *keys: str) -> dict[str, object]:
    return {k: v for k, v in spec.model_dump().items() if k not in keys}


def test_base_lays_the_file_over_the_named_spec_with_its_calibration(tmp_path: Path) -> None:
    """`base: h100_sxm` plus a faster memory: H100 SXM's spec as it loads, its fitted
    efficiency included, with that one number changed (the other memory keys kept: mappings
    merge key by key) and the file's own id. A plain copy of h100_sxm.yaml, by contrast,
    has no calibration beside it and runs the hand-written factors."""
    path = _write(
        tmp_path / "h100_fast_hbm.yaml",
        "base: h100_sxm\nmemory:\n  bandwidth_bytes_per_s: 4.02 TB/s\n",
    )
    spec, h100 = load_hardware(path), load_hardware("h100_sxm")
    assert spec.id == "h100_fast_hbm" and spec.name == h100.name
    assert spec.memory.bandwidth_bytes_per_s == pytest.approx(4.02e12)
    assert spec.memory.capacity_bytes == h100.memory.capacity_bytes
    assert _dump_without(spec, "id", "memory") == _dump_without(h100, "id", "memory")
    priors = load_hardware("h100_sxm", calibrated=False).efficiency.model_dump()
    assert load_hardware(path, calibrated=False).efficiency.model_dump() == priors
    assert priors != h100.efficiency.model_dump()
    copy = _write(tmp_path / "copy.yaml", (SPEC_DIR / "h100_sxm.yaml").read_text("utf-8"))
    assert load_hardware(copy).efficiency.model_dump() == priors


def test_base_alone_predicts_what_its_base_does(tmp_path: Path) -> None:
    path = _write(tmp_path / "same.yaml", "base: h100_sxm\n")
    kw = dict(model="llama-3.1-8b", batch_size=8, input_len=2048, output_len=128)
    ours = simulator.estimate(hardware=path, **kw)
    theirs = simulator.estimate(hardware="h100_sxm", **kw)
    assert (ours.ttft_s, ours.latency_s) == (theirs.ttft_s, theirs.latency_s)


def test_base_by_relative_path_chained_and_with_attention_from(tmp_path: Path) -> None:
    """A base by path relative to the file, over a spec that names a donor's attention
    (h200_sxm, whose calibration fits its own over H100's): the base's attention comes along;
    a file that names its own donor takes the donor's attention instead of its base's."""
    _write(tmp_path / "a.yaml", "base: h200_sxm\nprice: {usd_per_hour: 2.5}\n")
    path = _write(tmp_path / "sub" / "b.yaml", "base: ../a.yaml\npower: {tdp_w: 1000 W}\n")
    spec = load_hardware(path)
    assert (spec.price.usd_per_hour, spec.power.tdp_w) == (2.5, 1000.0)
    h200 = load_hardware("h200_sxm").efficiency
    assert spec.efficiency.attention.model_dump() == h200.attention.model_dump()
    own = _write(
        tmp_path / "c.yaml", "base: h200_sxm\nefficiency:\n  attention_from: a100_sxm_80gb\n"
    )
    a100 = load_hardware("a100_sxm_80gb").efficiency
    donor = load_hardware(own).efficiency
    assert donor.attention.model_dump() == a100.attention.model_dump()
    assert donor.gemm.model_dump() == load_hardware("h200_sxm").efficiency.gemm.model_dump()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("base: no_such_gpu\n", "unknown hardware id (known: "),
        ("base: missing.yaml\n", "no such file"),
        ("base: [h100_sxm]\n", "expected a hardware id or a path"),
        ("base: loop.yaml\n", "base specs form a cycle (loop -> loop)"),
    ],
)
def test_bad_hardware_base_names_the_file_and_field(tmp_path: Path, text: str, reason: str) -> None:
    path = _write(tmp_path / "loop.yaml", text)
    with pytest.raises(SpecError) as info:
        load_hardware(path)
    assert (info.value.source, info.value.field) == (path, "base")
    assert reason in info.value.reason


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("efficiency: {gemm: {peak_fraction: {bf16: 0}}}\n", "efficiency.gemm.peak_fraction.bf16"),
        ("efficiency: {gemm: {peak_fraction: {fp8: 1.5}}}\n", "efficiency.gemm.peak_fraction.fp8"),
        ("compute: {peak_flops_per_s: {bf16: -989.4 TFLOP/s}}\n", "compute.peak_flops_per_s.bf16"),
        ("memory: {bandwidth_bytes_per_s: .inf}\n", "memory.bandwidth_bytes_per_s"),
    ],
)
def test_an_impossible_factor_names_the_file_and_field(
    tmp_path: Path, text: str, field: str
) -> None:
    # A zero fraction made every GEMM take forever (inf latency, NaN metrics), not an error.
    path = _write(tmp_path / "bad.yaml", "base: h100_sxm\n" + text)
    with pytest.raises(SpecError) as info:
        load_hardware(path)
    assert (info.value.source, info.value.field) == (path, field)


def test_error_in_the_base_spec_names_that_file(tmp_path: Path) -> None:
    base = _write(tmp_path / "base.yaml", "base: h100_sxm\npower: {tdp_w: -5 W}\n")
    path = _write(tmp_path / "child.yaml", "base: base.yaml\n")
    with pytest.raises(SpecError) as info:
        load_hardware(path)
    assert (info.value.source, info.value.field) == (base, "power.tdp_w")


def test_attention_donor_must_not_be_built_on_a_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A donor on a base could lead back to the spec asking (base -> donor -> base ...):
    refused, naming the asking file's field."""
    specs = tmp_path / "specs"
    _write(specs / "derived_gpu.yaml", "base: h100_sxm\n")
    monkeypatch.setenv("LLMSIM_HARDWARE_PATH", str(specs))
    path = _write(
        tmp_path / "asks.yaml", "base: a100_sxm_80gb\nefficiency:\n  attention_from: derived_gpu\n"
    )
    with pytest.raises(SpecError) as info:
        load_hardware(path)
    assert (info.value.source, info.value.field) == (path, "efficiency.attention_from")
    assert "derived_gpu takes its attention from another device" in info.value.reason


def test_cli_runs_a_spec_on_a_base_and_refuses_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`llmsim hardware show` prints the derived spec under the file's id with the changed
    bandwidth; an unknown base exits 2 with one line naming the file and `base`."""
    path = _write(
        tmp_path / "h100_hbm3e.yaml", "base: h100_sxm\nmemory: {bandwidth_bytes_per_s: 4.8 TB/s}\n"
    )
    code, out, _ = run_cli(capsys, "hardware", "show", path)
    assert code == 0 and "(h100_hbm3e)" in out and "4.80 TB/s" in out
    bad = _write(tmp_path / "bad.yaml", "base: h100_sxn\n")
    code, out, err = run_cli(capsys, "hardware", "show", bad)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"llmsim: error: {bad}: base: unknown hardware id")
    assert "(known: " in err
