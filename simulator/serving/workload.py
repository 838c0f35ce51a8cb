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

For the datasets' own limits see `datasets.py`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator
from typing_extensions import assert_never

from simulator.errors import SpecError
from simulator.serving.datasets import (
    AzureCodeDataset,
    AzureConvDataset,
    RandomDataset,
    ShareGPTDataset,
    random_lengths,
    sharegpt_lengths,
)
from simulator.serving.sharing import (
    Content,
    Sessions,
    SharedPrefix,
    add_prefix,
    conversation_starts,
    session_turns,
    think_times,
)
from simulator.serving.traces import (
    Trace,
    TraceDataset,
    bundled_trace,
    read_trace,
    replay_rows,
    take_rows,
)
from simulator.specs._base import Frozen

# -- the spec -----------------------------------------------------------------------------------
DatasetSpec = Annotated[
    RandomDataset | ShareGPTDataset | AzureCodeDataset | AzureConvDataset | TraceDataset,
    Field(discriminator="name"),
]


class SamplingSpec(Frozen):
    """How the requests sample (`vllm bench serve --temperature --top-p --top-k --min-p
    --repetition-penalty --frequency-penalty --presence-penalty --logprobs`): greedy at
    temperature 0, no penalties and no logprobs, the benchmark's default. A positive
    temperature makes the engine sample from each sequence's distribution every step
    (`samples_randomly`, its `random_sample`); with it, a top-p below 1 sorts each row
    (`sorts`, its `top_p`, a top-k or not) and a top-k above 0 alone takes a top-k of it
    (`top_k_only`, its `top_k`); a min-p above 0, another pass over them (`min_p_filters`,
    its `min_p`); any penalty, greedy or not, makes it count each sequence's tokens over the
    vocabulary every step (`penalises`, its `penalties`); logprobs, a log-softmax and a top-k
    over them (`returns_logprobs`, its `logprobs`)."""

    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, description="-1 or 0: off")
    min_p: float = Field(0.0, ge=0, le=1, description="0: off")
    repetition_penalty: float = Field(1.0, gt=0, description="1: off")
    frequency_penalty: float = Field(0.0, ge=-2, le=2, description="0: off")
    presence_penalty: float = Field(0.0, ge=-2, le=2, description="0: off")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=20,
        description="top logprobs returned per token (vLLM's server allows "
        "up to its --max-logprobs, 20 by default); None: none computed",
    )

    @property
    def samples_randomly(self) -> bool:
        return self.temperature > 0

    @property
    def sorts(self) -> bool:
        """A top-p (with or without a top-k) of a randomly sampled request: vLLM sorts."""
        return self.temperature > 0 and self.top_p < 1

    @property
    def top_k_only(self) -> bool:
        """A top-k without a top-p: vLLM's torch.topk, no sort."""
        return self.temperature > 0 and self.top_k > 0 and self.top_p == 1

    @property
    def min_p_filters(self) -> bool:
        """Min-p applies to randomly sampled requests (a positive temperature) only."""
        return self.temperature > 0 and self.min_p > 0

    @property
    def returns_logprobs(self) -> bool:
        return self.logprobs is not None

    @property
    def penalises(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


# How `vllm bench latency` and `vllm bench throughput` sample: temperature 1.0, top-p 1.0
# (vllm/benchmarks/latency.py and throughput.py, 0.11.1: SamplingParams(temperature=1.0,
# top_p=1.0, ignore_eos=True)), a draw over the whole vocabulary every step; `vllm bench serve`
# sends temperature 0 unless told (serve.py: "Default to greedy decoding").
OFFLINE_BENCH_SAMPLING = SamplingSpec(temperature=1.0)


class RampUp(Frozen):
    """vLLM's --ramp-up-strategy / --ramp-up-start-rps / --ramp-up-end-rps: the request rate
    grows from `start_rps` to `end_rps` over the benchmark's requests."""

    strategy: Literal["linear", "exponential"]
    start_rps: float = Field(gt=0, allow_inf_nan=False)  # vLLM asserts a positive first rate
    end_rps: float = Field(gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _rising(self) -> RampUp:
        if self.start_rps > self.end_rps:
            raise ValueError("Ramp-up start RPS must be less than end RPS")  # vLLM's words
        return self

    def rates(self, n: int) -> np.ndarray:
        """The rate (requests/s) of the gap before each of `n` requests."""
        progress = np.arange(n, dtype=float) / max(n - 1, 1)
        if self.strategy == "linear":
            return self.start_rps + (self.end_rps - self.start_rps) * progress
        return self.start_rps * (self.end_rps / self.start_rps) ** progress


class WorkloadSpec(Frozen):
    """What arrives: a dataset for the lengths and an arrival process (see the module doc)."""

    dataset: DatasetSpec
    num_prompts: int | None = Field(None, ge=1)  # None: every row of a trace
    request_rate: float = Field(math.inf, gt=0)  # requests/s; inf: all at t=0
    burstiness: float = Field(1.0, gt=0)  # gamma shape; 1 = Poisson, inf = constant
    arrival: Literal["poisson_gamma", "constant", "trace"] = "poisson_gamma"
    time_scale: float = Field(1.0, gt=0, allow_inf_nan=False)  # trace replay: x inter-arrivals
    max_input_len: int | None = Field(None, ge=1)  # clamp prompt lengths
    max_output_len: int | None = Field(None, ge=1)  # clamp output lengths
    # share of requests in priority class 0, 1, ... (0 most urgent; for the priority policy)
    priority_mix: list[float] | None = Field(None, min_length=1)
    prefix: SharedPrefix | None = None  # a shared system prompt
    sessions: Sessions | None = None  # multi-turn conversations
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)  # greedy unless set
    ramp_up: RampUp | None = None  # the rate grows over the run (instead of request_rate)

    @property
    def shares_content(self) -> bool:
        """Whether prompts share a prefix (what prefix caching can reuse), as specified."""
        ds = self.dataset
        in_trace = isinstance(ds, TraceDataset) and (ds.session_column or ds.prefix_column)
        return bool(self.prefix or self.sessions or in_trace)

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        name = self.dataset.name
        if self.num_prompts is None and name in ("random", "sharegpt"):
            raise ValueError(f"num_prompts is required for the synthetic dataset {name!r}")
        if self.arrival == "trace":
            has_timestamps = name in ("azure-code", "azure-conv") or (
                isinstance(self.dataset, TraceDataset) and self.dataset.timestamp_column
            )
            if not has_timestamps:
                raise ValueError(f"arrival 'trace' needs a dataset with timestamps, not {name!r}")
            if not math.isinf(self.request_rate) or self.burstiness != 1.0:
                raise ValueError(
                    "request_rate and burstiness do not apply to arrival 'trace' (the trace's "
                    "timestamps set the arrivals); use time_scale to replay faster or slower"
                )
        elif self.time_scale != 1.0:
            raise ValueError("time_scale applies only to arrival 'trace'")
        if self.arrival == "constant" and self.burstiness != 1.0:
            raise ValueError("burstiness does not apply to arrival 'constant'")
        if self.ramp_up is not None:
            if self.arrival == "trace":
                raise ValueError("ramp_up does not apply to arrival 'trace'")
            if not math.isinf(self.request_rate):
                raise ValueError(  # vLLM's words
                    "When using ramp-up, do not specify --request-rate. The request rate will "
                    "be controlled by ramp-up parameters."
                )
        mix = self.priority_mix
        if mix is not None and (min(mix) < 0 or not math.isclose(sum(mix), 1.0, abs_tol=1e-6)):
            raise ValueError("priority_mix must be non-negative shares that sum to 1")
        self._check_sharing()
        return self

    def _check_sharing(self) -> None:
        ds = self.dataset
        if self.sessions is not None:
            if self.arrival == "trace":
                raise ValueError(
                    "sessions send each turn after the previous one; not with arrival 'trace'"
                )
            if isinstance(ds, TraceDataset) and ds.session_column:
                raise ValueError(
                    "sessions and the trace's session_column are two sources of turns; pick one"
                )
        if self.prefix is not None and isinstance(ds, TraceDataset) and ds.prefix_column:
            raise ValueError(
                "prefix and the trace's prefix_column both set a shared prefix; pick one"
            )


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
    """The requests `spec` describes. Lengths are drawn before arrivals, from the same `rng`;
    then priorities, shared prefixes and think times (each only when asked for, so adding one
    leaves the earlier draws alone).

    A trace dataset without arrival 'trace' gives the lengths of its first num_prompts rows in
    file order (a contiguous slice of real traffic); when num_prompts exceeds the rows, the extra
    requests are drawn uniformly with replacement from the trace, as vLLM oversamples. Raises
    SpecError for problems found in a trace file.
    """
    timestamps, trace = _dataset_rows(spec, rng)
    prompt, output = trace.prompt_len, trace.output_len
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
