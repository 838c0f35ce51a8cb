"""A request as the engine sees it: token counters, not phases (vLLM V1's model).

`num_computed` tokens have KV in the cache; `num_output` tokens have been sampled. A request
needs `known - num_computed` more tokens computed, where known = prompt + output so far: the
whole prompt (in chunks) at first, then one token per decode step; after a preemption by
recompute, everything known again (after a swap-out the KV comes back instead). It
finishes when it has sampled `output_len` tokens.

What its tokens are, for prefix caching, is described by `prefix_id`/`prefix_len` and
`stream` (serving/sharing.py): `prefix_len` tokens of shared prefix `prefix_id`, then the start
of token stream `stream` (a conversation, or the request's own), which its output continues.
"""

from __future__ import annotations

import math

# What a full KV block holds, as prefix caching tells blocks apart (see kv_cache.py).
BlockKey = tuple[int, int, int, int]


# Every field of a request (`__slots__`, and what `copy.copy` copies).
FIELDS = (
    "adapter",
    "arrival_s",
    "blocks",
    "cache_keys",
    "cached_tokens",
    "finish_s",
    "first_scheduled_s",
    "first_token_s",
    "id",
    "last_token_s",
    "num_computed",
    "num_output",
    "output_len",
    "preemptions",
    "prefix_id",
    "prefix_len",
    "priority",
    "prompt_len",
    "replica",
    "return_s",
    "stream",
    "swapped_blocks",
)


class Request:
    __slots__ = FIELDS

    def __init__(
        self,
        *,
        id: int,
        arrival_s: float,
        prompt_len: int,
        output_len: int,
        priority: int = 0,
        prefix_id: int = -1,
        prefix_len: int = 0,
        session_id: int = -1,
        adapter: int = -1,
    ) -> None:
        self.id = id
        self.adapter = adapter  # LoRA adapter id (-1: the base model alone)
        self.prefix_id = prefix_id  # shared prefix (-1: none) of prefix_len tokens
        self.prefix_len = prefix_len
        self.stream = session_id if session_id >= 0 else -2 - id  # -2 - id: its own
        self.cached_tokens = 0  # prompt tokens found in the prefix cache when first admitted
        self.cache_keys: list[BlockKey | None] = []  # prefix caching's view of its blocks
        self.priority = priority  # lower is served first (vLLM's --scheduling-policy priority)
        self.swapped_blocks = 0  # KV blocks held in host memory after a swap-out
        self.arrival_s = arrival_s
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.num_computed = 0
        self.num_output = 0
        self.blocks = 0
        self.preemptions = 0
        self.replica = -1
        self.return_s = 0.0  # a sampled token's way from the engine to the client (front-end)
        self.first_scheduled_s = math.nan
        self.first_token_s = math.nan
        self.finish_s = math.nan
        self.last_token_s = math.nan

    def __copy__(self) -> Request:
        """A shallow copy, every field (a compiled build's class cannot be made without its
        constructor's arguments, which `copy.copy`'s default way needs)."""
        clone = Request(
            id=self.id,
            arrival_s=self.arrival_s,
            prompt_len=self.prompt_len,
            output_len=self.output_len,
        )
        for name in FIELDS:
            setattr(clone, name, getattr(self, name))
        return clone

    @property
    def known(self) -> int:
        """Tokens whose identity is known: the prompt plus what has been sampled."""
        return self.prompt_len + self.num_output

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next sample."""
        return self.known - self.num_computed

    @property
    def is_decoding(self) -> bool:
        return self.num_output > 0 and self.remaining == 1

    @property
    def finished(self) -> bool:
        return self.num_output >= self.output_len

    def __repr__(self) -> str:
        return (
            f"Request({self.id}, prompt={self.prompt_len}, out={self.num_output}/"
            f"{self.output_len}, computed={self.num_computed})"
        )
