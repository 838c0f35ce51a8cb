"""Long-context KV techniques: KV formats below 8 bits (KIVI's int2, COMET's int4), sliding-window
and hybrid local/global layer layouts (their KV held, their attention read), KV token budgets
(SnapKV, H2O, StreamingLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from factories import gpu_step
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import deployment
from simulator.costmodel.memory import KvHold
from simulator.errors import SpecError
from simulator.serving.kv_cache import BlockManager
from simulator.serving.request import Request
from simulator.serving.steptime import StepTimer
from simulator.specs.deployment import KvEviction
from simulator.specs.hf import from_hf_config
from simulator.specs.model import CCAttention, ModelSpec

MODELS = Path(__file__).parents[2] / "simulator" / "specs" / "models"
# Wider to narrower: a later entry never takes more bytes per cached element.
KV_ORDER = ("auto", "fp8", "int4", "int2")


def llama_config(**changes: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((MODELS / "llama-3.1-8b.json").read_text())
    return cfg | changes


def model(**changes: Any) -> ModelSpec:
    return from_hf_config(llama_config(**changes), name="test")


# -- KV formats below 8 bits --------------------------------------------------------------------
def test_int2_bytes_per_token_count_scales_and_zero_points() -> None:
    """KIVI int2, groups of 32 with an fp16 scale and zero each: 2 + 32/32 = 3 bits an element,
    so Llama-3.1-8B's 128 KiB a token in bf16 (32 layers x 2 x 8 heads x 128 x 2 bytes) is
    24 KiB, 16/3 = 5.33x fewer bytes; COMET int4, groups of 128: 4.25 bits, 3.76x."""
    plans = {kv: deployment(model="llama-3.1-8b", hardware="h100_sxm", kv_cache_dtype=kv).memory()
             for kv in ("auto", "int4", "int2")}  # fmt: skip
    assert plans["auto"].kv_bytes_per_token == 131072
    assert plans["int2"].kv_bytes_per_token == 24576
    assert plans["int4"].kv_bytes_per_token == 131072 * 4.25 / 16
    assert plans["auto"].residual_bytes == plans["int4"].residual_bytes == 0


def test_int2_capacity_with_its_residual_window() -> None:
    """KIVI keeps each sequence's last 128 tokens in 16 bits: the memory plan sets aside what
    they cost beyond their packed bytes for max_num_seqs sequences, and the rest holds 16/3 x
    the tokens bf16 would."""
    seqs = 256
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm", kv_cache_dtype="int2")
    plan = dep.memory(max_num_seqs=seqs)
    bf16 = deployment(model="llama-3.1-8b", hardware="h100_sxm").memory(max_num_seqs=seqs)
    assert plan.residual_bytes == seqs * 128 * (131072 - 24576)
    expected = (bf16.kv_cache_bytes - plan.residual_bytes) / 24576
    assert plan.kv_capacity_tokens == pytest.approx(expected, abs=plan.block_size)
    ratio = plan.kv_capacity_tokens / bf16.kv_capacity_tokens
    assert ratio == pytest.approx(
        16 / 3 * (1 - plan.residual_bytes / bf16.kv_cache_bytes), rel=1e-3
    )
    assert 4.9 < ratio < 16 / 3  # on an H100 with 256 sequences' windows set aside: 5.01x


def test_kivi_headline_larger_batch() -> None:
    """KIVI (arXiv 2402.02750, fig. 4): Llama-2-7B on an 80 GB A100 serves up to 4x the batch
    with 2-bit KV; llmsim's plan admits about 4x as many 4096-token sequences."""

    def batch(kv: str) -> int:
        dep = deployment(model="llama-2-7b", hardware="a100_sxm_80gb", kv_cache_dtype=kv)
        return dep.memory(max_num_seqs=128).max_batch(seq_len=4096)

    assert 3.5 <= batch("int2") / batch("auto") <= 5.5


@settings(max_examples=25, deadline=None)
@given(
    wider=st.sampled_from(KV_ORDER),
    narrower=st.sampled_from(KV_ORDER),
    seqs=st.integers(1, 512),
    model_id=st.sampled_from(["llama-3.1-8b", "mistral-7b", "qwen3-30b-a3b"]),
)
def test_narrower_kv_never_costs_more(wider: str, narrower: str, seqs: int, model_id: str) -> None:
    """A narrower KV dtype never raises bytes per token nor lowers the tokens the cache holds.
    The one exception is left out: int2 against int4 with many sequences, where KIVI's 16-bit
    residual windows (128 tokens a sequence) outweigh what 2 bits save over COMET's 4
    (`test_int2_residual_windows_can_cost_more_than_int4`)."""
    if KV_ORDER.index(narrower) < KV_ORDER.index(wider):
        wider, narrower = narrower, wider
    if (wider, narrower) == ("int4", "int2"):
        wider = "fp8"
    plans = [
        deployment(model=model_id, hardware="h100_sxm", kv_cache_dtype=kv).memory(max_num_seqs=seqs)
        for kv in (wider, narrower)
    ]
    assert plans[1].kv_bytes_per_token <= plans[0].kv_bytes_per_token
    assert plans[1].kv_capacity_tokens >= plans[0].kv_capacity_tokens


def test_int2_residual_windows_can_cost_more_than_int4() -> None:
    """With 1024 sequences' residual windows set aside, int2 holds fewer tokens than int4 on a
    tight device (Qwen3-30B-A3B on an H100), though fewer bytes per quantized token."""

    def plan(kv: str) -> Any:
        dep = deployment(model="qwen3-30b-a3b", hardware="h100_sxm", kv_cache_dtype=kv)
        return dep.memory(max_num_seqs=1024)

    int4, int2 = plan("int4"), plan("int2")
    assert int2.kv_bytes_per_token < int4.kv_bytes_per_token
    assert int2.kv_capacity_tokens < int4.kv_capacity_tokens


def test_low_bit_kv_prices_quantize_and_packed_reads() -> None:
    """int2 decode reads the packed KV (plus residual windows) instead of bf16 KV: a decode
    step at long context is faster; new tokens pay a kv_quantize kernel."""
    batch = BatchShape.decode(batch_size=64, context_len=32768)
    steps = {
        kv: gpu_step(
            deployment(model="llama-3.1-8b", hardware="h100_sxm", kv_cache_dtype=kv), batch
        )
        for kv in ("auto", "int2")
    }
    names = {kv: {c.op.name for c in s.costs} for kv, s in steps.items()}
    assert "kv_quantize" in names["int2"] and "kv_quantize" not in names["auto"]
    assert steps["int2"].seconds < 0.6 * steps["auto"].seconds


def test_unknown_kv_dtype_names_the_choices() -> None:
    with pytest.raises(SpecError, match="int4, int2") as err:
        deployment(model="llama-3.1-8b", hardware="h100_sxm", kv_cache_dtype="int3")
    assert err.value.field == "kv_cache_dtype"


# -- sliding windows and hybrid layouts ---------------------------------------------------------
def test_hf_layer_types_and_patterns() -> None:
    layers = 32
    types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    gemma3 = model(sliding_window=1024, layer_types=types)
    assert gemma3.attention.sliding_window_layers == sum(t != "full_attention" for t in types)
    assert gemma3.attention.batch_window is None
    pattern = model(sliding_window=1024, sliding_window_pattern=6)
    assert pattern.num_window_layers == gemma3.num_window_layers == 27
    gemma2 = model(sliding_window=4096, model_type="gemma2")
    assert gemma2.num_window_layers == 16
    every = model(sliding_window=4096)
    assert every.num_window_layers == layers and every.attention.batch_window == 4096
    assert model().num_window_layers == 0


def test_hf_layer_types_bad_entry_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="layer_types"):
        model(sliding_window=1024, layer_types=["chunked_attention"] * 32)
    with pytest.raises(KeyError, match="layer_types"):
        model(sliding_window=1024, layer_types=["full_attention"])


def test_sliding_window_kv_at_128k_is_bounded_by_the_window() -> None:
    """Every layer in a 4096-token window: a 128K-token sequence holds 4096 tokens of KV; a
    hybrid 5:1 layout holds the global layers' 128K plus the local layers' window."""
    ctx, window = 131072, 4096
    every = deployment(model=model(sliding_window=window), hardware="h200_sxm").memory()
    assert every.hold is not None and every.hold.tokens(ctx) == window
    assert every.max_batch(seq_len=ctx) == every.kv_capacity_blocks // (window // 16)
    hybrid = deployment(
        model=model(sliding_window=window, sliding_window_pattern=6), hardware="h200_sxm"
    ).memory()
    assert hybrid.hold is not None
    local = 27 / 32
    assert hybrid.hold.tokens(ctx) == pytest.approx((1 - local) * ctx + local * window, abs=1)
    full = deployment(model=model(), hardware="h200_sxm").memory()
    assert full.max_batch(seq_len=ctx) < hybrid.max_batch(seq_len=ctx)
    assert hybrid.max_batch(seq_len=ctx) < every.max_batch(seq_len=ctx)


def test_hybrid_attention_reads_the_window_in_local_layers() -> None:
    """Decode at 128K: a hybrid layout's attention costs between all-global and all-window."""

    def attention_s(m: ModelSpec) -> float:
        window = m.attention.batch_window  # the serving loop caps a batch at it
        batch = BatchShape.decode(batch_size=16, context_len=131072, window=window)
        step = gpu_step(deployment(model=m, hardware="h200_sxm"), batch)
        return sum(
            float(c.time_s.ravel()[0]) * c.op.count
            for c in step.costs
            if c.op.kind == "attention_decode"
        )

    full = attention_s(model())
    hybrid = attention_s(model(sliding_window=4096, sliding_window_pattern=6))
    every = attention_s(model(sliding_window=4096))
    assert every < hybrid < full
    assert hybrid == pytest.approx(full * 5 / 32 + every * 27 / 32, rel=0.1)


@settings(max_examples=50, deadline=None)
@given(
    window=st.integers(1, 10_000),
    share=st.floats(0.0, 1.0),
    computed=st.integers(0, 200_000),
    more=st.integers(0, 10_000),
)
def test_hold_never_exceeds_the_tokens_and_never_shrinks(
    window: int, share: float, computed: int, more: int
) -> None:
    hold = KvHold(window=window, window_share=share)
    assert hold.tokens(computed) <= computed
    assert hold.tokens(computed) <= hold.tokens(computed + more)
    as_array = hold.tokens_of(np.array([computed]), np.array([computed]))
    assert int(as_array[0]) == hold.tokens(computed)


def test_block_manager_gives_back_blocks_outside_the_window() -> None:
    kv = BlockManager(num_blocks=100, block_size=16, hold=KvHold(window=64, window_share=1.0))
    req = Request(id=0, arrival_s=0.0, prompt_len=1000, output_len=10)
    assert kv.allocate(req, 1000)
    assert req.blocks == 4 and kv.free == 96
    req.num_computed = 1000
    kv.extend([req], 1)
    assert req.blocks == 4  # the window moves; nothing more is held


# -- KV token budgets ---------------------------------------------------------------------------
def budget_plan(budget: int | None, policy: str = "snapkv", **knobs: Any) -> Any:
    dep = deployment(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        kv_budget=budget,
        kv_eviction=policy,
        **knobs,
    )
    return dep.memory()


@pytest.mark.parametrize(
    ("policy", "held"),
    [("snapkv", 2048 + 1000), ("h2o", 2048), ("streaming", 2048)],
)
def test_budget_holds_what_its_policy_keeps(policy: str, held: int) -> None:
    """A 32K prompt and 1000 generated tokens under a 2048-token budget: SnapKV compresses the
    prompt and keeps every generated token; H2O and StreamingLLM keep 2048 in all. While the
    prompt is prefilled it is held whole."""
    ev = KvEviction(budget_tokens=2048, policy=policy)  # type: ignore[arg-type]
    assert ev.held(32000, 32000) == 32000
    assert ev.held(33000, 32000) == held
    plan = budget_plan(2048, policy)
    assert plan.hold is not None and plan.hold.tokens(33000, 32000) == held
    full = budget_plan(None)
    assert plan.kv_bytes_per_token == full.kv_bytes_per_token
    ratio = plan.max_batch(seq_len=33000, prompt_len=32000) / full.max_batch(seq_len=33000)
    assert ratio == pytest.approx(33000 / held, rel=0.05)


@settings(max_examples=40, deadline=None)
@given(
    small=st.integers(1, 100_000),
    large=st.integers(1, 100_000),
    policy=st.sampled_from(["snapkv", "h2o", "streaming"]),
    prompt=st.integers(1, 100_000),
    output=st.integers(1, 20_000),
)
def test_smaller_budget_never_holds_more(
    small: int, large: int, policy: str, prompt: int, output: int
) -> None:
    """A smaller budget never raises what a sequence holds, so never lowers the sequences the
    cache holds at once; no budget holds the most."""
    small, large = min(small, large), max(small, large)
    lo = KvHold(eviction=KvEviction(budget_tokens=small, policy=policy))  # type: ignore[arg-type]
    hi = KvHold(eviction=KvEviction(budget_tokens=large, policy=policy))  # type: ignore[arg-type]
    for computed in (prompt // 2, prompt, prompt + output):
        assert lo.tokens(computed, prompt) <= hi.tokens(computed, prompt) <= computed
    total = prompt + output
    plans = [budget_plan(b, policy) for b in (small, large, None)]
    batches = [p.max_batch(seq_len=total, prompt_len=prompt) for p in plans]
    assert batches[0] >= batches[1] >= batches[2]


def test_budget_runs_with_kv_offload_tiers() -> None:
    from simulator.runs import runner
    from simulator.specs.engine_args import EngineArgs

    args = EngineArgs(kv_budget=64, enable_prefix_caching=True, kv_offloading_size=8)
    result, _ = runner.bench_throughput(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        input_len=256,
        output_len=8,
        num_prompts=2,
        engine_args=args,
    )
    assert result.summary["completed"] == 2


def test_a_budget_under_prefix_caching_keeps_a_shared_prefix_whole() -> None:
    """A SnapKV budget of 128 tokens on a 1,000-token prompt whose first 512 are a shared
    prefix: the prefix's 32 blocks stay whole and shareable, the budget frees the request's own
    blocks beyond what it keeps (at least its last own block stays)."""
    from simulator.serving.kv_cache import PrefixCachingBlockManager

    hold = KvHold(eviction=KvEviction(budget_tokens=128))
    kv = PrefixCachingBlockManager(num_blocks=200, block_size=16, hold=hold)
    req = Request(id=0, arrival_s=0.0, prompt_len=1000, output_len=4, prefix_id=7, prefix_len=512)
    assert kv.allocate(req, 1000)
    assert req.blocks == 63  # the whole prompt while it is prefilled
    req.num_computed = 1000
    kv.extend([req], 1)  # its first decode: the budget applies
    assert req.blocks == 33 and kv.free == 167
    other = Request(id=1, arrival_s=0.0, prompt_len=700, output_len=4, prefix_id=7, prefix_len=512)
    assert kv.prefix_hit(other) == 512
    kv.release(req)
    assert kv.free == 200


def long_prompts(budget: int | None, *, prefix_caching: bool = False) -> dict[str, Any]:
    """bench throughput's summary of 48 prompts of 32K tokens decoding 512 on an H100 under a
    SnapKV `budget` (None: the full KV)."""
    from simulator.runs import runner
    from simulator.specs.engine_args import EngineArgs

    args = EngineArgs(kv_budget=budget, enable_prefix_caching=prefix_caching)
    _, summary = runner.bench_throughput(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        input_len=32000,
        output_len=512,
        num_prompts=48,
        engine_args=args,
    )
    return summary


def test_a_budget_holds_the_same_with_prefix_caching_on() -> None:
    """32K-token prompts under a 2048-token SnapKV budget: with prefix caching on (random
    prompts share nothing) the run holds and serves what it does with it off."""
    on, off = long_prompts(2048, prefix_caching=True), long_prompts(2048)
    assert on["elapsed_time"] == pytest.approx(off["elapsed_time"], rel=1e-3)


def test_unknown_eviction_policy() -> None:
    with pytest.raises(SpecError, match="snapkv, h2o, streaming") as err:
        deployment(model="llama-3.1-8b", hardware="h100_sxm", kv_budget=64, kv_eviction="lru")
    assert err.value.field == "kv_eviction"


def test_decode_at_long_context_is_faster_with_a_budget() -> None:
    """64 sequences decoding at 64K: H2O's 2048-token budget reads 2048 tokens each (plus its
    score bookkeeping), which the step timer prices below the full read."""

    def run(budget: int | None) -> float:
        dep = deployment(
            model="llama-3.1-8b",
            hardware="h100_sxm",
            kv_budget=budget,
            kv_eviction="h2o",
        )
        timer = StepTimer(dep, max_num_seqs=64, max_num_batched_tokens=8192, max_context=70_000)
        return float(timer.decode_run(num_seqs=64, total_context=64 * 65536.0, steps=4).mean())

    full, budgeted = run(None), run(2048)
    assert budgeted < 0.5 * full


def test_eviction_kernels_are_priced() -> None:
    """SnapKV's observation-window scores and selection join the prefill; H2O's accumulated
    scores the decode; StreamingLLM adds none."""
    batch = BatchShape(
        prefill_tokens=4096.0,
        prefill_seqs=1.0,
        prefill_pairs=4096.0 * 4097 / 2,
        prefill_kv_tokens=4096.0,
        decode_seqs=8.0,
        decode_kv_tokens=8 * 2048.0,
        sampled=9.0,
    )

    def names(policy: str) -> set[str]:
        dep = deployment(
            model="llama-3.1-8b", hardware="h100_sxm", kv_budget=2048, kv_eviction=policy
        )
        return {c.op.name for c in gpu_step(dep, batch).costs}

    base = names("streaming")
    assert names("snapkv") - base == {"snapkv_scores", "snapkv_select"}
    assert names("h2o") - base == {"h2o_scores"}


def test_serving_with_a_budget_runs_more_sequences_at_once() -> None:
    """bench throughput of 32K-token prompts: a 2048-token SnapKV budget lets more sequences
    decode at once than the full KV, and the run finishes sooner."""
    assert long_prompts(2048)["elapsed_time"] < long_prompts(None)["elapsed_time"]


# -- compressed convolutional attention (CCA / CCGQA) -------------------------------------------
def test_cca_is_declared_like_gqa_in_a_latent() -> None:
    """`cca_compression: 4` on Llama-3.1-8B's shape: 32 query and 8 KV heads of 4096 / (4 x 32)
    = 32 dims, so a quarter of the KV bytes and of the projections' width; `cca_time0/1` (ZAYA1's
    names) are the convolutions' taps."""
    cca = model(cca_compression=4, cca_time0=2, cca_time1=3)
    attn = cca.attention
    assert isinstance(attn, CCAttention) and attn.kind == "cca"
    assert (attn.num_heads, attn.num_kv_heads, attn.head_dim) == (32, 8, 32)
    assert attn.conv_kernels == (2, 3) and attn.compression(4096) == 4
    gqa = model()
    assert cca.kv_bytes_per_token() == gqa.kv_bytes_per_token() / 4
    convs = (32 + 8) * 32 * 2 + (32 + 8) * 32 * 3 * 32
    assert attn.params(4096) == (gqa.attention.params(4096)) / 4 + convs
    zaya_like = model(head_dim=128, num_attention_heads=8, num_key_value_heads=2, cca_time0=2)
    assert zaya_like.attention.kind == "cca" and zaya_like.attention.head_dim == 128


def test_cca_shrinks_kv_and_prefill_attention_and_pays_its_convolutions() -> None:
    """At 16K-token prefill CCA's attention FLOPs are a quarter of GQA's and the step is
    faster; its convolution kernels appear in the step; its cache holds 4x the tokens."""
    batch = BatchShape.prefill(batch_size=1, prompt_len=16384)

    def step(m: ModelSpec) -> Any:
        return gpu_step(deployment(model=m, hardware="h100_sxm"), batch)

    gqa, cca = step(model()), step(model(cca_compression=4))

    def flops(s: Any) -> float:
        return sum(
            float(np.ravel(c.op.flops)[0]) * c.op.count
            for c in s.costs
            if c.op.kind == "attention_prefill"
        )

    assert flops(cca) == pytest.approx(flops(gqa) / 4)
    assert cca.seconds < gqa.seconds
    names = {c.op.name for c in cca.costs}
    assert {"cca_conv_depthwise", "cca_conv_grouped", "cca_mix"} <= names
    plans = [
        deployment(model=m, hardware="h100_sxm").memory()
        for m in (model(), model(cca_compression=4))
    ]
    assert plans[1].kv_capacity_tokens > 3.9 * plans[0].kv_capacity_tokens
    assert plans[1].residual_bytes > 0  # each sequence slot's convolution state


def test_cca_compression_must_be_a_whole_number() -> None:
    with pytest.raises(KeyError, match="cca_compression"):
        model(cca_compression=0)
