"""The workload: which requests arrive when, with how many prompt and output tokens.

`generate_requests(spec, rng=...)` turns a `WorkloadSpec` into a `RequestTable` (struct of arrays,
sorted by arrival). Pure and deterministic given the numpy Generator; nothing is simulated here.
The fields mirror `vllm bench serve` (vllm/benchmarks/serve.py and datasets.py):

- `random`, `sharegpt`, `azure-code`, `azure-conv`: built-in datasets, described (with the
  sources of the ShareGPT lengths) in `datasets.py`.
- `trace`: a user CSV or JSONL file with configurable column names (`traces.py`), optionally
  with session and shared-prefix columns.

Sharing, for prefix caching (`sharing.py`): `prefix` puts a shared system prompt before the
prompts (vLLM's --random-prefix-len); `sessions` groups requests into multi-turn conversations
whose turn k+1 is sent after turn k finished and resends the conversation so far.

Arrivals: `poisson_gamma` is vLLM's generator: gamma inter-arrival times (shape=burstiness,
scale=1/(rate*burstiness); burstiness 1 = Poisson), summed and then rescaled so that the last
request arrives at num_prompts/rate, as vLLM's get_request does; rate=inf puts every request at
t=0. `constant` spaces requests 1/rate apart (vLLM's burstiness=inf). `trace` replays the
dataset's timestamps, shifted to start at 0 and multiplied by `time_scale`. `ramp_up`
(vLLM's --ramp-up-strategy) gives request i of n the rate start + (end - start) x i / (n - 1)
(linear) or start x (end / start) ** (i / (n - 1)) (exponential) for the gap before it, drawn
as above, without the rescaling (vLLM skips it under a ramp-up).

Output lengths: a dataset with reference answers (sharegpt) gives each request its answer's
length; unless the workload ignores EOS (vLLM's --ignore-eos, `ignore_eos`), the request stops
earlier where the model emits EOS (`eos.py`, drawn from a generator spawned from `rng`, so that
the other draws are the same either way).

For the datasets' own limits see `datasets.py`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from typing_extensions import assert_never

from simulator.errors import SpecError
from simulator.specs.lora import AdapterMix
from simulator.specs.workload import (
    AzureCodeDataset,
    AzureConvDataset,
    RandomDataset,
    ShareGPTDataset,
    TraceDataset,
    WorkloadSpec,
)
from simulator.workload.datasets import random_lengths, sharegpt_lengths
from simulator.workload.eos import eos_stopped, stop_profile
from simulator.workload.sharing import (
    Content,
    add_prefix,
    conversation_starts,
    session_turns,
    think_times,
)
from simulator.workload.traces import Trace, bundled_trace, read_trace, replay_rows, take_rows


# -- the result ---------------------------------------------------------------------------------
def _none() -> np.ndarray:
    return np.empty(0)


# (name, dtype, value when not given) of the optional columns; defaults take no memory
_OPTIONAL = (
    ("priority", np.int64, 0),  # class, lower first
    ("session_id", np.int64, -1),  # conversation (-1: none); see sharing.py
    ("prefix_id", np.int64, -1),  # shared prefix (-1: none)
    ("prefix_len", np.int64, 0),  # tokens of it at the start of the prompt
    ("follows", np.int64, -1),  # row sent after this one finishes (-1: sent at arrival_s)
    ("think_s", np.float64, 0.0),  # seconds after `follows` finished
    ("adapter", np.int64, -1),  # LoRA adapter id (-1: the base model); see draw_adapters
)


@dataclass(frozen=True, eq=False)
class RequestTable:
    """One row per request, sorted by arrival. Arrays are read-only. A follow-up turn of a
    conversation (`follows` >= 0, an earlier row, followed by nothing else) has its
    conversation's arrival_s and is sent `think_s` after that row finished."""

    arrival_s: np.ndarray  # float64 seconds, >= 0
    prompt_len: np.ndarray  # int64 tokens, >= 1
    output_len: np.ndarray  # int64 tokens, >= 1
    priority: np.ndarray = dataclasses.field(default_factory=_none)
    session_id: np.ndarray = dataclasses.field(default_factory=_none)
    prefix_id: np.ndarray = dataclasses.field(default_factory=_none)
    prefix_len: np.ndarray = dataclasses.field(default_factory=_none)
    follows: np.ndarray = dataclasses.field(default_factory=_none)
    think_s: np.ndarray = dataclasses.field(default_factory=_none)
    adapter: np.ndarray = dataclasses.field(default_factory=_none)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name, dtype, default in (
            ("arrival_s", np.float64, None),
            ("prompt_len", np.int64, None),
            ("output_len", np.int64, None),
            *_OPTIONAL,
        ):
            given = getattr(self, name)
            if default is not None and not len(given):  # not given: one value, no memory
                arr = np.broadcast_to(np.asarray(default, dtype=dtype), (n,))
            elif isinstance(given, np.ndarray) and given.strides == (0,) and given.dtype == dtype:
                arr = given
            else:
                try:
                    arr = np.ascontiguousarray(given, dtype=dtype)
                except (TypeError, ValueError) as exc:  # text, NaN into integers, ragged
                    raise SpecError(f"not {dtype.__name__} values ({exc})", field=name) from None
            if arr.ndim != 1 or len(arr) != n:
                raise SpecError("must be 1-D with one entry per request", field=name)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        arrivals = self.arrival_s
        if n and not (
            np.isfinite(arrivals[-1]) and arrivals[0] >= 0 and np.all(arrivals[1:] >= arrivals[:-1])
        ):
            raise SpecError("must be finite, non-negative and ascending", field="arrival_s")
        if n and (self.prompt_len.min() < 1 or self.output_len.min() < 1):
            raise SpecError("must be >= 1", field="prompt_len / output_len")
        if n:
            Content(
                self.session_id, self.prefix_id, self.prefix_len, self.follows, self.think_s
            ).check(self.prompt_len)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def shares_content(self) -> bool:
        """Whether any prompt shares a prefix or any request waits for another."""
        return bool(np.any(self.prefix_id >= 0) or np.any(self.session_id >= 0) or self.has_turns)

    @property
    def has_turns(self) -> bool:
        """Whether some requests are follow-up turns sent after another finishes."""
        return bool(np.any(self.follows >= 0))

    def to_frame(self) -> pd.DataFrame:
        columns = ("arrival_s", "prompt_len", "output_len", *(o[0] for o in _OPTIONAL))
        return pd.DataFrame({name: getattr(self, name) for name in columns})


def generate_requests(spec: WorkloadSpec, *, rng: np.random.Generator) -> RequestTable:
    """The requests `spec` describes. Lengths are drawn before arrivals, from the same `rng`
    (where outputs stop at EOS, from a generator spawned from it); then priorities, shared
    prefixes and think times (each only when asked for, so adding one leaves the earlier draws
    alone).

    A trace dataset without arrival 'trace' gives the lengths of its first num_prompts rows in
    file order (a contiguous slice of real traffic); when num_prompts exceeds the rows, the extra
    requests are drawn uniformly with replacement from the trace, as vLLM oversamples. Raises
    SpecError for problems found in a trace file.
    """
    timestamps, trace = _dataset_rows(spec, rng)
    prompt, output = trace.prompt_len, trace.output_len
    if spec.stops_at_eos:  # a stream of its own: the draws after it are those of ignore_eos
        hazard = stop_profile(spec.eos_model).hazard
        output = eos_stopped(output, hazard=hazard, rng=rng.spawn(1)[0])
    if spec.max_output_len is not None:  # before sessions: replies become later prompts
        output = np.minimum(output, spec.max_output_len)
    content = _trace_content(trace)
    if spec.sessions is not None:
        prompt, content = session_turns(prompt, output, spec.sessions)
    arrival = timestamps if timestamps is not None else _conversation_arrivals(spec, content, rng)
    priority: np.ndarray = np.empty(0)
    if spec.priority_mix is not None:
        priority = rng.choice(len(spec.priority_mix), size=len(prompt), p=spec.priority_mix)
    if spec.prefix is not None:
        prompt, content = add_prefix(prompt, content, spec.prefix, rng)
    if spec.sessions is not None:
        content = think_times(content, spec.sessions, rng)
    if spec.max_input_len is not None:
        prompt = np.minimum(prompt, spec.max_input_len)
    table = RequestTable(arrival_s=arrival, prompt_len=prompt, output_len=output, priority=priority)
    if spec.adapters is not None:  # drawn last: the other draws are those without adapters
        table = dataclasses.replace(table, adapter=draw_adapters(spec.adapters, len(prompt), rng))
    if not spec.shares_content:
        return table
    return dataclasses.replace(
        table,
        session_id=content.session_id,
        prefix_id=content.prefix_id,
        prefix_len=np.minimum(content.prefix_len, prompt),
        follows=content.follows,
        think_s=content.think_s,
    )


def draw_adapters(mix: AdapterMix, n: int, rng: np.random.Generator) -> np.ndarray:
    """The adapter id (0 .. num_adapters - 1) of each of `n` requests: uniform, or Zipf with
    adapter i weighted 1 / (i + 1) ** alpha (S-LoRA's power law, Punica's "Skewed" mix)."""
    k = mix.num_adapters
    if mix.distribution == "uniform":
        return rng.integers(0, k, size=n)
    weights = 1.0 / np.arange(1, k + 1, dtype=float) ** mix.alpha
    return rng.choice(k, size=n, p=weights / weights.sum())


def _dataset_rows(spec: WorkloadSpec, rng: np.random.Generator) -> tuple[np.ndarray | None, Trace]:
    """(timestamps to replay or None, the rows' lengths and sharing columns)."""
    ds = spec.dataset
    match ds:
        case RandomDataset():
            return None, Trace(None, *random_lengths(ds, n=_required(spec.num_prompts), rng=rng))
        case ShareGPTDataset():
            return None, Trace(None, *sharegpt_lengths(ds, n=_required(spec.num_prompts), rng=rng))
        case AzureCodeDataset() | AzureConvDataset():
            trace = bundled_trace(ds.name)
        case TraceDataset():
            trace = read_trace(ds, with_timestamps=spec.arrival == "trace")
        case _:
            assert_never(ds)
    if spec.arrival == "trace":
        return replay_rows(trace, num_prompts=spec.num_prompts, time_scale=spec.time_scale)
    return None, trace.rows(take_rows(len(trace), spec.num_prompts, rng))


def _trace_content(trace: Trace) -> Content:
    content = Content.unshared(len(trace), session_id=trace.session_id)
    if trace.prefix_id is None or trace.prefix_len is None:
        return content
    return dataclasses.replace(content, prefix_id=trace.prefix_id, prefix_len=trace.prefix_len)


def _conversation_arrivals(
    spec: WorkloadSpec, content: Content, rng: np.random.Generator
) -> np.ndarray:
    """Generated arrivals: one per request, or with sessions one per conversation, which its
    follow-up turns share (they are sent when the turn before finishes)."""
    if spec.sessions is None:
        return _arrivals(spec, len(content.follows), rng)
    starts = conversation_starts(content)
    turns = np.diff(np.append(starts, len(content.follows)))
    return np.repeat(_arrivals(spec, len(starts), rng), turns)


def _required(num_prompts: int | None) -> int:
    assert num_prompts is not None  # WorkloadSpec guarantees it for synthetic datasets
    return num_prompts


# -- arrivals -----------------------------------------------------------------------------------
def _arrivals(spec: WorkloadSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    # vLLM get_request (vllm/benchmarks/serve.py): delay_i ~ Gamma(burstiness, 1/(rate*burstiness)),
    # constant 1/rate when burstiness is inf, 0 when rate is inf; cumulative; then rescaled so
    # the last delay is exactly n/rate ("to close the 1-2% gap ... for stabilizing throughput").
    # With a ramp-up, each gap has its request's rate and nothing is rescaled.
    rate: float | np.ndarray = spec.request_rate
    if spec.ramp_up is not None:
        rate = spec.ramp_up.rates(n)
    elif n == 0 or math.isinf(spec.request_rate):
        return np.zeros(n)
    if spec.arrival == "constant" or math.isinf(spec.burstiness):
        gaps = np.broadcast_to(1.0 / np.asarray(rate), (n,))
    else:
        gaps = rng.gamma(shape=spec.burstiness, scale=1.0 / (rate * spec.burstiness), size=n)
    arrival = np.cumsum(gaps)
    if spec.ramp_up is None and arrival[-1] > 0:
        arrival *= (n / spec.request_rate) / arrival[-1]
    return arrival
