"""KV-cache tiers below HBM: sizes from the hardware spec, the tiers and the block manager by
hand, then narratives through the engine, the runner and the CLI.

The engine cases run on the fixed step-time model of test_engine.py (numbers on paper):
  a step with prefill chunks takes 10 ms + 10 us per prefill token,
  a decode-only step takes 5 ms;
and a CPU tier that loads a block in 1 ms.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from clitools import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.deployment import deployment
from simulator.costmodel.memory import KvHold, plan_memory
from simulator.errors import SpecError
from simulator.metrics.summary import kv_tier_summary
from simulator.runs import runner
from simulator.runs.sweeps import expand, load_sweep
from simulator.serving.cluster import ReplicaGroup, SimResult, serve
from simulator.serving.kv_cache import RUN
from simulator.serving.kv_tiers import KVTiers, Tier, TieredBlockManager, plan_tiers
from simulator.serving.request import Request
from simulator.specs.deployment import KvEviction
from simulator.specs.scenario import load_scenario
from simulator.specs.serving import KVOffloadSpec, SchedulerSpec
from simulator.workload.requests import RequestTable

MS = 1e-3
MiB = 2**20
GiB = 2**30
SCENARIOS = Path(__file__).parents[2] / "scenarios"


def tiers(backend: str = "lmcache", *, cpu: int = 100, nvme: int = 0) -> KVTiers:
    """A CPU tier of `cpu` blocks loading one in 1 ms (and an NVMe tier at 4 ms); a block is
    1 MiB over the replica's GPUs."""
    return KVTiers(
        backend=backend,  # type: ignore[arg-type]
        replica_block_bytes=MiB,
        cpu_blocks=cpu,
        cpu_s_per_block=1 * MS,
        nvme_blocks=nvme,
        nvme_s_per_block=4 * MS,
    )


def request(id: int, prompt: int, *, session: int = -1, output: int = 0) -> Request:
    req = Request(id=id, arrival_s=0.0, prompt_len=prompt, output_len=4, session_id=session)
    req.num_output = output
    return req


def compute(kv: TieredBlockManager, req: Request, tokens: int) -> Request:
    """Allocate for `tokens` more tokens of `req` and count them computed (as a step would)."""
    assert kv.allocate(req, tokens)
    req.num_computed += tokens
    return req


# -- sizes from the hardware spec ---------------------------------------------------------------
def sized(spec: KVOffloadSpec, *, tp: int = 1, kv_cache_dtype: str = "auto") -> KVTiers:
    dep = deployment(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        tensor_parallel_size=tp,
        kv_cache_dtype=kv_cache_dtype,
    )
    plan = plan_memory(dep.model, dep.hardware, dep.layout, dep.precision, dep.engine)
    return plan_tiers(spec, hw=dep.hardware, plan=plan, gpus=tp, swap_space_gib=4)


def test_tier_sizes_and_bandwidths_come_from_the_host_spec() -> None:
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes = 128 KiB a token, 2 MiB a
    # 16-token block. H100 host link: PCIe 5 64 GB/s x host_link_fraction 0.81 = 51.84 GB/s
    # (below the host DRAM's 77 GB/s); NVMe 7 GB/s.
    t = sized(KVOffloadSpec(cpu_gib=64))
    assert (t.cpu_blocks, t.replica_block_bytes) == (64 * GiB // (2 * MiB), 2 * MiB)
    assert t.cpu_s_per_block == pytest.approx(2 * MiB / 51.84e9)  # 40.5 us
    assert t.async_loads and t.nvme_blocks == 0
    # fp8 KV: 1 MiB blocks, twice as many in the same memory, each loaded in half the time
    fp8 = sized(KVOffloadSpec(cpu_gib=64), kv_cache_dtype="fp8")
    assert fp8.cpu_blocks == 2 * t.cpu_blocks
    assert fp8.cpu_s_per_block == pytest.approx(t.cpu_s_per_block / 2)
    # TP 2: each GPU holds 4 of the 8 KV heads (1 MiB of a block) and half the 64 GiB, and
    # copies its share over its own link at the same time
    tp2 = sized(KVOffloadSpec(cpu_gib=64), tp=2)
    assert (tp2.cpu_blocks, tp2.replica_block_bytes) == (t.cpu_blocks, 2 * MiB)
    assert tp2.cpu_s_per_block == pytest.approx(MiB / 51.84e9)
    # NVMe through host memory: the slower link, 7 GB/s
    disk = sized(KVOffloadSpec(backend="lmcache", cpu_gib=8, nvme_gib=100))
    assert disk.nvme_blocks == 100 * GiB // (2 * MiB) and not disk.async_loads
    assert disk.nvme_s_per_block == pytest.approx(2 * MiB / 7e9)
    # overrides
    fast = sized(KVOffloadSpec(cpu_gib=64, cpu_bw_bytes_per_s="100 GB/s"))  # type: ignore[arg-type]
    assert fast.cpu_s_per_block == pytest.approx(2 * MiB / 100e9)
    # a request preempted after 48 tokens (3 blocks), its HBM copies evicted, reloads them:
    # 3 x 2 MiB / 51.84 GB/s = 121 us, and wrote 3 x 2 MiB
    kv = TieredBlockManager(num_blocks=3, block_size=16, tiers=t, watermark=0.0)
    req = compute(kv, request(0, 48, output=1), 48)
    kv.release(req)
    req.num_computed = 0
    other = request(1, 48)
    assert kv.allocate(other, 48)  # takes the 3 blocks: evicts them from HBM
    kv.release(other)  # preempted before computing: writes nothing
    assert kv.take_prefix(req, kv.prefix_hit(req)) == pytest.approx(3 * 2 * MiB / 51.84e9)
    assert kv.tier_row()[5:7] == (3 * 2 * MiB, 3 * 2 * MiB)


def test_the_default_cpu_tier_is_the_host_memory_left() -> None:
    # 256 GB of host memory per H100 less 4 GiB of swap space, in 2 MiB blocks
    t = sized(KVOffloadSpec())
    assert t.cpu_blocks == int((256e9 - 4 * GiB) // (2 * MiB))
    with pytest.raises(SpecError, match=r"kv_offload\.cpu_gib"):
        sized(KVOffloadSpec(cpu_gib=300))  # more than the host holds
    with pytest.raises(ValueError, match="lmcache for NVMe"):
        KVOffloadSpec(nvme_gib=10)  # the native backend has no disk tier


# -- one tier -------------------------------------------------------------------------------------
def test_a_tier_drops_its_least_recently_used_entries() -> None:
    tier = Tier(capacity=4, s_per_block=MS)
    a, b, c, d = ((0, 16 * i, -1, 16 * i) for i in range(1, 5))
    for key in (a, b, c):
        tier.write(key)
    tier.write(a)  # held already: touched, not written again
    assert (tier.used, tier.written, list(tier.lru)) == (3, 3, [b, c, a])
    run = (RUN, 7, 0, 0)
    tier.write(run, 2)  # 5 blocks > 4: b goes
    assert list(tier.lru) == [c, a, run] and tier.used == 4
    tier.touch(c)
    tier.write(run, 3)  # the run grows by one block (written once): a goes, c was touched
    assert list(tier.lru) == [c, run] and (tier.used, tier.written) == (4, 6)
    tier.touch(c)
    tier.write(d)  # the run is the oldest entry, dropped as one unit
    assert list(tier.lru) == [c, d] and tier.used == 2
    tier.write((RUN, 8, 0, 0), 10)  # longer than the tier: its head, 4 blocks, stays
    assert tier.lru == {(RUN, 8, 0, 0): 4} and (tier.used, tier.written) == (4, 17)


# -- the block manager by hand --------------------------------------------------------------------
def test_an_evicted_prefix_is_reloaded_from_the_cpu_tier_instead_of_recomputed() -> None:
    kv = TieredBlockManager(num_blocks=8, block_size=16, tiers=tiers(), watermark=0.0)
    first = compute(kv, request(0, 64, session=3, output=1), 64)
    kv.release(first)  # its 4 full blocks: cached in HBM, written to the CPU tier
    cpu = kv.lower[0]
    assert (cpu.used, cpu.written, kv.unheld) == (4, 4, 4)
    other = compute(kv, request(1, 128), 128)  # 8 blocks: the 4 empty ones, then evicts those 4
    assert kv.evictions == 4 and not kv.lru
    kv.release(other)  # its own 8 blocks: one run in HBM and in the tier (4 + 8 = 12 written)
    # the next turn: 96 tokens, the first 64 as before. The hit: 4 blocks, all in the CPU tier
    turn = request(2, 96, session=3)
    assert kv.prefix_hit(turn) == 64
    assert kv.can_admit(turn, 32, hit=64)  # 4 loaded + 2 new blocks of the 8 free
    assert kv.take_prefix(turn, 64) == pytest.approx(4 * MS)  # 4 blocks x 1 ms each
    assert (turn.num_computed, turn.blocks, turn.cached_tokens) == (64, 4, 64)
    assert (cpu.read, kv.hit_blocks, kv.load_s) == (4, [0, 4, 0], pytest.approx(4 * MS))
    assert kv.runs == {other.stream: 4}  # the loads took 4 HBM blocks: the run's tail
    row = kv.tier_row()
    assert row[:3] == (4, 12, 0)  # HBM blocks in use, CPU blocks, NVMe blocks
    assert row[5:7] == (12 * MiB, 4 * MiB)  # bytes written to and read from the CPU tier


def test_under_a_budget_the_tiers_get_the_shared_prefix_only() -> None:
    """A SnapKV budget of 32 tokens: a request of its own stream with a 64-token shared prefix
    and 64 tokens of its own keeps its prefix whole and what the budget keeps of the rest; when
    it ends the tiers get the prefix's 4 keyed blocks and no run of its own content (the budget
    evicted from it, so what is left no longer follows the prefix); the next request with that
    prefix finds it."""
    hold = KvHold(eviction=KvEviction(budget_tokens=32))
    kv = TieredBlockManager(num_blocks=40, block_size=16, tiers=tiers(), watermark=0.0, hold=hold)
    first = Request(id=0, arrival_s=0.0, prompt_len=128, output_len=4, prefix_id=5, prefix_len=64)
    compute(kv, first, 128)
    first.num_output = 1
    compute(kv, first, 1)  # its first decode: the budget keeps 32 of the prompt (+ 1 new)
    assert first.blocks < 9  # 9 without a budget
    kv.release(first)
    cpu = kv.lower[0]
    assert cpu.written == 4 and (RUN, first.stream, 0, 0) not in cpu.lru
    assert kv.free == kv.num_blocks
    again = Request(id=1, arrival_s=0.0, prompt_len=100, output_len=4, prefix_id=5, prefix_len=64)
    assert kv.prefix_hit(again) == 64


def test_a_preempted_request_swaps_out_and_back_at_the_tier_bandwidth() -> None:
    # A request of its own content, preempted by recompute after 64 tokens: its 4 blocks are
    # written to the CPU tier (4 x 1 MiB); they leave HBM; readmitted, it loads all 4 back:
    # 4 blocks x 1 ms, where recomputing would prefill 64 tokens.
    kv = TieredBlockManager(num_blocks=8, block_size=16, tiers=tiers(), watermark=0.0)
    req = compute(kv, request(0, 64, output=1), 64)
    kv.release(req)
    req.num_computed, req.preemptions = 0, 1
    assert kv.lower[0].lru == {(RUN, req.stream, 0, 0): 4}
    kv.release(compute(kv, request(1, 128), 128))  # evicts the 4 from HBM
    assert kv.prefix_hit(req) == 64  # known 65 tokens: 4 full blocks
    assert kv.take_prefix(req, 64) == pytest.approx(4 * MS)
    assert kv.tier_row()[5:7] == (12 * MiB, 4 * MiB)
    assert req.cached_tokens == 0  # counted at the first admission only


def test_a_hit_spans_the_tiers_fastest_first() -> None:
    # CPU tier of 2 blocks, NVMe of 10: the first turn's 4 blocks are written to both; the CPU
    # keeps the 2 it wrote last (the head: a request writes its tail first). Another request
    # takes the 4 HBM blocks and is preempted before computing (writing nothing). The next
    # turn loads blocks 0-1 from the CPU (1 ms each) and 2-3 from NVMe (4 ms each).
    kv = TieredBlockManager(num_blocks=4, block_size=16, tiers=tiers(cpu=2, nvme=10), watermark=0)
    kv.release(compute(kv, request(0, 64, session=1, output=1), 64))
    other = request(1, 64)
    assert kv.allocate(other, 64)  # evicts all 4 from HBM
    kv.release(other)
    turn = request(2, 80, session=1)
    assert kv.prefix_hit(turn) == 64
    assert kv.take_prefix(turn, 64) == pytest.approx(2 * MS + 2 * 4 * MS)
    assert kv.hit_blocks == [0, 2, 2]


# -- through the engine -------------------------------------------------------------------------
class FixedTimer:
    """10 ms + 10 us per prefill token for a step with chunks, 5 ms for a decode-only step."""

    penalises = False  # no sampling penalties (`StepTimer.penalises`)

    def decode_run(
        self, *, num_seqs: int, total_context: float, steps: int, outputs: tuple[int, int] = (0, 0)
    ) -> np.ndarray:
        return np.full(steps, 5 * MS)

    def decode_ends(
        self, *, start: float, num_seqs: int, total_context: float, steps: int
    ) -> list[float] | None:
        return None  # no short-run path (`StepTimer.decode_ends`): the replica sums decode_run

    def mixed(
        self,
        *,
        chunks: Sequence[tuple[int, int, bool]],
        decode_contexts: Sequence[int],
        outputs: tuple[int, int] = (0, 0),
    ) -> float:
        return 10 * MS + 0.01 * MS * sum(c[0] for c in chunks)


def simulate(requests: RequestTable, *, kv_tiers: KVTiers | None) -> SimResult:
    spec = SchedulerSpec(max_num_seqs=8, max_num_batched_tokens=2048, watermark=0.0)
    group = ReplicaGroup(
        scheduler=spec,
        timer=FixedTimer(),  # type: ignore[arg-type]
        num_blocks=8,
        block_size=16,
        enable_prefix_caching=True,
        kv_tiers=kv_tiers,
    )
    return serve(requests, groups=[group])


# r0 turn 1 of conversation 0 (64 + 2 out); r1 its turn 2 (96 tokens), sent 50 ms after r0
# finished; r2 a 128-token prompt of its own that evicts r0's blocks from HBM; r3 decodes
# alongside r1.
NARRATIVE = RequestTable(
    arrival_s=np.array([0.0, 0.0, 0.020, 0.040]),
    prompt_len=np.array([64, 96, 128, 16]),
    output_len=np.array([2, 1, 1, 20]),
    session_id=np.array([0, 0, -1, -1]),
    follows=np.array([-1, 0, -1, -1]),
    think_s=np.array([0.0, 0.050, 0.0, 0.0]),
)


def ms(df: pd.DataFrame, column: str) -> list[float]:
    return [round(x / MS, 6) for x in df.sort_values("request_id")[column]]


def test_lmcache_loads_before_the_step_and_the_batch_waits() -> None:
    # r0: prefill 10.64 ms, one decode -> 15.64 ms; its 4 full blocks go to the CPU tier.
    # r2 at 20 ms: 8 blocks (evicting r0's), prefill 11.28 ms -> 31.28 ms. r3 at 40 ms:
    # prefill 10.16 -> 50.16, then decodes every 5 ms. r1 is sent at 65.64 ms, during the
    # decode 65.16-70.16; at 70.16 it starts from 64 cached tokens found in the CPU tier:
    # the step loads 4 blocks (4 ms) and then runs r3's decode and r1's 32 tokens (10.32 ms):
    # 84.48 ms. r3's token waits for the load too.
    result = simulate(NARRATIVE, kv_tiers=tiers("lmcache"))
    assert ms(result.requests, "finish_s")[0] == 15.64
    assert ms(result.requests, "finish_s")[2] == 31.28
    assert ms(result.requests, "first_token_s")[1] == 84.48
    assert result.requests["cached_tokens"].tolist() == [0, 64, 0, 0]
    steps = result.steps
    admitted = steps[steps["prefill_tokens"] == 32]
    assert round(float((admitted["end_s"] - admitted["start_s"]).iloc[0]) / MS, 6) == 14.32
    summary = kv_tier_summary(result.kv_tiers)  # type: ignore[arg-type]
    assert summary["prefix_cache_hit_tokens_cpu"] == 64
    assert summary["kv_offload_load_s"] == pytest.approx(4 * MS)
    # written: r0's 4 blocks, r2's 8, r3's 2 full blocks (16 + 19 decoded tokens: 35 // 16),
    # r1's 2 new ones (and its 4 loaded, held already); read: r1's 4
    assert summary["kv_offload_cpu_bytes_written"] == (4 + 8 + 2 + 2) * MiB
    assert summary["kv_offload_cpu_bytes_read"] == 4 * MiB


def test_native_loads_between_steps_and_only_the_request_waits() -> None:
    # As above until 70.16 ms: r1's 4 blocks load over the host link (4 ms, to 74.16) while
    # r3 decodes (70.16-75.16); the decode in progress ends, then r1 runs its 32 tokens with
    # r3's decode: 75.16 + 10.32 = 85.48 ms. r3's tokens are not held up by the load.
    result = simulate(NARRATIVE, kv_tiers=tiers("native"))
    assert ms(result.requests, "first_token_s")[1] == 85.48
    assert ms(result.requests, "first_scheduled_s")[1] == 75.16
    steps = result.steps
    admitted = steps[steps["prefill_tokens"] == 32]
    assert round(float((admitted["end_s"] - admitted["start_s"]).iloc[0]) / MS, 6) == 10.32
    assert admitted["num_seqs"].tolist() == [2]


def test_without_tiers_the_evicted_prefix_is_recomputed() -> None:
    # r1 finds nothing: at 70.16 ms it prefills all 96 tokens with r3's decode: 10.96 ms.
    result = simulate(NARRATIVE, kv_tiers=None)
    assert ms(result.requests, "first_token_s")[1] == 81.12
    assert result.requests["cached_tokens"].tolist() == [0, 0, 0, 0]
    assert result.kv_tiers is None


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    backend=st.sampled_from(["native", "lmcache"]),
    cpu=st.integers(1, 40),
    nvme=st.integers(0, 40),
)
def test_tiers_change_nothing_when_nothing_is_shared(
    seed: int, backend: str, cpu: int, nvme: int
) -> None:
    # Requests of their own content in a cache that never preempts: no block is ever found
    # again, so tiers only add writes.
    rng = np.random.default_rng(seed)
    n = 12
    requests = RequestTable(
        arrival_s=np.sort(rng.uniform(0, 0.2, n)),
        prompt_len=rng.integers(1, 40, n),
        output_len=rng.integers(1, 30, n),
    )
    spec = SchedulerSpec(max_num_seqs=4, max_num_batched_tokens=64, watermark=0.0)
    results = [
        serve(
            requests,
            groups=[
                ReplicaGroup(
                    scheduler=spec,
                    timer=FixedTimer(),  # type: ignore[arg-type]
                    num_blocks=64,
                    block_size=16,
                    enable_prefix_caching=True,
                    kv_tiers=t,
                )
            ],
        )
        for t in (None, tiers(backend, cpu=cpu, nvme=nvme))
    ]
    pd.testing.assert_frame_equal(results[0].requests, results[1].requests)
    frame = results[1].kv_tiers
    assert frame is not None and frame["load_s"].max() == 0
    assert (frame["cpu_blocks"] <= cpu).all() and (frame["nvme_blocks"] <= nvme).all()


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["admit", "grow", "finish", "preempt"]), st.integers(0, 7)),
        min_size=1,
        max_size=50,
    )
)
def test_accounting_holds_under_any_sequence(ops: list[tuple[str, int]]) -> None:
    # conversations and requests of their own content, admitted from whatever tier holds
    # their blocks, grown, finished or preempted by recompute in any order: HBM blocks add up,
    # the tiers stay within capacity, and a hit costs what it loads at each tier's speed
    kv = TieredBlockManager(
        num_blocks=20, block_size=16, tiers=tiers(cpu=12, nvme=30), watermark=0.0
    )
    active: list[Request] = []
    for number, (op, x) in enumerate(ops):
        if op == "admit":
            req = request(number, 5 + 13 * x, session=x % 3 if x % 2 else -1)
            hit = kv.prefix_hit(req)
            n = req.known - hit
            if kv.can_admit(req, n, hit=hit):
                before = list(kv.hit_blocks)
                seconds = kv.take_prefix(req, hit) if hit else 0.0
                cpu, disk = (kv.hit_blocks[t] - before[t] for t in (1, 2))
                assert seconds == pytest.approx(cpu * MS + disk * 4 * MS)
                compute(kv, req, n)
                req.num_output += 1
                active.append(req)
        elif op == "grow" and active:
            req = active[x % len(active)]
            if kv.allocate(req, 1):
                req.num_computed += 1
                req.num_output += 1
        elif op in ("finish", "preempt") and active:
            req = active.pop(x % len(active))
            kv.release(req)
            req.num_computed = 0
        assert kv.free == kv.empty + kv.unheld
        assert kv.free + sum(r.blocks for r in active) >= kv.num_blocks - len(kv.held)
        for tier in kv.lower:
            assert tier.used == sum(tier.lru.values()) <= tier.capacity


# -- scenarios, runner, CLI ---------------------------------------------------------------------
def test_the_bench_flags_add_a_cpu_tier(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b",
        "--random-input-len", "256", "--random-output-len", "16", "--random-prefix-len", "512",
        "--num-prompts", "40", "--request-rate", "20", "--enable-prefix-caching",
        "--gpu-memory-utilization", "0.3", "--json",
    ]  # fmt: skip
    code, out, _ = run_cli(capsys, *args, "--kv-offloading-size", "16")
    assert code == 0
    summary = json.loads(out)
    assert summary["kv_offload_cpu_bytes_written"] > 0
    assert (
        summary["prefix_cache_hit_tokens_gpu"] > 0 and "kv_offload_nvme_bytes_read" not in summary
    )
    code, out, _ = run_cli(capsys, *args)
    assert code == 0 and "kv_offload_load_s" not in json.loads(out)
    code, out, _ = run_cli(capsys, *args[:-1], "--kv-offloading-size", "16")  # as text
    assert code == 0 and "KV offload tiers" in out and "CPU tier written (GB):" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--kv-offloading-size", "16", "--no-enable-prefix-caching"], "needs prefix caching"),
        (["--kv-offloading-size", "16", "--engine", "vllm-0.6"], "needs enable_prefix_caching"),
        (["--kv-offloading-backend", "lmcache"], "needs --kv-offloading-size"),
    ],
)
def test_bad_kv_offloading_flags_exit_2(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    args = ["bench", "throughput", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"]
    code, _, err = run_cli(capsys, *args, "--num-prompts", "4", *extra)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_kv_offload_is_refused_where_not_modelled(tmp_path: Path) -> None:
    text = (SCENARIOS / "long_context_kv_offload.yaml").read_text()
    bad = tmp_path / "swap.yaml"
    swap = "scheduler: {preemption_mode: swap}\n    enable_prefix_caching: true"
    bad.write_text(text.replace("enable_prefix_caching: true", swap))
    with pytest.raises(SpecError, match="swap preemption"):
        load_scenario(bad)
    bad.write_text(text.replace("enable_prefix_caching: true", "enable_prefix_caching: false"))
    with pytest.raises(SpecError, match="enable_prefix_caching"):
        load_scenario(bad)


@pytest.mark.slow  # the bundled scenario, twice (about 3-6 s)
def test_the_long_context_scenario_reloads_instead_of_recomputing(tmp_path: Path) -> None:
    scenario = load_scenario(SCENARIOS / "long_context_kv_offload.yaml")
    group = scenario.replicas[0]
    assert group.kv_offload is not None
    with_tiers = runner.run(scenario)
    off = group.model_copy(update={"kv_offload": None})
    without = runner.run(scenario.model_copy(update={"replicas": [off]}))
    s, base = with_tiers.summary, without.summary
    assert s["prefix_cache_hit_tokens_cpu"] > 0 and s["kv_offload_load_s"] > 0
    assert s["mean_ttft_ms"] < base["mean_ttft_ms"] / 2
    assert s["total_input_tokens"] == base["total_input_tokens"]
    samples = pd.read_csv(runner.save_run(with_tiers, tmp_path) / "kv_tiers.csv")
    assert samples["cpu_bytes_read"].iloc[-1] == s["kv_offload_cpu_bytes_read"]
    assert samples["cpu_blocks"].max() <= samples["cpu_capacity_blocks"].iloc[0]
    assert not (tmp_path / "off").exists() and without.sim.kv_tiers is None


def test_a_budget_with_kv_offload_keeps_its_savings() -> None:
    """The long-context offload scenario (16 conversations over 120K-token documents, a 200
    GiB CPU tier) with a 4,096-token SnapKV budget: the documents (shared prefixes) are still
    found in the tiers as often, and each decode reads what the budget keeps: faster TPOT."""
    scenario = load_scenario(SCENARIOS / "long_context_kv_offload.yaml")
    group = scenario.replicas[0]
    budget = group.model_copy(update={"kv_budget": 4096})
    plain = runner.run(scenario).summary
    kept = runner.run(scenario.model_copy(update={"replicas": [budget]})).summary
    assert kept["prefix_cache_hit_rate"] == pytest.approx(plain["prefix_cache_hit_rate"], rel=0.01)
    assert kept["prefix_cache_hit_tokens_cpu"] > 0
    assert kept["mean_tpot_ms"] < 0.8 * plain["mean_tpot_ms"]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    backend=st.sampled_from(["native", "lmcache"]),
    num_blocks=st.integers(12, 40),
)
def test_conversations_in_a_small_cache_all_finish(
    seed: int, backend: str, num_blocks: int
) -> None:
    # Conversations whose turns reload earlier turns while the cache is too small to hold
    # them all: loads, preemptions and (native) requests holding loaded blocks while they
    # wait all resolve; every request finishes, none counts more cached tokens than it sent.
    rng = np.random.default_rng(seed)
    n = 24
    session = rng.integers(0, 4, n)
    follows = np.full(n, -1)
    last: dict[int, int] = {}
    for i, s in enumerate(session.tolist()):
        follows[i] = last.get(s, -1)
        last[s] = i
    arrival = np.zeros(n)
    first = follows < 0
    arrival[first] = np.sort(rng.uniform(0, 0.1, int(first.sum())))
    for i in np.flatnonzero(~first):
        arrival[i] = arrival[follows[i]]
    prompt = np.zeros(n, dtype=int)
    for i in range(n):  # each turn resends its conversation so far plus a new message
        before = prompt[follows[i]] + 8 if follows[i] >= 0 else 0
        prompt[i] = before + int(rng.integers(1, 40))
    order = np.argsort(arrival, kind="stable")
    remap = np.empty(n, dtype=int)
    remap[order] = np.arange(n)
    requests = RequestTable(
        arrival_s=arrival[order],
        prompt_len=prompt[order],
        output_len=np.full(n, 8),
        session_id=session[order],
        follows=np.where(follows[order] >= 0, remap[follows[order]], -1),
        think_s=rng.uniform(0, 0.05, n)[order],
    )
    spec = SchedulerSpec(max_num_seqs=4, max_num_batched_tokens=48, watermark=0.0)
    group = ReplicaGroup(
        scheduler=spec,
        timer=FixedTimer(),  # type: ignore[arg-type]
        num_blocks=max(num_blocks, int(prompt.max()) // 16 + 2),
        block_size=16,
        enable_prefix_caching=True,
        kv_tiers=tiers(backend, cpu=30, nvme=10),
    )
    result = serve(requests, groups=[group])
    df = result.requests
    assert len(df) == n and df["finish_s"].notna().all()
    assert (df["cached_tokens"] < df["prompt_tokens"]).all()


def test_the_context_length_sweep_expands_to_valid_scenarios() -> None:
    runs = expand(load_sweep(SCENARIOS / "sweep_long_context_offload.yaml"))
    assert len(runs) == 16 and not [r["error"] for r in runs if r["error"]]
    longest = max(r["scenario"]["workload"]["prefix"]["tokens"] for r in runs)
    assert longest + 8000 <= 1_010_000  # the model's context (max_position_embeddings)
