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

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from simulator.errors import SpecError
from simulator.specs._base import Frozen
from simulator.specs.loader import validate

Method = Literal["ngram", "eagle", "eagle3", "draft_model", "mtp", "deepseek_mtp", "medusa"]
FIELD = "speculative_config"
Rate = Annotated[float, Field(ge=0, le=1)]


class SpeculativeSpec(Frozen):
    """vLLM's speculative config plus the acceptance: `acceptance_rate` (every position, each
    conditional on the previous one being accepted) or `acceptance_rates` (one per position)."""

    method: Method
    num_speculative_tokens: int = Field(ge=1)
    model: str | None = Field(default=None, description="draft model (draft_model)")
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    acceptance_rate: Rate | None = None
    acceptance_rates: tuple[Rate, ...] | None = None

    @model_validator(mode="before")
    @classmethod
    def _infer_method(cls, data: Any) -> Any:
        """As vLLM: without a method, a model "ngram" means ngram, any other a draft model."""
        if isinstance(data, dict) and data.get("method") is None and data.get("model"):
            ngram = data["model"] in ("ngram", "[ngram]")
            data = {**data, "method": "ngram" if ngram else "draft_model"}
            if ngram:
                data.pop("model")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeSpec:
        k = self.num_speculative_tokens
        if (self.acceptance_rate is None) == (self.acceptance_rates is None):
            raise ValueError(
                "give acceptance_rate (per position, given the previous accepted) or "
                "acceptance_rates (one per position), not both: it depends on the data"
            )
        if self.acceptance_rates is not None and len(self.acceptance_rates) != k:
            raise ValueError(
                f"acceptance_rates has {len(self.acceptance_rates)} values for "
                f"num_speculative_tokens {k}"
            )
        if self.kind == "draft_model" and not self.model:
            raise ValueError("method draft_model needs model (the draft model's id or config)")
        if self.kind != "ngram" and (self.prompt_lookup_min or self.prompt_lookup_max):
            raise ValueError("prompt_lookup_min/max apply to method ngram only")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"prompt_lookup_min {lo} exceeds prompt_lookup_max {hi}")
        if self.kind in ("ngram", "medusa") and self.draft_tensor_parallel_size is not None:
            raise ValueError(f"method {self.method} has no draft model to parallelise")
        return self

    @property
    def kind(self) -> Literal["ngram", "eagle", "eagle3", "draft_model", "mtp", "medusa"]:
        return "mtp" if self.method == "deepseek_mtp" else self.method

    @property
    def rates(self) -> tuple[float, ...]:
        """P(position i accepted | position i - 1 accepted), one per proposal."""
        if self.acceptance_rates is not None:
            return self.acceptance_rates
        return (self.acceptance_rate or 0.0,) * self.num_speculative_tokens

    @property
    def expected_tokens(self) -> float:
        """Tokens a verification yields on average: 1 + sum over i of prod(rates[:i + 1])."""
        return 1.0 + float(np.cumprod(self.rates).sum())


def parse_speculative_config(
    value: SpeculativeSpec | Mapping[str, Any] | str | None, *, source: str = FIELD
) -> SpeculativeSpec | None:
    """A SpeculativeSpec from vLLM's JSON text, a mapping or a spec (None stays None)."""
    if value is None or isinstance(value, SpeculativeSpec):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SpecError(f"not valid JSON ({exc.msg})", source=source, field=FIELD) from None
    return validate(
        SpeculativeSpec, dict(value) if isinstance(value, Mapping) else value, source=source
    )


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
