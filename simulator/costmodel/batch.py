"""What one engine step processes, summarised by the aggregates the cost model needs.

Each field may be a float or a numpy array; arrays describe many steps at once and every cost
function broadcasts over them (vectorised sweeps, the decode steps of `bench latency`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Num = float | np.ndarray


def attended_pairs(chunk: Num, offset: Num, window: int | None) -> Num:
    """(query, key) pairs a causal chunk of `chunk` tokens starting after `offset` cached tokens
    attends to: sum over positions p in (offset, offset + chunk] of min(p, window)."""
    q = np.asarray(chunk, dtype=float)
    c = np.asarray(offset, dtype=float)
    if window is None:
        return q * c + q * (q + 1.0) / 2.0
    w = float(window)
    top = np.minimum(c + q, w)  # positions up to the window attend to all before them
    full = np.where(top > c, (top * (top + 1.0) - c * (c + 1.0)) / 2.0, 0.0)
    capped = np.maximum(0.0, c + q - np.maximum(c, w)) * w
    return full + capped


@dataclass(frozen=True, slots=True)
class BatchShape:
    """Aggregates of one step's batch.

    prefill_tokens: prompt tokens computed this step (all chunks); prefill_seqs: sequences with
    a chunk; prefill_pairs: causal (query, key) pairs of those chunks, window-capped;
    prefill_kv_tokens: KV tokens the chunks read (offset + chunk, window-capped);
    decode_seqs: sequences decoding one token; decode_kv_tokens: their KV lengths summed,
    window-capped; sampled: sequences producing a token (decodes + prompts finishing).
    """

    prefill_tokens: Num = 0.0
    prefill_seqs: Num = 0.0
    prefill_pairs: Num = 0.0
    prefill_kv_tokens: Num = 0.0
    decode_seqs: Num = 0.0
    decode_kv_tokens: Num = 0.0
    sampled: Num = 0.0

    @property
    def num_tokens(self) -> Num:
        return self.prefill_tokens + self.decode_seqs

    @classmethod
    def prefill(
        cls,
        *,
        batch_size: Num,
        prompt_len: Num,
        offset: Num = 0.0,
        window: int | None = None,
        last_chunk: bool = True,
    ) -> BatchShape:
        """`batch_size` sequences each computing `prompt_len` tokens after `offset` cached."""
        b = np.asarray(batch_size, dtype=float)
        kv = np.minimum(offset + np.asarray(prompt_len, float), window or np.inf)
        return cls(
            prefill_tokens=b * prompt_len,
            prefill_seqs=b,
            prefill_pairs=b * attended_pairs(prompt_len, offset, window),
            prefill_kv_tokens=b * kv,
            sampled=b if last_chunk else 0.0,
        )

    @classmethod
    def decode(cls, *, batch_size: Num, context_len: Num, window: int | None = None) -> BatchShape:
        """`batch_size` sequences each attending to `context_len` KV tokens."""
        b = np.asarray(batch_size, dtype=float)
        ctx = np.minimum(np.asarray(context_len, dtype=float), window or np.inf)
        return cls(decode_seqs=b, decode_kv_tokens=b * ctx, sampled=b)

    @classmethod
    def mixed(
        cls,
        *,
        chunks: Sequence[tuple[int, int, bool]] = (),
        decode_context_lens: Sequence[int] = (),
        window: int | None = None,
    ) -> BatchShape:
        """A mixed step: prefill `chunks` as (tokens, offset, is_last_chunk) plus decodes."""
        q = np.array([c[0] for c in chunks], dtype=float)
        off = np.array([c[1] for c in chunks], dtype=float)
        last = sum(1 for c in chunks if c[2])
        ctx = np.minimum(np.array(decode_context_lens, dtype=float), window or np.inf)
        return cls(
            prefill_tokens=float(q.sum()),
            prefill_seqs=float(len(chunks)),
            prefill_pairs=float(np.sum(attended_pairs(q, off, window))),
            prefill_kv_tokens=float(np.minimum(q + off, window or np.inf).sum()),
            decode_seqs=float(len(ctx)),
            decode_kv_tokens=float(ctx.sum()),
            sampled=float(last + len(ctx)),
        )


def windowed(b: BatchShape, window: int) -> BatchShape:
    """`b` as layers attending within `window` tokens see it: each query attends to at most
    `window` keys and each sequence reads at most `window` cached tokens. From the aggregates
    alone this is exact where every sequence is past the window or every one within it, and an
    upper bound otherwise (a hybrid layout's window layers; `attended_pairs` is exact)."""
    w = float(window)
    return dataclasses.replace(
        b,
        prefill_pairs=np.minimum(b.prefill_pairs, b.prefill_tokens * w),
        prefill_kv_tokens=np.minimum(b.prefill_kv_tokens, b.prefill_seqs * w),
        decode_kv_tokens=np.minimum(b.decode_kv_tokens, b.decode_seqs * w),
    )
