"""What prompts share, for prefix caching: shared system prompts and multi-turn sessions.

Requests carry token counts, not tokens, so content is described by where it comes from: a
prompt is `prefix_len` tokens of shared prefix `prefix_id` (a system prompt; -1: none)
followed by the start of a token stream: the conversation `session_id`, or, for -1, a stream
of the request's own. A request's output continues its stream. Two prompts hold the same
first t tokens exactly when this description says so (the same prefix up to t, then the same
stream), which is all a block-hashing prefix cache needs (`kv_cache.PrefixCachingBlockManager`).

A session's turn k+1 is sent after turn k finished (`follows`, `think_s`), as vLLM's multi-turn
benchmark client does; its prompt is the conversation so far plus a new user message.

Not modelled: history truncation when a conversation outgrows the context (a prompt clamped
by `max_input_len` is the first tokens of its conversation), tokenizer differences between an
output and the same text re-sent in the next prompt, content shared other than at the start.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from simulator.specs.workload import Sessions, SharedPrefix


@dataclass(frozen=True)
class Content:
    """Per request: its conversation (-1: none), shared prefix id (-1: none) and length, the
    request it follows (-1: sent at its arrival time) and the delay after that one finishes."""

    session_id: np.ndarray
    prefix_id: np.ndarray
    prefix_len: np.ndarray
    follows: np.ndarray
    think_s: np.ndarray

    def check(self, prompt_len: np.ndarray) -> None:
        """ValueError unless consistent with these prompt lengths."""
        if np.any((self.prefix_len < 0) | (self.prefix_len > prompt_len)):
            raise ValueError("prefix_len must lie in [0, prompt_len]")
        if np.any((self.prefix_id < 0) & (self.prefix_len > 0)):
            raise ValueError("a prefix_len needs a prefix_id")
        if np.any(self.session_id < -1) or np.any(self.prefix_id < -1):
            raise ValueError("ids are >= 0, or -1 for none")
        later = np.flatnonzero(self.follows >= 0)
        earlier = self.follows[later]
        if np.any(earlier >= later) or len(np.unique(earlier)) < len(earlier):
            raise ValueError("follows must name an earlier row, each at most once")
        if not np.all(np.isfinite(self.think_s) & (self.think_s >= 0)):
            raise ValueError("think_s must be finite and >= 0")

    @classmethod
    def unshared(cls, n: int, *, session_id: np.ndarray | None = None) -> Content:
        none = np.full(n, -1, dtype=np.int64)
        return cls(
            session_id=none if session_id is None else session_id,
            prefix_id=none,
            prefix_len=np.zeros(n, dtype=np.int64),
            follows=none,
            think_s=np.zeros(n),
        )


def session_turns(
    user_len: np.ndarray, output_len: np.ndarray, spec: Sessions
) -> tuple[np.ndarray, Content]:
    """Rows grouped into conversations in order, `spec.turns` rows each: (prompt lengths, the
    content). Turn k's prompt is every earlier user message and reply of its conversation, then
    its own message; turn k+1 follows turn k (think times are drawn by `think_times`)."""
    n = len(user_len)
    row = np.arange(n)
    turn = row % spec.turns
    exchanged = user_len + output_len
    before = np.cumsum(exchanged) - exchanged  # every earlier row's tokens
    history = before - before[row - turn]  # ... of this conversation
    follows = np.where(turn > 0, row - 1, -1)
    content = Content.unshared(n, session_id=row // spec.turns)
    return history + user_len, dataclasses.replace(content, follows=follows)


def conversation_starts(content: Content) -> np.ndarray:
    """Rows that start a conversation (or stand alone): those the arrival process places."""
    return np.flatnonzero(content.follows < 0)


def think_times(content: Content, spec: Sessions, rng: np.random.Generator) -> Content:
    """`content` with a think time for every follow-up turn."""
    later = content.follows >= 0
    think = np.zeros(len(later))
    if spec.think_time == "exponential":
        think[later] = rng.exponential(spec.think_time_s, size=int(later.sum()))
    else:
        think[later] = spec.think_time_s
    return dataclasses.replace(content, think_s=think)


def add_prefix(
    prompt: np.ndarray, content: Content, spec: SharedPrefix, rng: np.random.Generator
) -> tuple[np.ndarray, Content]:
    """Put a shared system prompt before the prompts of a share of the conversations (requests
    outside a conversation count as one each): (longer prompts, content with the prefix)."""
    sid = content.session_id
    alone = sid < 0
    # one unit per conversation, then one per request without one
    unit = np.where(alone, sid.max(initial=-1) + 1 + np.cumsum(alone) - 1, sid)
    _, unit = np.unique(unit, return_inverse=True)
    units = int(unit.max(initial=-1)) + 1
    carries = rng.random(units) < spec.share
    which = rng.integers(0, spec.count, size=units)
    has = carries[unit]
    prefix_len = np.where(has, spec.tokens, 0).astype(np.int64)
    prefix_id = np.where(has, which[unit], -1).astype(np.int64)
    shared = dataclasses.replace(content, prefix_id=prefix_id, prefix_len=prefix_len)
    return prompt + prefix_len, shared
