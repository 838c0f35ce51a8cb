"""The bundled long-context capacity sweep: it loads, and fewer KV bytes per token (int2) or
more GPUs per replica along the sequence (context parallelism) let more 128K users in."""

from __future__ import annotations

from pathlib import Path

import simulator as sim
from simulator.runs.sweeps import expand

SWEEP = Path(__file__).resolve().parents[1] / "scenarios" / "sweep_long_context_capacity.yaml"
SEQ = 130_000 + 256  # prompt + answer, as the sweep's workload


def users(model: str, hardware: str, **kw: object) -> int:
    dep = sim.deployment(model=model, hardware=hardware, **kw)  # type: ignore[arg-type]
    return dep.memory().max_batch(seq_len=SEQ, prompt_len=130_000)


def test_sweep_loads_and_lists_every_technique_on_every_gpu() -> None:
    runs = expand(sim.load_sweep(SWEEP))
    assert len(runs) == 30
    assert all(r["error"] is None for r in runs)
    assert {r["values"]["hardware"] for r in runs} == {"a100_sxm_80gb", "h100_sxm", "mi300x"}
    dtypes = {r["values"]["kv_cache_dtype"] for r in runs}
    assert dtypes == {"auto", "fp8", "int4", "int2"}


def test_int2_kv_fits_more_users_than_bf16() -> None:
    bf16 = users("llama-3.1-8b", "h100_sxm")
    int2 = users("llama-3.1-8b", "h100_sxm", kv_cache_dtype="int2")
    assert bf16 >= 1
    assert int2 > 4 * bf16  # 2-bit values over 16-bit, less KIVI's scales and residual window


def test_context_parallelism_fits_a_prompt_one_replica_cannot(tmp_path: Path) -> None:
    no_cp = users("llama-3.1-70b", "a100_sxm_80gb", tensor_parallel_size=2, kv_cache_dtype="int4")
    cp = users(
        "llama-3.1-70b",
        "a100_sxm_80gb",
        tensor_parallel_size=2,
        context_parallel_size=2,
        kv_cache_dtype="int4",
    )
    assert no_cp == 0 < cp
    # The whole sweep runs in seconds (8 requests a row): the A100 rows, simulated.
    table = sim.sweep(SWEEP, tmp_path / "lc", workers=1, progress=False)
    a100_70b = table[(table["hardware"] == "a100_sxm_80gb") & (table["model"] == "llama-3.1-70b")]
    by_cp = {
        (int(r.context_parallel_size), str(r.kv_cache_dtype)): r.status
        for r in a100_70b.itertuples()
    }
    assert by_cp[(1, "int4")] == "error" and by_cp[(2, "int4")] == "ok"
    ok = table[table["status"] == "ok"]
    assert (ok["mean_tpot_ms"] > 0).all() and (ok["usd_per_million_tokens"] > 0).all()


def test_a_34b_model_at_50k_context_serves_a_handful_of_users_at_most() -> None:
    """Yao Fu (arXiv 2405.08944): on one 80 GB A100 a 34B GQA model (Yi-34B-200K) serves
    about 20 users at 4K and 1 at 50K. llmsim, under vLLM's memory reserve, agrees in
    direction: many times fewer users at 50K, at most one, and KV compression lets one in."""

    def users(context: int, kv: str = "auto") -> int:
        dep = sim.deployment(model="yi-34b-200k", hardware="a100_sxm_80gb", kv_cache_dtype=kv)
        return int(dep.memory().max_batch(seq_len=context + 250, prompt_len=context))

    short, long = users(4096), users(50_000)
    assert long <= 1 and short >= 4 * max(long, 1)
    assert users(50_000, "fp8") >= 1 and users(50_000, "int4") >= users(50_000, "fp8")
