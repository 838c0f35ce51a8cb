"""CPU time of short `llmsim` commands, start-up included: what a user waits for at the prompt.

    python benchmarks/bench_startup.py [--repeat 7] [--json] [--root DIR ...]

Each command runs `--repeat` times in a fresh interpreter (`python -m simulator ...`, the
code of this checkout); the figure is the least user + system CPU of the child over the runs
(CPU, not wall time, so that a busy machine changes it little; the least run is the one the
machine disturbed least). `--root` names checkouts to measure side by side in one run (a
before and an after: compare their ratio, the machine's noise is shared). Targets:
`llmsim --help` <= 0.3 s, `llmsim op gemm` <= 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "llmsim --help": ["--help"],
    "llmsim op gemm": [
        *("op", "gemm", "--hardware", "h100_sxm"),
        *("--m", "4096", "--n", "4096", "--k", "4096", "--json"),
    ],
    "llmsim hardware list": ["hardware", "list"],
    "llmsim bench latency": [
        *("bench", "latency", "--hardware", "h100_sxm", "--model", "llama-3.1-8b", "--json"),
    ],
    "import simulator": None,
}


def child_cpu_s(argv: list[str], root: Path) -> float:
    """User + system CPU seconds of one run of `argv` on the checkout at `root`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env, cwd=root)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(repeat: int, roots: list[Path]) -> dict[str, dict[str, float]]:
    """{command: {root: least CPU seconds}}, the roots' runs interleaved."""
    runs: dict[str, dict[str, list[float]]] = {}
    commands = {**COMMANDS, "python -c pass": None}
    for _ in range(repeat):
        for name, args in commands.items():
            if name == "python -c pass":
                argv = [sys.executable, "-c", "pass"]
            elif args is None:
                argv = [sys.executable, "-c", "import simulator"]
            else:
                argv = [sys.executable, "-m", "simulator", *args]
            for root in roots:
                runs.setdefault(name, {}).setdefault(str(root), []).append(child_cpu_s(argv, root))
    return {name: {r: min(v) for r, v in by_root.items()} for name, by_root in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--root", type=Path, action="append", help="default: this checkout")
    args = parser.parse_args()
    roots = [r.resolve() for r in args.root or [ROOT]]
    figures = measure(args.repeat, roots)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    load = os.getloadavg()[0]
    print(f"least CPU of {args.repeat} runs (load average {load:.2f}, {os.cpu_count()} cores)")
    print(f"  {'':<24} " + " ".join(f"{str(r)[-18:]:>18}" for r in roots))
    for name, by_root in figures.items():
        print(f"  {name:<24} " + " ".join(f"{by_root[str(r)]:17.3f}s" for r in roots))


if __name__ == "__main__":
    main()
