"""Shared pieces of the spec models: frozen strict base, unit-parsing field types, curves."""

from __future__ import annotations

import math
from functools import cached_property
from itertools import pairwise
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, field_validator, model_validator

from simulator.units import parse_quantity

# Upper bounds of values with a physical meaning. Each is far beyond any real model, workload or
# deployment; they keep a slip (2**64 prompts, 1e308 GiB of swap, 10**9 layers) from overflowing
# numpy's integers or running until memory is gone, and refuse it with a line naming the field.
MAX_TOKENS = 10**9  # one request's prompt or output, a step's tokens: 100x the longest context
MAX_REQUESTS = 10**12  # requests of a workload or a batch (memory refuses far fewer: runs.sizes)
MAX_GPUS = 2**20  # GPUs in one parallel dimension, replicas of a group
MAX_HOST_GIB = 2**20  # GiB of host memory per GPU (swap, offloaded weights): a PiB
MAX_LAYERS = 10_000  # layers of a model (the largest have ~200)
MAX_DIM = 2**24  # a model dimension: hidden, heads, vocabulary, MLP width (16M)
MAX_TIME_SCALE = 1e6  # a trace replay's stretch of its inter-arrival times
# A plan's target rate, requests/s: a million, far above any service's (a fleet for more is
# millions of replicas, each simulated)
MAX_PLAN_RATE = 1e6


class Frozen(BaseModel):
    """Frozen, strict spec data: unknown keys are errors, nothing mutates after loading, and
    no field takes NaN (YAML's `.nan`, a flag's `nan`), which every bound check would let pass
    or reject with a message about the bound."""

    # defer_build: a model's validator is built when first used, so a command pays only for the
    # specs it reads (start-up time)
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _no_nan(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if isinstance(value, float) and math.isnan(value):
                    raise ValueError(f"{key}: must be a number, not NaN")
        return data


def _quantity(dimension: str) -> BeforeValidator:
    return BeforeValidator(lambda v: parse_quantity(v, dimension=dimension))


Bytes = Annotated[float, _quantity("bytes")]
BytesPerS = Annotated[float, _quantity("bytes_per_s")]
FlopsPerS = Annotated[float, _quantity("flops_per_s")]
Hertz = Annotated[float, _quantity("hz")]
Seconds = Annotated[float, _quantity("s")]
Watts = Annotated[float, _quantity("w")]


class Curve(Frozen):
    """A size-dependent factor: `points` [[x, y], ...] with x ascending, interpolated linearly
    in log(x) and clamped at both ends (Calculon-style efficiency tables)."""

    points: tuple[tuple[float, float], ...]

    @field_validator("points")
    @classmethod
    def _ascending(cls, pts: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        if not pts:
            raise ValueError("a curve needs at least one [x, y] point")
        xs = [x for x, _ in pts]
        if any(x <= 0 for x in xs) or any(b <= a for a, b in pairwise(xs)):
            raise ValueError("curve x values must be positive and strictly ascending")
        if any(y <= 0 for _, y in pts):
            raise ValueError("curve y values must be positive")
        return pts

    @cached_property
    def _log_xs(self) -> np.ndarray:
        return np.log([p[0] for p in self.points])

    @cached_property
    def _ys(self) -> np.ndarray:
        return np.array([p[1] for p in self.points])

    # Equal when the points are: pydantic's own comparison would also compare the cached
    # numpy arrays above (in __dict__ once used), whose truth value is ambiguous.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Curve):
            return NotImplemented
        return self.points == other.points

    def __hash__(self) -> int:
        return hash(self.points)

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        if len(self.points) == 1:
            return np.broadcast_to(self._ys[0], np.shape(x))
        log_x = np.log(np.maximum(np.asarray(x, dtype=float), 1e-30))
        return np.interp(log_x, self._log_xs, self._ys)


def flat(value: float) -> Curve:
    """A curve that is `value` everywhere."""
    return Curve(points=((1.0, value),))
