"""`attended_pairs` and `BatchShape`: the token arithmetic every cost starts from.

Causal attention of a chunk of q tokens after c cached tokens: the token at position p (1-based)
attends to min(p, window) keys, summed over p in (c, c + q]. Without a window the sum is
q * c + q (q + 1) / 2; with one, the closed form in `attended_pairs` is checked against a loop.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.batch import BatchShape, attended_pairs


def brute_force_pairs(chunk: int, offset: int, window: int | None) -> int:
    """The definition, one query position at a time."""
    return sum(
        p if window is None else min(p, window) for p in range(offset + 1, offset + chunk + 1)
    )


# -- attended_pairs -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("chunk", "offset", "expected"),
    [
        # q * c + q (q + 1) / 2
        (1, 0, 1),  # 1 * 0 + 1 * 2 / 2
        (4, 0, 10),  # 0 + 4 * 5 / 2: the 4 x 4 lower triangle
        (4, 6, 34),  # 4 * 6 + 10
        (1, 4095, 4096),  # one decode-like query over 4095 cached tokens + itself
        (1024, 3072, 1024 * 3072 + 1024 * 1025 // 2),
    ],
)
def test_attended_pairs_causal_without_window(chunk: int, offset: int, expected: int) -> None:
    assert attended_pairs(chunk, offset, None) == expected


@settings(max_examples=50, deadline=None)
@given(chunk=st.integers(0, 5000), offset=st.integers(0, 5000))
def test_attended_pairs_causal_formula(chunk: int, offset: int) -> None:
    q, c = float(chunk), float(offset)
    assert attended_pairs(chunk, offset, None) == pytest.approx(q * c + q * (q + 1) / 2, rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(chunk=st.integers(0, 60), offset=st.integers(0, 60), window=st.integers(1, 80))
def test_attended_pairs_with_window_matches_brute_force(
    chunk: int, offset: int, window: int
) -> None:
    assert attended_pairs(chunk, offset, window) == brute_force_pairs(chunk, offset, window)


@settings(max_examples=50, deadline=None)
@given(chunk=st.integers(0, 60), offset=st.integers(0, 60))
def test_attended_pairs_without_window_matches_brute_force(chunk: int, offset: int) -> None:
    assert attended_pairs(chunk, offset, None) == brute_force_pairs(chunk, offset, None)


def test_a_window_wider_than_the_context_changes_nothing() -> None:
    assert attended_pairs(100, 50, 10_000) == attended_pairs(100, 50, None)


def test_attended_pairs_broadcasts_over_arrays() -> None:
    chunks = np.array([0, 1, 7, 30])
    offsets = np.array([5, 0, 13, 2])
    got = attended_pairs(chunks, offsets, 16)
    want = [brute_force_pairs(int(q), int(c), 16) for q, c in zip(chunks, offsets, strict=True)]
    np.testing.assert_array_equal(got, want)


# -- BatchShape -----------------------------------------------------------------------------------
def test_prefill_shape_aggregates() -> None:
    # 4 prompts of 100 tokens after 20 cached: 400 tokens, each chunk reads 120 KV tokens and has
    # 100 * 20 + 100 * 101 / 2 = 7050 pairs.
    b = BatchShape.prefill(batch_size=4, prompt_len=100, offset=20)
    assert b.prefill_tokens == 400
    assert b.prefill_seqs == 4
    assert b.prefill_pairs == 4 * 7050
    assert b.prefill_kv_tokens == 4 * 120
    assert b.sampled == 4
    assert b.decode_seqs == 0
    assert b.num_tokens == 400


def test_a_middle_chunk_samples_nothing() -> None:
    assert BatchShape.prefill(batch_size=2, prompt_len=64, last_chunk=False).sampled == 0


def test_decode_shape_caps_the_context_at_the_window() -> None:
    b = BatchShape.decode(batch_size=8, context_len=6000, window=4096)
    assert b.decode_seqs == 8
    assert b.decode_kv_tokens == 8 * 4096
    assert b.sampled == 8
    assert b.num_tokens == 8
    assert BatchShape.decode(batch_size=8, context_len=6000).decode_kv_tokens == 8 * 6000


def test_mixed_shape_sums_its_chunks_and_decodes() -> None:
    # chunks: 512 tokens at offset 0 (last), 256 at offset 1024 (not last); decodes at 10 and 5000
    b = BatchShape.mixed(
        chunks=[(512, 0, True), (256, 1024, False)], decode_context_lens=[10, 5000]
    )
    assert b.prefill_tokens == 768
    assert b.prefill_seqs == 2
    assert b.prefill_pairs == 512 * 513 / 2 + (256 * 1024 + 256 * 257 / 2)
    assert b.prefill_kv_tokens == 512 + 1280
    assert b.decode_seqs == 2
    assert b.decode_kv_tokens == 5010
    assert b.sampled == 3  # one finished prompt + two decodes
    assert b.num_tokens == 770


def test_mixed_shape_of_equal_chunks_equals_the_prefill_shape() -> None:
    mixed = BatchShape.mixed(chunks=[(300, 100, True)] * 3, window=256)
    direct = BatchShape.prefill(batch_size=3, prompt_len=300, offset=100, window=256)
    for name in BatchShape.__slots__:
        assert float(getattr(mixed, name)) == pytest.approx(float(getattr(direct, name)))
