"""Speed and memory of the serving simulator: prints the table of docs/speed.md.

    python benchmarks/bench_serving.py [--synthetic N | --million] [--root DIR ...]
                                       [--sources] [--repeat K] [--cases NAME,...] [--json]
                                       [--write-doc docs/speed.md]

Cases (Llama-3.1-8B on H100s, vLLM profile, energy and summary included), each in a fresh
interpreter:
- `azure`: replay of the Azure 2023 conversation trace (19,366 requests, one hour) in process
  (the `runner.run` call, which the in-process target is about, and the whole process);
- `azure-cli`: the same through the CLI, `llmsim run scenarios/azure_conv_replay.yaml`,
  start-up included; `azure-cli-out`: with `--out DIR` (every table, CSV);
  `azure-cli-summary`: with `--out DIR --outputs summary`;
- `synthetic`: N synthetic requests at 40/s on 4 replicas (default 100,000; `--million` for
  1,000,000, which takes minutes).
Each figure is the child's CPU seconds (user + system), its wall seconds and its peak resident
memory (the kernel's ru_maxrss of that child); with `--repeat K`, of the run of least CPU of K
(the one the machine disturbed least). CPU and wall move with the machine's load; the peak
memory does not. `--root` measures checkouts side by side, their runs interleaved (a
before and an after: compare their ratios, the noise is shared); a case a checkout cannot run
(a flag it lacks) shows "n/a". `--sources` also runs each checkout with its serving engine's
sources in place of its compiled build (LLMSIM_PURE_PYTHON=1; simulator/native.py),
interleaved the same way: the compiled build's gain, measured in one run. Each in-process case
says which engine ran. `--write-doc FILE` (one checkout) rewrites the block between
`<!-- speed:begin -->` and `<!-- speed:end -->` in FILE with the table, the machine, its load
and the targets: docs/speed.md's current figures come from it (`make bench-doc`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "scenarios/azure_conv_replay.yaml"
CLI_CASES = {
    "azure-cli": [],
    "azure-cli-out": ["--out", "{out}"],
    "azure-cli-summary": ["--out", "{out}", "--outputs", "summary"],
}


def case(name: str, n: int) -> dict[str, Any]:
    """Run one in-process case here (this interpreter is the child) and describe it."""
    from simulator.runs import runner
    from simulator.specs.engine_args import EngineArgs
    from simulator.specs.workload import WorkloadSpec
    from simulator.workload.requests import RandomDataset

    scenario: Any = SCENARIO
    if name == "synthetic":
        workload = WorkloadSpec(
            dataset=RandomDataset(input_len=512, output_len=128, range_ratio=0.5),
            num_prompts=n,
            request_rate=40.0,
        )
        scenario = runner.bench_scenario(
            model="llama-3.1-8b",
            hardware="h100_sxm",
            workload=workload,
            engine_args=EngineArgs(data_parallel_size=4),
            router="least_outstanding",
        )
    cpu, wall = time.process_time(), time.perf_counter()
    result = runner.run(scenario)
    return {
        "inner_cpu_s": time.process_time() - cpu,
        "inner_wall_s": time.perf_counter() - wall,
        "requests": int(result.summary["completed"]),
        "steps": len(result.sim.steps),
        "mean_ttft_ms": result.summary["mean_ttft_ms"],
        "engine": engine_build(),
    }


def engine_build() -> str:
    """Which serving engine ran: "compiled", or "sources" and why (simulator/native.py;
    a checkout from before it runs the sources)."""
    try:
        from simulator import native
    except ImportError:
        return "sources"
    return native.status()


@dataclass(frozen=True)
class Checkout:
    """A checkout to measure, and whether its compiled engine is set aside (LLMSIM_PURE_PYTHON)."""

    root: Path
    pure: bool = False

    @property
    def label(self) -> str:
        return f"{self.root} (sources)" if self.pure else str(self.root)


def child(argv: list[str], checkout: Checkout) -> dict[str, Any] | None:
    """CPU, wall and peak memory of `argv` run on `checkout` (None if it fails)."""
    root = checkout.root
    env = {**os.environ, "PYTHONPATH": str(root), "OPENBLAS_NUM_THREADS": "1"}
    env.pop("LLMSIM_PURE_PYTHON", None)
    if checkout.pure:
        env["LLMSIM_PURE_PYTHON"] = "1"
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        return None
    figures = {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": time.perf_counter() - start,
        "peak_mib": usage.ru_maxrss / 1024,  # KiB on Linux
    }
    last = output.strip().splitlines()[-1] if output.strip() else ""
    if last.startswith("{"):
        figures |= json.loads(last)
    return figures


def measure(name: str, checkout: Checkout, n: int) -> dict[str, Any] | None:
    if name in CLI_CASES:
        out = Path(tempfile.mkdtemp(prefix="llmsim-bench-")) / "run"
        args = [a.replace("{out}", str(out)) for a in CLI_CASES[name]]
        figures = child([sys.executable, "-m", "simulator", "run", SCENARIO, *args], checkout)
        if figures is not None and out.exists():
            figures["written_mb"] = sum(p.stat().st_size for p in out.iterdir()) / 1e6
        shutil.rmtree(out.parent, ignore_errors=True)
        return figures
    return child([sys.executable, __file__, "--case", name, "--synthetic", str(n)], checkout)


def least(results: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The run of least CPU (None if any failed: the checkout cannot run the case)."""
    done = [r for r in results if r is not None]
    return min(done, key=lambda r: r["cpu_s"]) if len(done) == len(results) else None


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    return {
        "cpu_model": model or "unknown",
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def machine_line(host: dict[str, Any], tail: str) -> str:
    """One line of `machine()`'s figures with the load after the runs (`load_average_after`),
    then `tail`."""
    load = "/".join(f"{x:.2f}" for x in host["load_average"])
    after = "/".join(f"{x:.2f}" for x in host["load_average_after"])
    return (
        f"{host['date']}; {host['cpu_model']}, {host['cores']} cores; Python {host['python']}; "
        f"load average (1/5/15 min) {load} before, {after} after; {tail}"
    )


# The targets of each case (docs/speed.md): CPU seconds, peak MiB; None: no target.
TARGETS: dict[str, tuple[float | None, float | None]] = {
    "azure": (2.0, None),
    "azure-cli": (3.0, None),
    "synthetic-1000000": (120.0, 2000 / 1.048576),  # 2 GB
}
BEGIN, END = "<!-- speed:begin -->", "<!-- speed:end -->"


def doc_block(
    host: dict[str, Any], figures: dict[str, Any], labels: dict[str, str], n: int, repeat: int
) -> str:
    """The markdown of one checkout's figures, its machine and load, and the targets."""
    load = "/".join(f"{x:.2f}" for x in host["load_average"])
    after = "/".join(f"{x:.2f}" for x in host["load_average_after"])
    lines = [
        f"Written by `python benchmarks/bench_serving.py --write-doc docs/speed.md` "
        f"(`make bench-doc`) on {host['date']}: {host['cpu_model']}, {host['cores']} cores, "
        f"Python {host['python']}; load average (1/5/15 min) {load} before, {after} after; "
        f"each figure the run of least CPU of {repeat}.",
        "",
        "| what | CPU (s) | wall (s) | peak memory (MiB) | written (MB) | target |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, label, f in doc_rows(figures, labels):
        key = f"synthetic-{n}" if name == "synthetic" else name
        cpu, mib = TARGETS.get(key, (None, None))
        goal = ", ".join(
            t for t in (
                f"<= {cpu:g} s CPU" if cpu else "",
                f"< {mib * 1.048576:,.0f} MB" if mib else "",
            ) if t
        ) or "-"  # fmt: skip
        if f is None:
            lines.append(f"| {label} | n/a | n/a | n/a | - | {goal} |")
            continue
        met = "" if goal == "-" else (
            " (met)" if (cpu is None or f["cpu_s"] <= cpu) and (mib is None or f["peak_mib"] < mib)
            else " (not met)"
        )  # fmt: skip
        written = f"{f['written_mb']:.1f}" if "written_mb" in f else "-"
        lines.append(
            f"| {label} | {f['cpu_s']:.2f} | {f['wall_s']:.2f} | {f['peak_mib']:,.0f} | "
            f"{written} | {goal}{met} |"
        )
    for name in ("azure", "synthetic"):
        f = next(iter(figures[name].values())) if name in figures else None
        if f is not None and "steps" in f:
            lines.append(
                f"\n{labels[name]}: {f['requests']:,} requests, {f['steps']:,} steps; the "
                f"`runner.run` call {f['inner_cpu_s']:.2f} s of CPU, the whole process "
                f"{f['cpu_s']:.2f} s (the interpreter's start and the imports); serving engine: "
                f"{f.get('engine', 'sources')}."
            )
    return "\n".join(lines)


def doc_rows(
    figures: dict[str, Any], labels: dict[str, str]
) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(case, label, figures) of each row of the doc's table. The Azure case gives two: its
    `runner.run` call, which the in-process target is about (the CLI's row is the one with
    start-up included), and its whole process."""
    rows: list[tuple[str, str, dict[str, Any] | None]] = []
    for name, label in labels.items():
        f = next(iter(figures[name].values()))
        if name == "azure" and f is not None and "inner_cpu_s" in f:
            call = f | {"cpu_s": f["inner_cpu_s"], "wall_s": f["inner_wall_s"]}
            rows.append((name, f"{label}: the `runner.run` call", call))
            rows.append(("azure-process", "the same, the whole process (start-up included)", f))
            continue
        rows.append((name, label, f))
    return rows


def write_doc(path: Path, block: str) -> None:
    """Replace the text between BEGIN and END in `path` with `block`."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} block to write")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")


def cell(f: dict[str, Any] | None) -> str:
    if f is None:
        return "n/a"
    text = f"{f['cpu_s']:.2f} s CPU, {f['wall_s']:.2f} s wall, {f['peak_mib']:,.0f} MiB"
    if "written_mb" in f:
        text += f", {f['written_mb']:.1f} MB written"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", type=int, default=100_000)
    parser.add_argument("--million", action="store_true", help="1,000,000 synthetic requests")
    parser.add_argument("--root", type=Path, action="append", help="default: this checkout")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case and checkout")
    parser.add_argument("--cases", help="comma-separated cases (default all)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-doc", type=Path, help="rewrite the speed block of this file")
    parser.add_argument(
        "--sources",
        action="store_true",
        help="also run each checkout's sources (LLMSIM_PURE_PYTHON=1) beside its compiled engine",
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a child's one case
    args = parser.parse_args()
    if args.write_doc and ((args.root and len(args.root) > 1) or args.sources):
        parser.error("--write-doc measures one checkout")
    n = 1_000_000 if args.million else args.synthetic
    if args.case:
        print(json.dumps(case(args.case, n)))
        return
    checkouts = [
        Checkout(r.resolve(), pure)
        for r in args.root or [ROOT]
        for pure in ((False, True) if args.sources else (False,))
    ]
    host = machine()
    labels = {
        "azure": "Azure conversation hour (19,366 requests), in process",
        "azure-cli": "the same, `llmsim run` (start-up included)",
        "azure-cli-out": "the same, `llmsim run --out DIR` (all tables, CSV)",
        "azure-cli-summary": "the same, `--out DIR --outputs summary`",
        "synthetic": f"{n:,} synthetic requests at 40/s on 4 replicas, in process",
    }
    if args.cases:
        unknown = set(args.cases.split(",")) - set(labels)
        if unknown:
            parser.error(
                f"unknown case(s) {', '.join(sorted(unknown))}; known: {', '.join(labels)}"
            )
        labels = {k: v for k, v in labels.items() if k in args.cases.split(",")}
    runs: dict[str, dict[str, list[dict[str, Any] | None]]] = {}
    for _ in range(args.repeat):
        for name in labels:
            for checkout in checkouts:  # interleaved: the machine's noise falls on each alike
                runs.setdefault(name, {}).setdefault(checkout.label, []).append(
                    measure(name, checkout, n)
                )
    figures = {
        name: {root: least(results) for root, results in by_root.items()}
        for name, by_root in runs.items()
    }
    host["load_average_after"] = os.getloadavg()
    if args.write_doc:
        write_doc(args.write_doc, doc_block(host, figures, labels, n, args.repeat))
    if args.json:
        print(json.dumps({"machine": host, "figures": figures}, indent=2))
        return
    print(machine_line(host, f"least CPU of {args.repeat}"))
    print()
    heads = [c.label for c in checkouts]
    ratio = len(checkouts) == 2
    print("| what | " + " | ".join(heads) + (" | CPU ratio | memory ratio |" if ratio else " |"))
    print("|---" * (1 + len(checkouts) + (2 if ratio else 0)) + "|")
    for name, label in labels.items():
        row = [cell(figures[name][h]) for h in heads]
        if ratio:
            a, b = (figures[name][h] for h in heads)
            both = a is not None and b is not None
            row.append(f"{b['cpu_s'] / a['cpu_s']:.2f}" if both else "-")  # type: ignore[index]
            row.append(f"{b['peak_mib'] / a['peak_mib']:.2f}" if both else "-")  # type: ignore[index]
        print(f"| {label} | " + " | ".join(row) + " |")
    for name in ("azure", "synthetic"):
        for h in heads if name in figures else ():
            f = figures[name][h]
            if f is not None and "steps" in f:
                print(f"\n{labels[name]}: {f['requests']:,} requests, {f['steps']:,} steps")
                break
    for name in ("azure", "synthetic"):
        for h in heads if name in figures else ():
            f = figures[name][h]
            if f is not None and "inner_cpu_s" in f:
                print(
                    f"{h}: the `runner.run` call of the {name} case {f['inner_cpu_s']:.2f} s of "
                    f"CPU; serving engine: {f.get('engine', 'sources')}"
                )


if __name__ == "__main__":
    main()
