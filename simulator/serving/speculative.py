"""Speculative decoding: the config, and how much of what is proposed gets accepted.

vLLM's `--speculative-config` JSON, with the acceptance added (the simulator cannot read it off
the data). Each engine step, every decoding sequence verifies its last sampled token plus k
proposals in the target's batch (a chunk of k + 1 query tokens at its context, logits at every
position; `steptime.verify_shape`), with KV slots for all k + 1 (vLLM's lookahead slots;
`scheduler`). Of the proposals, position i is accepted with probability rates[i] if position
i - 1 was, drawn per request per step (`Acceptance`, from a generator seeded by the scenario's
seed); the step yields the accepted ones plus one token sampled by the target (the bonus or the
correction), capped at what the request still needs. The rejected tokens' KV is dropped; their
slots stay allocated and are written next step. What proposing costs: `drafter`.

Not modelled: tree attention and several candidates per position (Medusa/EAGLE trees), typical
acceptance, acceptance that depends on the data or on the position in the output (the rates are
given and the same for every request and step), dynamic speculation (vLLM's turning it off at
large batches).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Acceptance:
    """How many proposals each verification accepts: the count of leading positions that pass
    their rate, drawn in blocks from `rng` (one generator per replica, so runs repeat)."""

    BLOCK = 4096

    def __init__(self, *, rates: Sequence[float], rng: np.random.Generator) -> None:
        self._rates = np.asarray(rates, dtype=float)
        self._rng = rng
        self._drawn: list[int] = []
        self._next = 0

    def accept(self, proposals: int) -> int:
        """Accepted tokens among the first `proposals` proposals of one verification."""
        if self._next == len(self._drawn):
            passed = self._rng.random((self.BLOCK, len(self._rates))) < self._rates
            self._drawn = passed.cumprod(axis=1).sum(axis=1).tolist()
            self._next = 0
        accepted = self._drawn[self._next]
        self._next += 1
        return min(accepted, proposals)
