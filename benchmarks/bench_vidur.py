"""Speed and memory of llmsim beside Vidur (microsoft/vidur, PyPI `vidur`) on one workload.

    python benchmarks/bench_vidur.py --vidur-python VENV/bin/python --vidur-dir DIR
                                     [--requests N] [--input-len L] [--output-len L] [--rate R]
                                     [--repeat K] [--cases NAME,...] [--first-run]
                                     [--vidur-extra "ARGS"] [--json]

One replica, tensor and pipeline parallel 1, N requests of fixed prompt and output lengths
arriving as a Poisson process at R/s (default 10,000 requests of 512 + 128 tokens at 10/s), each
simulator in a fresh child process, the cases interleaved. Vidur's Poisson generator caps each
interval at three mean intervals, which makes its mean rate R / (1 - e^-3) = 1.052 R: llmsim
is given that rate, so both simulate the same number of requests per second.
- `llmsim`: `runner.run` of the equivalent `llmsim bench serve` scenario in process (vLLM
  profile, max_num_seqs 128, max_num_batched_tokens 512 with chunked prefill, prefix caching
  off, gpu_memory_utilization 0.8), the whole interpreter measured;
- `llmsim-cli`: the same through `python -m simulator bench serve ... --json`;
- `vidur`: `python -m vidur.main` with the Sarathi scheduler (batch cap 128, chunk 512), its
  metrics collected and request_metrics.csv written, plots and Chrome trace off;
- `vidur-outputs`: the same with Vidur's default outputs (plots, Chrome trace);
- `vidur-sim-only`: `--no-metrics_config_write_metrics` (no metrics, no outputs).
Vidur runs from its cached predictions (`DIR/.vidur_cache`); the first run on an empty cache
trains its random-forest models (a grid search) and predicts its lookup tables, and a case that
did so says "trained". A cold DIR cache is warmed by one unmeasured run first; `--first-run`
instead measures that run, on a fresh cache directory whose contents then warm DIR's.

Vidur (0.0.2x) reads its profiles from Hugging Face datasets (huggingface_hub
snapshot_download); this machine has no access to them, so the script builds that cache offline
from the CSVs of microsoft/vidur's `data/profiling` layout under DIR
(`data/profiling/compute/<device>/<profile model>/{mlp,attention}.csv`,
`data/profiling/network/<network device>/{all_reduce,send_recv}.csv`) and runs Vidur with
HF_HUB_OFFLINE=1 and WANDB_MODE=disabled. The defaults (`a100`, Meta-Llama-3-8B, `a100_dgx`
against llmsim's `a100_sxm_80gb` and `llama-3.1-8b`) are the profile microsoft/vidur's tree
holds for Llama-3-8B; its attention.csv files are Git LFS objects, absent from a plain clone.

Each figure is the child's CPU seconds (user + system, os.wait4; its descendants included: this
process adopts the workers that outlive it, joblib's, and adds theirs), wall seconds and peak
resident memory (the child's own ru_maxrss); with `--repeat K` the run of least CPU of K. The
headline outputs (completed requests, simulated duration, TTFT and end-to-end latency) are
printed beside them, to show the two simulators ran the same load.
"""

from __future__ import annotations

import argparse
import csv
import json
import lzma
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# beside this script (its folder is on sys.path when run)
from bench_serving import least, machine, machine_line

ROOT = Path(__file__).resolve().parents[1]
CASES = ("llmsim", "llmsim-cli", "vidur", "vidur-outputs", "vidur-sim-only")
PREDICTOR = "--random_forrest_execution_time_predictor_config"
REVISION = "0" * 40  # the one snapshot of each offline dataset


@dataclass(frozen=True)
class Setup:
    """The workload and the two simulators' names for the same model and device."""

    requests: int
    input_len: int
    output_len: int
    rate: float
    max_num_seqs: int
    chunk: int
    model: str
    hardware: str
    vidur_model: str
    vidur_profile_model: str
    vidur_device: str
    vidur_network_device: str


def llmsim_rate(setup: Setup) -> float:
    """Vidur's mean arrival rate at `--poisson_..._qps R`: its intervals are exponential capped
    at 3 / R (vidur/request_generator/poisson_request_interval_generator.py)."""
    return setup.rate / (1 - math.exp(-3))


def llmsim_case(setup: Setup) -> dict[str, Any]:
    """Run the llmsim workload here (this interpreter is the child) and describe it."""
    from simulator.runs import runner
    from simulator.specs.engine_args import EngineArgs
    from simulator.specs.workload import WorkloadSpec
    from simulator.workload.requests import RandomDataset

    workload = WorkloadSpec(
        dataset=RandomDataset(
            input_len=setup.input_len, output_len=setup.output_len, range_ratio=0.0
        ),
        num_prompts=setup.requests,
        request_rate=llmsim_rate(setup),
    )
    scenario = runner.bench_scenario(
        model=setup.model,
        hardware=setup.hardware,
        workload=workload,
        engine_args=llmsim_engine_args(setup, EngineArgs),
    )
    cpu, wall = time.process_time(), time.perf_counter()
    result = runner.run(scenario)
    return {
        "inner_cpu_s": time.process_time() - cpu,
        "inner_wall_s": time.perf_counter() - wall,
        "steps": len(result.sim.steps),
    } | headline_llmsim(result.summary)


def llmsim_engine_args(setup: Setup, cls: Any) -> Any:
    return cls(
        max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.chunk,
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.8,
    )


def headline_llmsim(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "completed": int(summary["completed"]),
        "sim_duration_s": summary["duration"],
        "mean_ttft_ms": summary["mean_ttft_ms"],
        "p99_ttft_ms": summary["p99_ttft_ms"],
        "mean_e2e_ms": summary["mean_e2el_ms"],
        "p99_e2e_ms": summary["p99_e2el_ms"],
    }


def llmsim_cli_argv(setup: Setup) -> list[str]:
    return [
        sys.executable, "-m", "simulator", "bench", "serve",
        "--model", setup.model, "--hardware", setup.hardware,
        "--random-input-len", str(setup.input_len),
        "--random-output-len", str(setup.output_len),
        "--num-prompts", str(setup.requests), "--request-rate", str(llmsim_rate(setup)),
        "--max-num-seqs", str(setup.max_num_seqs),
        "--max-num-batched-tokens", str(setup.chunk),
        "--enable-chunked-prefill", "--no-enable-prefix-caching",
        "--gpu-memory-utilization", "0.8", "--json",
    ]  # fmt: skip


def dataset_ids(setup: Setup) -> tuple[str, str]:
    """The (compute, network) dataset ids the offline cache holds for this setup."""
    slug = setup.vidur_profile_model.replace("/", "-").lower()
    return f"local/vidur-{slug}-{setup.vidur_device}", f"local/vidur-{setup.vidur_network_device}"


def put_dataset(cache: Path, repo_id: str, files: dict[str, Path], config: dict[str, str]) -> None:
    """One Hugging Face dataset snapshot in huggingface_hub's cache layout, its CSVs xz'd."""
    repo = cache / ("datasets--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    if (snapshot / "config.json").exists():
        return
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    for name, source in files.items():
        if not source.exists():
            raise SystemExit(f"{source}: missing (Vidur's profile; see the module doc)")
        with source.open("rb") as src, lzma.open(snapshot / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    (snapshot / "config.json").write_text(json.dumps(config))


def prepare_cache(vidur_dir: Path, cache: Path, setup: Setup) -> None:
    """Vidur's profiling datasets, built from DIR/data/profiling, under `cache`."""
    compute_id, network_id = dataset_ids(setup)
    compute = vidur_dir / "data/profiling/compute" / setup.vidur_device / setup.vidur_profile_model
    network = vidur_dir / "data/profiling/network" / setup.vidur_network_device
    put_dataset(
        cache / "profiling_data/compute",
        compute_id,
        {"mlp.csv.xz": compute / "mlp.csv", "attention.csv.xz": compute / "attention.csv"},
        {"model": setup.vidur_model, "device_sku": setup.vidur_device},
    )
    put_dataset(
        cache / "profiling_data/network",
        network_id,
        {
            "all_reduce.csv.xz": network / "all_reduce.csv",
            "send_recv.csv.xz": network / "send_recv.csv",
        },
        {"sku": setup.vidur_network_device},
    )


def vidur_argv(
    python: str, setup: Setup, case: str, out: Path, cache: Path, extra: list[str]
) -> list[str]:
    compute_id, network_id = dataset_ids(setup)
    argv = [
        python, "-m", "vidur.main",
        "--replica_config_device", setup.vidur_device,
        "--replica_config_network_device", setup.vidur_network_device,
        "--replica_config_model_name", setup.vidur_model,
        "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1",
        "--cluster_config_num_replicas", "1",
        "--replica_scheduler_config_type", "sarathi",
        "--sarathi_scheduler_config_batch_size_cap", str(setup.max_num_seqs),
        "--sarathi_scheduler_config_chunk_size", str(setup.chunk),
        "--request_generator_config_type", "synthetic",
        "--synthetic_request_generator_config_num_requests", str(setup.requests),
        "--length_generator_config_type", "fixed",
        "--fixed_request_length_generator_config_prefill_tokens", str(setup.input_len),
        "--fixed_request_length_generator_config_decode_tokens", str(setup.output_len),
        "--interval_generator_config_type", "poisson",
        "--poisson_request_interval_generator_config_qps", str(setup.rate),
        f"{PREDICTOR}_model_profiling_dataset", compute_id,
        f"{PREDICTOR}_network_profiling_dataset", network_id,
        f"{PREDICTOR}_cache_dir", str(cache),
        "--metrics_config_output_dir", str(out),
    ]  # fmt: skip
    if case in ("vidur", "vidur-first"):
        argv += ["--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace"]
    elif case == "vidur-sim-only":
        argv += ["--no-metrics_config_write_metrics", "--no-metrics_config_enable_chrome_trace"]
    return argv + extra


def headline_vidur(out: Path, log: str) -> dict[str, Any]:
    """Vidur's headline outputs: its log's simulated end, its request_metrics.csv's latencies."""
    figures: dict[str, Any] = {"trained": "Trained model" in log}
    ended = re.search(r"Simulation ended at: ([0-9.eE+-]+)s", log)
    if ended:
        figures["sim_duration_s"] = float(ended.group(1))
    metrics = sorted(out.rglob("request_metrics.csv"))
    if metrics:
        with metrics[-1].open() as f:
            rows = list(csv.DictReader(f))
        ttft = sorted(float(r["prefill_e2e_time"]) * 1e3 for r in rows)
        e2e = sorted(float(r["request_e2e_time"]) * 1e3 for r in rows)
        figures |= {
            "completed": len(rows),
            "mean_ttft_ms": statistics.fmean(ttft),
            "p99_ttft_ms": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
            "mean_e2e_ms": statistics.fmean(e2e),
            "p99_e2e_ms": e2e[min(len(e2e) - 1, int(0.99 * len(e2e)))],
        }
    figures["written_mb"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6
    return figures


def become_subreaper() -> None:
    """Adopt orphaned descendants (Linux): a child's workers that outlive it (joblib's) are
    then reaped here and their CPU counted."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def reap_orphans(timeout: float = 60.0) -> float:
    """CPU seconds of the adopted descendants that exit within `timeout`."""
    cpu, deadline = 0.0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
            continue
        cpu += usage.ru_utime + usage.ru_stime
    return cpu


def child(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[dict[str, Any], str] | None:
    """CPU, wall and peak memory of `argv` and its output (None if it fails)."""
    with tempfile.TemporaryFile("w+") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        orphans = reap_orphans()
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read()
    if proc.returncode != 0:
        sys.stderr.write(f"failed ({proc.returncode}): {shlex.join(argv)}\n{output[-3000:]}\n")
        return None
    figures = {
        "cpu_s": usage.ru_utime + usage.ru_stime + orphans,
        "orphans_cpu_s": orphans,
        "wall_s": wall,
        "peak_mib": usage.ru_maxrss / 1024,  # KiB on Linux; the child's own peak
    }
    return figures, output


def measure(
    case: str, setup: Setup, args: argparse.Namespace, cache: Path
) -> dict[str, Any] | None:
    base = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    if case.startswith("llmsim"):
        env = {**base, "PYTHONPATH": str(ROOT)}
        argv = llmsim_cli_argv(setup)
        if case == "llmsim":
            argv = [sys.executable, __file__, "--case", "llmsim", *setup_argv(args)]
        done = child(argv, ROOT, env)
        if done is None:
            return None
        figures, output = done
        if case == "llmsim":
            return figures | json.loads(output.strip().splitlines()[-1])
        start = output.find("{")
        summary = json.loads(output[start:]) if start >= 0 else {}
        summary = summary.get("summary", summary)
        return figures | (headline_llmsim(summary) if "duration" in summary else {})
    env = {**base, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    out = Path(tempfile.mkdtemp(prefix="vidur-bench-"))
    extra = shlex.split(args.vidur_extra or "")
    try:
        argv = vidur_argv(args.vidur_python, setup, case, out / "out", cache, extra)
        done = child(argv, args.vidur_dir, env)
        if done is None:
            return None
        figures, output = done
        return figures | headline_vidur(out, output)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def setup_argv(args: argparse.Namespace) -> list[str]:
    """The flags that fix the workload, for the llmsim child."""
    return [
        "--requests", str(args.requests), "--input-len", str(args.input_len),
        "--output-len", str(args.output_len), "--rate", str(args.rate),
        "--max-num-seqs", str(args.max_num_seqs), "--chunk", str(args.chunk),
        "--model", args.model, "--hardware", args.hardware,
    ]  # fmt: skip


def vidur_version(python: str) -> str:
    code = "import importlib.metadata as m; print(m.version('vidur'))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(figures: dict[str, dict[str, Any] | None], host: dict[str, Any], info: str) -> None:
    print(machine_line(host, info))
    print()
    ref = figures.get("llmsim")
    print("| case | CPU (s) | wall (s) | peak (MiB) | CPU / llmsim | peak / llmsim | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, f in figures.items():
        if f is None:
            print(f"| {name} | n/a | n/a | n/a | - | - | failed |")
            continue
        cpu_ratio = f["cpu_s"] / ref["cpu_s"] if ref else None
        mem_ratio = f["peak_mib"] / ref["peak_mib"] if ref else None
        note = ("trained (first run)" if f.get("trained") else "cached") if "trained" in f else ""
        if "inner_cpu_s" in f:
            note = f"`runner.run` {f['inner_cpu_s']:.2f} s CPU"
        print(
            f"| {name} | {f['cpu_s']:.2f} | {f['wall_s']:.2f} | {f['peak_mib']:,.0f} | "
            f"{fmt(cpu_ratio, '.1f')} | {fmt(mem_ratio, '.1f')} | {note} |"
        )
    print()
    print(
        "| case | completed | simulated (s) | req/s | mean TTFT (ms) | p99 TTFT (ms) | "
        "mean E2E (ms) | p99 E2E (ms) | steps |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, f in figures.items():
        if f is None or "sim_duration_s" not in f:
            continue
        duration, done = f["sim_duration_s"], f.get("completed")
        print(
            f"| {name} | {fmt(done, ',')} | {duration:.1f} | "
            f"{fmt(done / duration if done else None, '.2f')} | "
            f"{fmt(f.get('mean_ttft_ms'), '.1f')} | {fmt(f.get('p99_ttft_ms'), '.1f')} | "
            f"{fmt(f.get('mean_e2e_ms'), '.0f')} | {fmt(f.get('p99_e2e_ms'), '.0f')} | "
            f"{fmt(f.get('steps'), ',')} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vidur-python", help="the Python of a venv with `vidur` installed")
    parser.add_argument("--vidur-dir", type=Path, help="holds data/profiling; Vidur's cwd")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rate", type=float, default=10.0, help="Poisson arrivals, requests/s")
    parser.add_argument("--max-num-seqs", type=int, default=128, help="batch size cap")
    parser.add_argument("--chunk", type=int, default=512, help="tokens per step (chunked)")
    parser.add_argument("--model", default="llama-3.1-8b", help="llmsim model id")
    parser.add_argument("--hardware", default="a100_sxm_80gb", help="llmsim hardware id")
    parser.add_argument("--vidur-model", default="meta-llama/Llama-3-8B")
    parser.add_argument("--vidur-profile-model", default="meta-llama/Meta-Llama-3-8B")
    parser.add_argument("--vidur-device", default="a100")
    parser.add_argument("--vidur-network-device", default="a100_dgx")
    parser.add_argument("--vidur-extra", help='more vidur.main flags, one string: "--a 1 --b 2"')
    parser.add_argument("--repeat", type=int, default=1, help="runs per case")
    parser.add_argument("--cases", default="llmsim,llmsim-cli,vidur,vidur-sim-only")
    parser.add_argument("--first-run", action="store_true", help="also Vidur on an empty cache")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # the llmsim child
    args = parser.parse_args()
    setup = Setup(
        requests=args.requests,
        input_len=args.input_len,
        output_len=args.output_len,
        rate=args.rate,
        max_num_seqs=args.max_num_seqs,
        chunk=args.chunk,
        model=args.model,
        hardware=args.hardware,
        vidur_model=args.vidur_model,
        vidur_profile_model=args.vidur_profile_model,
        vidur_device=args.vidur_device,
        vidur_network_device=args.vidur_network_device,
    )
    if args.case:
        print(json.dumps(llmsim_case(setup)))
        return
    cases = args.cases.split(",")
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; known: {', '.join(CASES)}")
    wants_vidur = args.first_run or any(c.startswith("vidur") for c in cases)
    if wants_vidur and not (args.vidur_python and args.vidur_dir):
        parser.error("the vidur cases need --vidur-python and --vidur-dir")
    cache = Path()
    if wants_vidur:
        args.vidur_dir = args.vidur_dir.resolve()
        cache = args.vidur_dir / ".vidur_cache"
        prepare_cache(args.vidur_dir, cache, setup)
    become_subreaper()
    host = machine()
    figures: dict[str, dict[str, Any] | None] = {}
    if args.first_run:  # on a fresh cache, whose models and tables then warm DIR's
        fresh = Path(tempfile.mkdtemp(prefix="vidur-cache-"))
        try:
            prepare_cache(args.vidur_dir, fresh, setup)
            figures["vidur-first"] = measure("vidur-first", setup, args, fresh)
            shutil.copytree(fresh, cache, dirs_exist_ok=True)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
    elif wants_vidur and not (cache / "predictions").is_dir():  # warm a cold cache unmeasured
        warm = measure("vidur-sim-only", setup, args, cache)
        if warm and warm.get("trained"):
            print(f"(warm-up: Vidur trained its models in {warm['wall_s']:.0f} s)", file=sys.stderr)
    runs: dict[str, list[dict[str, Any] | None]] = {}
    for _ in range(args.repeat):
        for name in cases:  # interleaved: the machine's noise falls on each alike
            runs.setdefault(name, []).append(measure(name, setup, args, cache))
    figures |= {name: least(results) for name, results in runs.items()}
    if "llmsim" in figures:  # the reference first
        figures = {"llmsim": figures.pop("llmsim"), **figures}
    host["load_average_after"] = os.getloadavg()
    version = vidur_version(args.vidur_python) if wants_vidur else "-"
    info = (
        f"vidur {version}; {setup.requests:,} requests of {setup.input_len} + "
        f"{setup.output_len} tokens, Poisson {setup.rate:g}/s (Vidur's qps; llmsim "
        f"{llmsim_rate(setup):.3f}/s, its mean); llmsim {setup.model} on "
        f"{setup.hardware}, vidur {setup.vidur_model} on {setup.vidur_device}; "
        f"least CPU of {args.repeat}"
    )
    if args.json:
        print(json.dumps({"machine": host, "setup": info, "figures": figures}, indent=2))
        return
    report(figures, host, info)


if __name__ == "__main__":
    main()
