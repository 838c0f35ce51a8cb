"""`bench latency` under a KV token budget: each decode of the static batch attends to what the
budget keeps, SnapKV's selection runs at the end of each prompt, and the batch fits when what
its sequences keep fits (a prompt is whole until its first decode)."""

from __future__ import annotations

import pytest
from clitools import one_line_error, run_cli

from simulator.errors import SpecError
from simulator.runs.latency import estimate

LONG = {"model": "llama-3.1-8b", "hardware": "h100_sxm", "input_len": 32000, "output_len": 256}
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.5}


@pytest.mark.parametrize("policy", ["snapkv", "h2o", "streaming"])
def test_decodes_read_what_the_budget_keeps(policy: str) -> None:
    """Eight 32,000-token prompts decoding 256 tokens on an H100: a 2,048-token budget more
    than halves the time per output token (each step reads ~2K tokens of KV instead of 32K);
    SnapKV's selection makes the prefill a little longer, the other policies' prefill is the
    plain one."""
    plain = estimate(batch_size=8, **LONG)
    kept = estimate(batch_size=8, kv_budget=2048, kv_eviction=policy, **LONG)
    assert kept.tpot_s < 0.5 * plain.tpot_s
    if policy == "snapkv":
        assert kept.ttft_s > plain.ttft_s
    else:
        assert kept.ttft_s == pytest.approx(plain.ttft_s)


def test_a_budget_fits_a_batch_that_holds_too_much_without() -> None:
    """16 such sequences need more KV blocks than the H100 has; under the budget only one
    prompt is whole at a time (the others keep their budget)."""
    with pytest.raises(SpecError, match="KV blocks"):
        estimate(batch_size=16, **LONG)
    assert estimate(batch_size=16, kv_budget=2048, **LONG).latency_s > 0


def test_a_budget_with_speculation_decodes_faster_still() -> None:
    """Speculation verifies its proposals over what the budget keeps: faster than the budget
    alone, and than speculation over the whole context."""
    budget = estimate(batch_size=8, kv_budget=2048, **LONG)
    both = estimate(batch_size=8, kv_budget=2048, speculative_config=SPEC, **LONG)
    spec = estimate(batch_size=8, speculative_config=SPEC, **LONG)
    assert both.tpot_s < budget.tpot_s and both.tpot_s < spec.tpot_s


def test_the_cli_takes_the_budget_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "latency", "--model", "llama-3.1-8b", "--hardware", "h100_sxm"]
    args += ["--batch-size", "2", "--input-len", "4096", "--output-len", "32"]
    code, out, _ = run_cli(capsys, *args, "--kv-budget", "512", "--kv-eviction", "h2o")
    assert code == 0 and "Avg latency" in out
    assert "--kv-eviction" in one_line_error(
        capsys, *args, "--kv-budget", "512", "--kv-eviction", "lru"
    )


def test_a_window_fits_the_batch_its_largest_batch_figure_promises() -> None:
    """Mistral 7B (every layer in a 4096-token window) on an A100 80GB: 40 prompts of 30,000
    tokens hold their windows, not every token; the check once refused them while naming a
    largest batch of 111."""
    result = estimate(
        model="mistral-7b", hardware="a100_sxm_80gb", batch_size=40, input_len=30000, output_len=64
    )
    assert result.latency_s > 0 and result.memory.max_batch(seq_len=30064) >= 40
