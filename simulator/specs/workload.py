"""The workload as a scenario states it: a dataset for the lengths, an arrival process, sharing
for prefix caching, and how requests sample. Pure data; `simulator.workload` draws the requests
(its module docs give the datasets' sources and the arrival processes)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from simulator.specs._base import MAX_REQUESTS, MAX_TIME_SCALE, MAX_TOKENS, Frozen
from simulator.specs.lora import AdapterMix

# vLLM's ShareGPT filter: is_valid_sequence() defaults in vllm/benchmarks/dataset_utils.py, applied
# by ShareGPTDataset.sample (inherited from sample_sharegpt_requests in benchmark_serving.py).
SHAREGPT_MIN_LEN = 4


SHAREGPT_MAX_PROMPT_LEN = 1024


SHAREGPT_MAX_TOTAL_LEN = 2048

# Which measured stop profile (simulator/workload/eos_stop.yaml) shortens the outputs of a
# dataset with reference answers when EOS is honoured: instruction-tuned or base checkpoints.
EosModel = Literal["instruct", "base"]


class RandomDataset(Frozen):
    """vLLM's `--dataset-name random` (defaults are vLLM's)."""

    name: Literal["random"] = "random"
    input_len: int = Field(1024, ge=1, le=MAX_TOKENS)
    output_len: int = Field(128, ge=1, le=MAX_TOKENS)
    range_ratio: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _nonempty_prompt(self) -> RandomDataset:
        # vLLM raises "--random-input-len is too small" in the same case.
        if math.floor(self.input_len * (1.0 - self.range_ratio)) < 1:
            raise ValueError(
                f"input_len {self.input_len} with range_ratio {self.range_ratio} allows empty "
                "prompts; increase input_len or decrease range_ratio"
            )
        return self


class ShareGPTDataset(Frozen):
    """ShareGPT's lengths: drawn from the fitted length model (see the module docstring), or,
    with `path`, read from the ShareGPT JSON as vLLM samples it (`sharegpt_file.py`)."""

    name: Literal["sharegpt"] = "sharegpt"
    # vLLM's --sharegpt-output-len; at most 2044 so that a 4-token prompt still fits the filter
    output_len: int | None = Field(None, ge=1, le=SHAREGPT_MAX_TOTAL_LEN - SHAREGPT_MIN_LEN)
    path: Path | None = Field(
        None, description="vLLM's --dataset-path: a ShareGPT JSON file; None: the length model"
    )
    tokenizer: str | None = Field(
        None,
        description="vLLM's --tokenizer, with path: a local tokenizer.json (or a folder holding "
        "one) to count tokens; None: estimated from the text's bytes",
    )
    seed: int = Field(0, ge=0, description="vLLM's --seed, which shuffles the file")

    @model_validator(mode="after")
    def _file_options(self) -> ShareGPTDataset:
        if self.tokenizer is not None and self.path is None:
            raise ValueError("tokenizer counts the tokens of a file: give path too")
        return self


class AzureCodeDataset(Frozen):
    name: Literal["azure-code"] = "azure-code"


class AzureConvDataset(Frozen):
    name: Literal["azure-conv"] = "azure-conv"


_SUFFIX_FORMATS: dict[str, Literal["csv", "jsonl"]] = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}


class TraceDataset(Frozen):
    """A user trace: one request per row. Column defaults are the Azure traces' names. The
    timestamp column holds seconds (numbers) or datetime strings; None means there is none.
    The sharing columns (see the module doc) are optional."""

    name: Literal["trace"] = "trace"
    path: Path
    timestamp_column: str | None = "TIMESTAMP"
    prompt_column: str = "ContextTokens"
    output_column: str = "GeneratedTokens"
    session_column: str | None = None
    prefix_column: str | None = None
    prefix_len_column: str | None = None
    format: Literal["csv", "jsonl"] | None = None  # None: from the suffix

    @model_validator(mode="after")
    def _known_format(self) -> TraceDataset:
        if self.format is None and self.path.suffix.lower() not in _SUFFIX_FORMATS:
            raise ValueError(
                f"cannot tell the format of {self.path.name!r} from its suffix: name it "
                f"{', '.join(_SUFFIX_FORMATS)}, or set the dataset's format (csv or jsonl)"
            )
        if (self.prefix_column is None) != (self.prefix_len_column is None):
            raise ValueError("prefix_column and prefix_len_column go together")
        return self

    @property
    def file_format(self) -> Literal["csv", "jsonl"]:
        return self.format or _SUFFIX_FORMATS[self.path.suffix.lower()]


class SharedPrefix(Frozen):
    """A system prompt of `tokens` tokens put before the prompts of a `share` of the requests
    (of the conversations, with sessions), each carrying one of `count` distinct prompts drawn
    uniformly. vLLM's `--random-prefix-len` is `tokens` with share 1 and count 1."""

    tokens: int = Field(ge=1)
    share: float = Field(1.0, ge=0, le=1)
    count: int = Field(1, ge=1)


class Sessions(Frozen):
    """Multi-turn conversations of `turns` requests each (the last one may have fewer). The
    dataset's lengths become each turn's new user message and reply; the first turns arrive
    by the workload's arrival process (request_rate counts conversations per second), turn k+1
    is sent `think_time_s` after turn k finished (a constant, or exponential with that mean)."""

    turns: int = Field(ge=1, le=MAX_REQUESTS)
    think_time_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    think_time: Literal["constant", "exponential"] = "constant"


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
    num_prompts: int | None = Field(None, ge=1, le=MAX_REQUESTS)  # None: every row of a trace
    request_rate: float = Field(math.inf, gt=0)  # requests/s; inf: all at t=0
    burstiness: float = Field(1.0, gt=0)  # gamma shape; 1 = Poisson, inf = constant
    arrival: Literal["poisson_gamma", "constant", "trace"] = "poisson_gamma"
    time_scale: float = Field(1.0, gt=0, le=MAX_TIME_SCALE)  # trace replay: x inter-arrivals
    max_input_len: int | None = Field(None, ge=1, le=MAX_TOKENS)  # clamp prompt lengths
    max_output_len: int | None = Field(None, ge=1, le=MAX_TOKENS)  # clamp output lengths
    # share of requests in priority class 0, 1, ... (0 most urgent; for the priority policy)
    priority_mix: list[float] | None = Field(None, min_length=1)
    prefix: SharedPrefix | None = None  # a shared system prompt
    sessions: Sessions | None = None  # multi-turn conversations
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)  # greedy unless set
    ramp_up: RampUp | None = None  # the rate grows over the run (instead of request_rate)
    # multi-LoRA: each request names an adapter drawn from this mix (specs/lora.py)
    adapters: AdapterMix | None = None
    # vLLM's --ignore-eos. True: every request generates its dataset's output length. False:
    # a dataset with reference answers (sharegpt) stops where the model emits EOS
    # (simulator/workload/eos.py). None: as `vllm bench serve` does, True for random, False
    # otherwise. Trace datasets hold generated lengths: neither shortens them.
    ignore_eos: bool | None = None
    eos_model: EosModel = "instruct"  # the stop profile when EOS is honoured

    @property
    def stops_at_eos(self) -> bool:
        """Whether outputs are shortened where the model emits EOS (see ignore_eos)."""
        return self.dataset.name == "sharegpt" and not self.ignore_eos

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
        if name == "random" and self.ignore_eos is False:
            raise ValueError(  # vLLM sets ignore_eos for its random dataset whatever is asked
                "ignore_eos false needs a dataset with reference answers (sharegpt); random "
                "prompts have none, and `vllm bench serve` ignores EOS with them"
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


def sharegpt_filter(prompt: np.ndarray, output: np.ndarray, *, check_output: bool) -> np.ndarray:
    """Which (prompt, output) token counts vLLM's is_valid_sequence keeps: prompt 4-1024, output
    at least 4 unless `check_output` is off (vLLM skips it when the output length is set), the
    two at most 2048."""
    ok = (prompt >= SHAREGPT_MIN_LEN) & (prompt <= SHAREGPT_MAX_PROMPT_LEN)
    ok &= prompt + output <= SHAREGPT_MAX_TOTAL_LEN
    return ok & (output >= SHAREGPT_MIN_LEN) if check_output else ok
