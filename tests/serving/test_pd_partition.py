"""Intra-GPU prefill/decode partitioning (Nexus, arXiv 2507.06608; `serving.pd_partition`,
`--pd-partition`, a replica group's `pd_partition`): the flag and the field run, bad splits
are one-line errors, a partition never gives a stream more than the GPU, a stream alone is
priced as today's replica, and on a prefill/decode-mixed load the dynamic split beats
colocated serving on tail TBT and offline throughput (the paper's direction). The phase
scheduling options: the prefill stream's queue in shortest-prompt-first order, and the
dynamic split's hysteresis (it falls only with margin, never misses a target it could meet,
and changes no more often)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.deployment import deployment
from simulator.errors import SpecError
from simulator.runs import runner
from simulator.serving.pd_partition import (
    DECODE_SHARES,
    PartitionTimers,
    _Split,
    bandwidth_shares,
    partition_hardware,
    saturation,
)
from simulator.serving.request import Request
from simulator.serving.steptime import StepTimer
from simulator.specs import load_hardware
from simulator.specs.engine_args import EngineArgs
from simulator.specs.loader import validate
from simulator.specs.scenario import RunOutputs, Scenario
from simulator.specs.serving import PdPartition, parse_pd_partition
from simulator.workload.requests import RequestTable
from tests.clitools import one_line_error, run_cli
from tests.factories import scenario_data

MIXED = {"input_len": 2048, "output_len": 256, "range_ratio": 0.5}


def _run(
    partition: str | None,
    *,
    num_prompts: int,
    request_rate: float | None = None,
    outputs: RunOutputs | None = None,
) -> dict:
    group: dict[str, object] = {"hardware": "h100_sxm"}
    if partition is not None:
        group["pd_partition"] = partition
    data = scenario_data(
        num_prompts=num_prompts, request_rate=request_rate, group=group, seed=0, **MIXED
    )
    return runner.run(validate(Scenario, data, source="t"), outputs=outputs).summary


def test_the_flag_parses_both_forms_and_refuses_the_rest() -> None:
    static = parse_pd_partition("static:0.6")
    assert (static.mode, static.prefill_share, static.text) == ("static", 0.6, "static:0.6")
    dynamic = parse_pd_partition("dynamic:50")
    assert (dynamic.mode, dynamic.tbt_target_s, dynamic.text) == ("dynamic", 0.05, "dynamic:50")
    bad_values = ["static:0", "static:1", "static:1.5", "static:-0.2", "static:x", "static"]
    bad_values += ["dynamic", "dynamic:0", "dynamic:-5", "dynamic:inf", "nexus", "0.6", ""]
    bad_values += [
        "static:0.5,hysteresis=0.2",
        "dynamic:50,hysteresis=1",
        "dynamic:50,hysteresis=-0.1",
    ]
    bad_values += ["dynamic:50,prefill=lifo", "dynamic:50,prefill=spf,prefill=fcfs", "dynamic:50,"]
    bad_values += ["dynamic:50,speed=2", "dynamic:50,hysteresis=x"]
    for bad in bad_values:
        with pytest.raises(SpecError) as exc:
            parse_pd_partition(bad)
        assert exc.value.field == "pd_partition"


def test_the_phase_options_parse_in_any_order_and_spell_back() -> None:
    both = parse_pd_partition("dynamic:40, hysteresis=0.25 ,prefill=spf")
    assert (both.prefill_order, both.hysteresis, both.tbt_target_s) == ("spf", 0.25, 0.04)
    assert both.text == "dynamic:40,prefill=spf,hysteresis=0.25"
    assert parse_pd_partition(both.text) == both
    static = parse_pd_partition("static:0.6,prefill=spf")
    assert (static.prefill_order, static.hysteresis, static.text) == (
        "spf",
        0.0,
        "static:0.6,prefill=spf",
    )
    # the defaults spell as before: the engine's queue order, no hysteresis
    assert parse_pd_partition("dynamic:50,prefill=fcfs,hysteresis=0").text == "dynamic:50"


@pytest.mark.parametrize("value", ["static:1.2", "static:0", "dynamic", "half"])
def test_a_bad_split_on_the_cli_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    err = one_line_error(
        capsys,
        *("bench", "throughput", "--model", "llama-3.1-8b", "--hardware", "h100_sxm"),
        *("--num-prompts", "4", "--pd-partition", value),
    )
    assert "--pd-partition" in err and value in err


def test_a_bad_split_in_a_scenario_names_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    data = scenario_data(input_len=64, output_len=8, num_prompts=2,
                         group={"hardware": "h100_sxm", "pd_partition": "static:2"})  # fmt: skip
    path.write_text(json.dumps(data))
    err = one_line_error(capsys, "run", str(path))
    assert "s.yaml" in err and "pd_partition" in err
    data["replicas"][0]["role"] = "prefill"
    data["replicas"][0]["pd_partition"] = "static:0.5"
    data["replicas"].append({"hardware": "h100_sxm", "role": "decode"})
    path.write_text(json.dumps(data))
    assert "pd_partition" in one_line_error(capsys, "run", str(path))


@settings(max_examples=200, deadline=None)
@given(
    prefill=st.floats(0.0, 1.0),
    both=st.booleans(),
    sat=st.floats(0.05, 1.0),
)
def test_a_partition_never_gives_a_stream_more_than_the_gpu(
    prefill: float, both: bool, sat: float
) -> None:
    bp, bd = bandwidth_shares(prefill, 1.0 - prefill, both_busy=both, sat=sat)
    assert 0.0 <= bp <= 1.0 and 0.0 <= bd <= 1.0
    if both:
        assert bp + bd <= 1.0 + 1e-12  # contended: one DRAM between them
    hw = load_hardware("h100_sxm")
    if prefill > 0.0 and bp > 0.0:
        part = partition_hardware(hw, sm_share=prefill, bandwidth_share=bp)
        assert part.memory.bandwidth_bytes_per_s <= hw.memory.bandwidth_bytes_per_s
        assert part.compute.units <= hw.compute.units
        for dtype, peak in part.compute.peak_flops_per_s.items():
            assert peak <= hw.compute.peak_flops_per_s[dtype]


def test_shares_above_the_whole_gpu_are_refused() -> None:
    hw = load_hardware("h100_sxm")
    for sm, bw in ((1.1, 1.0), (0.5, 1.01), (0.0, 0.5)):
        with pytest.raises(ValueError):
            partition_hardware(hw, sm_share=sm, bandwidth_share=bw)
    assert partition_hardware(hw, sm_share=1.0, bandwidth_share=1.0) is hw


def test_the_whole_gpu_to_one_stream_prices_steps_as_today() -> None:
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    args = {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "max_context": 4096}
    today = StepTimer(dep, **args)
    timers = PartitionTimers(dep=dep, full=today, enforce_eager=False, sampling=None,
                             offload=None, **args)  # fmt: skip
    assert timers.timer(1.0, 1.0) is today
    whole = StepTimer(
        dep.__class__(**{**dep.__dict__, "hardware": partition_hardware(
            dep.hardware, sm_share=1.0, bandwidth_share=1.0)}), **args)  # fmt: skip
    for n, ctx in ((1, 100), (16, 1500), (64, 4000)):
        assert whole.decode_run(num_seqs=n, total_context=n * ctx, steps=3).tolist() == (
            today.decode_run(num_seqs=n, total_context=n * ctx, steps=3).tolist()
        )
    chunks = [(1024, 0, True)]
    assert whole.mixed(chunks=chunks, decode_contexts=[500] * 8) == today.mixed(
        chunks=chunks, decode_contexts=[500] * 8
    )
    # a share of the GPU is slower for both kinds of step, and more SMs are never slower
    prefill = [timers.timer(s, min(1.0, s / saturation())).mixed(chunks=chunks, decode_contexts=[])
               for s in DECODE_SHARES]  # fmt: skip
    assert all(a >= b for a, b in itertools.pairwise(prefill))
    assert prefill[-1] > today.mixed(chunks=chunks, decode_contexts=[])


def test_one_request_at_a_time_runs_as_on_a_colocated_replica() -> None:
    # requests far apart: each stream is alone when it steps, so it has the whole GPU
    plain = _run(None, num_prompts=3, request_rate=0.05)
    nexus = _run("dynamic:50", num_prompts=3, request_rate=0.05)
    for key in ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
        assert nexus[key] == pytest.approx(plain[key], rel=1e-9), key


@pytest.mark.slow
def test_on_a_mixed_load_the_dynamic_split_cuts_tail_tbt_and_raises_offline_throughput() -> None:
    # Nexus: lower TBT than vLLM's chunked prefill, and more throughput (arXiv 2507.06608);
    # offline, once the steady state outweighs the decode-only drain at the end (600 prompts)
    plain = _run(None, num_prompts=200, request_rate=30)
    nexus = _run("dynamic:50", num_prompts=200, request_rate=30)
    assert nexus["p99_itl_ms"] < 0.7 * plain["p99_itl_ms"]
    assert nexus["p99_tpot_ms"] < plain["p99_tpot_ms"]
    offline = [
        runner.bench_throughput(
            model="llama-3.1-8b", hardware="h100_sxm", input_len=2048, output_len=256,
            num_prompts=600, engine_args=EngineArgs(pd_partition=p),
        )[1]["output_tokens_per_second"]
        for p in (None, "dynamic:50")
    ]  # fmt: skip
    assert offline[1] > offline[0]


def test_the_cli_flag_and_the_api_run_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.json"
    code, _, err = run_cli(
        capsys,
        *("bench", "throughput", "--model", "llama-3.1-8b", "--hardware", "h100_sxm"),
        *("--input-len", "512", "--output-len", "32", "--num-prompts", "16"),
        *("--pd-partition", "static:0.6", "--output-json", str(out)),
    )
    assert code == 0, err
    assert json.loads(out.read_text())["num_requests"] == 16
    code, _, err = run_cli(
        capsys,
        *("bench", "serve", "--model", "llama-3.1-8b", "--hardware", "h100_sxm"),
        *("--random-input-len", "512", "--random-output-len", "32", "--num-prompts", "16"),
        *("--request-rate", "8", "--pd-partition", "dynamic:40"),
    )
    assert code == 0, err
    summary = _run("static:0.5", num_prompts=12, request_rate=6)
    assert summary["completed"] == 12


def _scenario_file(tmp_path: Path) -> tuple[dict, Path]:
    """A small served scenario as its mapping and as s.yaml in `tmp_path`."""
    data = scenario_data(input_len=512, output_len=32, num_prompts=12, request_rate=6, seed=0)
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(data))
    return data, path


def test_run_takes_the_flag_for_every_colocated_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, path = _scenario_file(tmp_path)
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "run", str(path), "--pd-partition", "static:0.5",
                           "--out", str(out), "--outputs", "summary")  # fmt: skip
    assert code == 0, err
    flagged = json.loads((out / "summary.json").read_text())
    data["replicas"][0]["pd_partition"] = "static:0.5"
    direct = runner.run(validate(Scenario, data, source="t")).summary
    plain = runner.run(path).summary
    assert flagged["mean_ttft_ms"] != pytest.approx(plain["mean_ttft_ms"], rel=1e-6)
    assert flagged["mean_ttft_ms"] == pytest.approx(direct["mean_ttft_ms"], rel=1e-12)
    via_api = runner.run(path, pd_partition="static:0.5").summary
    assert via_api["mean_ttft_ms"] == pytest.approx(direct["mean_ttft_ms"], rel=1e-12)
    assert "static:7" in one_line_error(capsys, "run", str(path), "--pd-partition", "static:7")
    disagg = scenario_data(input_len=512, output_len=32, num_prompts=4,
                           group={"hardware": "h100_sxm", "role": "prefill"})  # fmt: skip
    disagg["replicas"].append({"hardware": "h100_sxm", "role": "decode"})
    path.write_text(json.dumps(disagg))
    err = one_line_error(capsys, "run", str(path), "--pd-partition", "dynamic:50")
    assert "colocated" in err


def _first_token_order(partition: str) -> list[int]:
    """Four prompts, longest first, a millisecond apart, on one partitioned H100 whose step
    holds 1,024 prompt tokens: the request ids in the order their first tokens came."""
    data = scenario_data(input_len=64, output_len=4, num_prompts=4, seed=0,
                         group={"hardware": "h100_sxm", "pd_partition": partition,
                                "scheduler": {"max_num_batched_tokens": 1024}})  # fmt: skip
    own = RequestTable(
        arrival_s=[0.0, 0.001, 0.002, 0.003], prompt_len=[3000, 2000, 1000, 500], output_len=[4] * 4
    )
    frame = runner.run(validate(Scenario, data, source="t"), requests=own).sim.requests
    return frame.sort_values("first_token_s")["request_id"].tolist()


def test_shortest_prompt_first_serves_the_queued_prompts_shortest_first() -> None:
    # the first prompt starts alone; the three queued behind it go in arrival order (FCFS)
    # or shortest first (spf), and a started prompt is not cut
    assert _first_token_order("dynamic:50") == [0, 1, 2, 3]
    assert _first_token_order("dynamic:50,prefill=spf") == [0, 3, 2, 1]
    assert _first_token_order("static:0.5,prefill=spf") == [0, 3, 2, 1]


@pytest.mark.slow
def test_under_a_queue_shortest_prompt_first_cuts_median_ttft() -> None:
    # the prefill stream's queue grows at 45 requests/s on one H100: SPF serves the short
    # prompts first (median TTFT falls) at the long ones' expense (the tail grows)
    fcfs = _run("dynamic:50", num_prompts=240, request_rate=25)
    spf = _run("dynamic:50,prefill=spf", num_prompts=240, request_rate=25)
    assert spf["median_ttft_ms"] < 0.8 * fcfs["median_ttft_ms"]
    assert spf["p99_ttft_ms"] > fcfs["p99_ttft_ms"]
    assert spf["completed"] == fcfs["completed"] == 240


def _split(partition: str) -> _Split:
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    args = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "max_context": 8192}
    timers = PartitionTimers(dep=dep, full=StepTimer(dep, **args), enforce_eager=False,
                             sampling=None, offload=None, **args)  # fmt: skip
    return _Split(parse_pd_partition(partition), timers)


def _step_s(split: _Split, share: float, reqs: list[Request]) -> float:
    total = float(sum(r.num_computed for r in reqs) + len(reqs))
    timer = split.timers.stream_timer("decode", share, both_busy=True)
    return float(timer.decode_run(num_seqs=len(reqs), total_context=total, steps=1)[0])


@settings(max_examples=25, deadline=None)
@given(
    batches=st.lists(
        st.tuples(st.integers(1, 200), st.integers(100, 6000)), min_size=2, max_size=12
    ),
    band=st.sampled_from([0.1, 0.3, 0.6]),
)
def test_hysteresis_meets_the_target_falls_only_with_margin_and_changes_less(
    batches: list[tuple[int, int]], band: float
) -> None:
    plain = _split("dynamic:30")
    held = _split(f"dynamic:30,hysteresis={band}")
    target = 0.030
    before = None
    for t, (n, context) in enumerate(batches):
        reqs = [Request(id=i, arrival_s=0.0, prompt_len=context, output_len=512) for i in range(n)]
        for r in reqs:
            r.num_computed = context
        least, chosen = plain.share_for(reqs, float(t)), held.share_for(reqs, float(t))
        assert chosen >= least  # never below the share the target needs
        if _step_s(held, least, reqs) <= target:  # the target can be met: it is
            assert _step_s(held, chosen, reqs) <= target
        if before is not None and chosen < before:  # fell: only to a share with margin
            assert _step_s(held, chosen, reqs) <= (1 - band) * target
        before = chosen
    assert held.decisions == plain.decisions == len(batches)


def _batch(n: int, context: int = 2000) -> list[Request]:
    reqs = [Request(id=i, arrival_s=0.0, prompt_len=context, output_len=512) for i in range(n)]
    for r in reqs:
        r.num_computed = context
    return reqs


def test_hysteresis_holds_the_split_where_the_batch_flickers_across_a_boundary() -> None:
    # a batch that grows and shrinks by one request across the point where the least share
    # meeting the target steps up: the plain split flips every step, the held one stays up
    plain = _split("dynamic:30")
    held = _split("dynamic:30,hysteresis=0.5")

    def least(n: int) -> float:
        return next(s for s in DECODE_SHARES if _step_s(plain, s, _batch(n)) <= 0.030)

    n = next(n for n in range(1, 256) if least(n + 1) > least(n))
    assert _step_s(plain, least(n), _batch(n)) > 0.5 * 0.030  # no margin at the lower share
    for t, size in enumerate([n + 1, n] * 4):
        plain.share_for(_batch(size), float(t))
        assert held.share_for(_batch(size), float(t)) == least(n + 1)
    assert (plain.changes, held.changes) == (7, 0)


def test_hysteresis_zero_is_the_plain_dynamic_split_and_the_run_counts_its_choices() -> None:
    plain = _run("dynamic:50", num_prompts=40, request_rate=20)
    zero = _run("dynamic:50,hysteresis=0", num_prompts=40, request_rate=20)
    assert zero == plain
    split = plain["pd_partition"]
    assert split["split_decisions"] > 0 and 0 <= split["split_changes"] <= split["split_decisions"]
    assert 0.1 <= split["mean_decode_share"] <= 0.9
    # a streamed run (no rows kept) counts the same choices
    streamed = _run("dynamic:50", num_prompts=40, request_rate=20, outputs="stream")
    assert streamed["pd_partition"] == split
    held = _run("dynamic:50,hysteresis=0.5", num_prompts=40, request_rate=20)["pd_partition"]
    assert held["split_changes"] <= split["split_changes"]
    assert "pd_partition" not in _run("static:0.5", num_prompts=4, request_rate=20)
    assert "pd_partition" not in _run(None, num_prompts=4, request_rate=20)


def test_the_split_and_its_options_print_and_exit_2_when_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, path = _scenario_file(tmp_path)
    code, out, err = run_cli(capsys, "run", str(path), "--pd-partition",
                             "dynamic:50,prefill=spf,hysteresis=0.2")  # fmt: skip
    assert code == 0, err
    assert "Split changes:" in out and "Mean decode SM share:" in out
    code, out, err = run_cli(
        capsys,
        *("bench", "throughput", "--model", "llama-3.1-8b", "--hardware", "h100_sxm"),
        *("--input-len", "2048", "--output-len", "64", "--num-prompts", "24"),
        *("--pd-partition", "dynamic:30"),
    )
    assert code == 0, err
    assert "Split changes:" in out  # `bench throughput` prints the split too
    err = one_line_error(capsys, "run", str(path), "--pd-partition", "dynamic:50,prefill=lifo")
    assert "--pd-partition" in err and "prefill=lifo" in err
    assert PdPartition(mode="dynamic", tbt_target_s=0.05).prefill_order == "fcfs"
