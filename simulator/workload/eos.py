"""Output lengths that stop at end-of-sequence: what a served model generates when the client
does not send ignore_eos.

A dataset with reference answers (ShareGPT) gives each request the length of its answer, which
the client sends as max_tokens. With ignore_eos the engine generates exactly that many tokens;
without it the model may emit EOS first. Here each generated token is EOS with a fixed chance
(the hazard), so the model's own answer length G is geometric, and the request generates
min(reference, G) tokens: E[min(R, G)] = (1 - (1 - h)^R) / h for a reference of R tokens.

The hazards, and the published runs they come from, are in eos_stop.yaml: one for
instruction-tuned checkpoints (the default; about 0.6% fewer tokens than the references hold on
ShareGPT) and one for pretrained (base) checkpoints (35% fewer).

Who sends ignore_eos (`WorkloadSpec.ignore_eos`, None: as the benchmark client does):
`vllm bench serve` sets it for its random datasets (vllm/benchmarks/serve.py: "when using
random datasets, default to ignoring EOS so generation runs to the requested length") and
otherwise only with --ignore-eos; `vllm bench throughput` and `latency` always
(SamplingParams(..., ignore_eos=True)); `sglang.bench_serving` unless --disable-ignore-eos.
Trace datasets hold the lengths that were generated, so nothing is shortened there.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
from pydantic import Field

from simulator.specs._base import Frozen
from simulator.specs.loader import read_yaml, validate
from simulator.specs.workload import EosModel

FACTORS_FILE = Path(__file__).with_name("eos_stop.yaml")


class StopProfile(Frozen):
    """One measured stop profile of eos_stop.yaml."""

    kept_fraction: float = Field(gt=0, le=1)  # generated / reference tokens, measured
    hazard: float = Field(ge=0, lt=1)  # per-token EOS chance fitted to it


class StopProfiles(Frozen):
    instruct: StopProfile
    base: StopProfile


@cache
def stop_profiles() -> StopProfiles:
    return validate(StopProfiles, read_yaml(FACTORS_FILE), source=str(FACTORS_FILE))


def stop_profile(model: EosModel) -> StopProfile:
    profile: StopProfile = getattr(stop_profiles(), model)
    return profile


def eos_stopped(reference: np.ndarray, *, hazard: float, rng: np.random.Generator) -> np.ndarray:
    """Each request's generated length: min(its reference length, a geometric draw with
    `hazard`), int64, at least 1."""
    if hazard <= 0 or not len(reference):
        return np.asarray(reference, dtype=np.int64)
    natural = rng.geometric(hazard, size=len(reference))
    return np.minimum(np.asarray(reference, dtype=np.int64), natural).astype(np.int64)


def expected_kept_fraction(reference: np.ndarray, hazard: float) -> float:
    """E[min(R, G)] / E[R] over the references R, G geometric with `hazard`."""
    ref = np.asarray(reference, dtype=float)
    if hazard <= 0:
        return 1.0
    return float(np.mean(-np.expm1(ref * np.log1p(-hazard)) / hazard) / ref.mean())


def fit_hazard(reference: np.ndarray, kept_fraction: float) -> float:
    """The hazard with which the references keep `kept_fraction` of their tokens on average
    (4 significant digits)."""
    from scipy import optimize

    if kept_fraction >= 1:
        return 0.0
    hazard = optimize.brentq(
        lambda h: expected_kept_fraction(reference, h) - kept_fraction, 1e-12, 0.999
    )
    return float(f"{hazard:.4g}")
