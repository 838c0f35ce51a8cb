"""Whether a simulated run meets the SLOs, and the search for the highest rate that does.

`judge` reads one run's request rows (and its inter-token-latency sample) the way `vllm bench
serve` would report them: TTFT and E2EL over completed requests, TPOT over those with more
than one output token, ITL over decode steps, numpy's linear percentiles; goodput as vLLM's
--goodput counts it (a request is good when it meets every per-request threshold; a single
token's TPOT counts as 0), as a share of all requests sent. A run also has to keep up: the
last quarter of arrivals may wait at most `max_queueing_ms` on average for their first step,
so that a queue that grows without bound fails even where no latency SLO would notice.

`search_max_rate` brackets and bisects on the request rate with any feasibility test; with
the same requests at every rate (only arrival times scaled) feasibility is monotone in
practice, and the result is the highest rate found feasible, never a guess between probes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from simulator.metrics.stats import percentile_word, weighted_percentile
from simulator.planning.spec import SLO_METRICS, PlanSLO

LATE_SHARE = 0.25  # the share of arrivals (the last ones) whose queueing delay is checked
DOWN_FACTOR = 2.0  # rate divisor while no feasible rate has been found


@dataclass(frozen=True)
class Verdict:
    """One run against the SLOs. `ratios` maps each SLO to measured / target (<= 1 is met;
    goodput: share of bad requests / share allowed); `latency_ms` holds, per metric, its
    percentile at the SLO's p (p99 where no SLO names it), keyed like `p99_ttft_ms`."""

    feasible: bool
    reason: str
    latency_ms: dict[str, float]
    ratios: dict[str, float]
    goodput_fraction: float | None
    late_queueing_ms: float

    @property
    def binding(self) -> tuple[str, float]:
        """The SLO closest to (or furthest past) its target, and its ratio."""
        if not self.ratios:
            return "", math.nan
        name = max(self.ratios, key=lambda k: self.ratios[k])
        return name, self.ratios[name]


def latency_key(metric: str, p: float) -> str:
    return f"p{percentile_word(p)}_{metric}_ms"


def _percentile_ms(values: np.ndarray, p: float) -> float:
    return float(np.percentile(values, p)) * 1000.0 if values.size else 0.0


def judge(
    requests: pd.DataFrame,
    *,
    itl_s: npt.ArrayLike,
    itl_weight: npt.ArrayLike,
    slo: PlanSLO,
    max_queueing_ms: float,
    scale: Mapping[str, float] | None = None,
    wait_scale: float = 1.0,
) -> Verdict:
    """`requests`: the simulator's rows (arrival_s, first_scheduled_s, first_token_s,
    finish_s, output_tokens; NaN times for unfinished requests). `scale`: what each metric's
    latencies are multiplied by before they are judged and reported (a plan's margin, the
    pessimistic edge of the error bands; absent metrics: 1); `wait_scale` the same for the
    queueing delay."""
    factor = dict(scale or {})
    done = requests.dropna(subset=["first_token_s", "finish_s"])
    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy(dtype=float)
    e2el = (done["finish_s"] - done["arrival_s"]).to_numpy(dtype=float)
    out = done["output_tokens"].to_numpy(dtype=float)
    multi = out > 1
    tpot_all = np.where(multi, (e2el - ttft) / np.maximum(out - 1, 1), 0.0)
    ttft, e2el = ttft * factor.get("ttft", 1.0), e2el * factor.get("e2el", 1.0)
    tpot_all = tpot_all * factor.get("tpot", 1.0)
    per_metric = {"ttft": ttft, "tpot": tpot_all[multi], "e2el": e2el}
    targets = slo.targets()
    latency: dict[str, float] = {}
    for metric in SLO_METRICS:
        p = targets[metric].p if metric in targets else 99.0
        if metric == "itl":
            w = np.asarray(itl_weight, dtype=float)
            value = float(weighted_percentile(itl_s, w, p)) * 1000.0 if float(w.sum()) > 0 else 0.0
            value *= factor.get("itl", 1.0)
        else:
            value = _percentile_ms(per_metric[metric], p)
        latency[latency_key(metric, p)] = value
    ratios = {m: latency[latency_key(m, t.p)] / t.max for m, t in targets.items()}

    goodput = None
    if slo.goodput is not None:
        per_request = {"ttft": ttft, "tpot": tpot_all, "e2el": e2el}
        good = np.ones(len(done), dtype=bool)
        for metric, limit in slo.thresholds_ms().items():
            good &= per_request[metric] * 1000.0 <= limit
        goodput = float(good.sum()) / max(len(requests), 1)
        allowed_bad = 1.0 - slo.goodput
        bad = 1.0 - goodput
        ratios["goodput"] = bad / allowed_bad if allowed_bad > 0 else (math.inf if bad else 0.0)

    late = requests.sort_values("arrival_s").tail(max(1, math.ceil(len(requests) * LATE_SHARE)))
    waits = (late["first_scheduled_s"] - late["arrival_s"]).to_numpy(dtype=float)
    late_ms = math.inf
    if np.isfinite(waits).any():
        late_ms = float(np.nanmean(waits)) * 1000.0 * wait_scale

    reason = ""
    if len(done) < len(requests):
        reason = f"{len(requests) - len(done)} requests did not finish"
    elif ratios and max(ratios.values()) > 1.0:
        name = max(ratios, key=lambda k: ratios[k])
        reason = _miss(name, slo, latency, goodput)
    elif late_ms > max_queueing_ms:
        reason = (
            f"does not keep up: the last arrivals wait {late_ms:.0f} ms for their first step "
            f"(at most {max_queueing_ms:g} ms)"
        )
    return Verdict(not reason, reason, latency, ratios, goodput, late_ms)


def _miss(name: str, slo: PlanSLO, latency: dict[str, float], goodput: float | None) -> str:
    if name == "goodput":
        return f"goodput {goodput:.1%} below the {slo.goodput:.0%} target"
    target = slo.targets()[name]
    value = latency[latency_key(name, target.p)]
    return f"p{target.p:g} {name.upper()} {value:.1f} ms > {target.max:g} ms"


@dataclass(frozen=True)
class SearchOutcome:
    """`max_rate`: the highest rate found feasible (0.0: none); `upper`: the lowest rate found
    infeasible, or the ceiling; `probes`: (rate, feasible) in the order tried; `converged`:
    the bracket closed within the tolerance."""

    max_rate: float
    upper: float
    probes: list[tuple[float, bool]]
    converged: bool


def search_max_rate(
    feasible: Callable[[float], bool],
    *,
    ceiling: float,
    start: float,
    tolerance: float,
    max_probes: int,
    min_rate: float,
) -> SearchOutcome:
    """Highest rate in (0, ceiling] at which `feasible` holds, to within `tolerance` (relative).

    The ceiling is a rate nothing can exceed, so it bounds the bracket from above untried.
    Starting at `start`, an infeasible rate is divided by DOWN_FACTOR until one is feasible
    (giving up below `min_rate`); then the bracket [feasible, infeasible-or-ceiling] is
    bisected geometrically until its ends are within `tolerance` or `max_probes` runs are spent.
    """
    if not (0 < start <= ceiling) or not math.isfinite(ceiling):
        raise ValueError(f"need 0 < start <= ceiling < inf, got {start} and {ceiling}")
    lo, hi = 0.0, ceiling
    rate = start
    probes: list[tuple[float, bool]] = []
    while len(probes) < max_probes:
        ok = feasible(rate)
        probes.append((rate, ok))
        if ok:
            lo = rate
        else:
            hi = rate
        if lo == 0.0:
            rate /= DOWN_FACTOR
            if rate < min_rate:
                break
            continue
        if hi <= lo * (1.0 + tolerance):
            break
        rate = math.sqrt(lo * hi)
    return SearchOutcome(lo, hi, probes, lo > 0.0 and hi <= lo * (1.0 + tolerance))
