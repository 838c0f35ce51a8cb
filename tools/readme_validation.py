"""Write `llmsim validate`'s figures into README.md and docs/validation.md.

The README's validation headline and the per-device table of docs/validation.md are generated
from `llmsim validate --check --json`, never typed, so they cannot drift from what the
simulator predicts. Each lives between its own pair of markers:

    README.md             <!-- validation:begin -->            ... <!-- validation:end -->
    docs/validation.md    <!-- validation-by-device:begin -->  ... <!-- validation-by-device:end -->

    python tools/readme_validation.py              # run validate (~1-2 min) and rewrite both
    python tools/readme_validation.py --check      # exit 1, with a diff, when either differs
    python tools/readme_validation.py --from FILE  # read a saved `validate --json` output

The validation runs as `python -m simulator validate` in a subprocess, so this script reads
only the command's JSON contract, not the package's modules. With `--check` added to that
command the JSON also carries each suite's goal and CI ceiling, which the per-device table
shows; a saved output without them shows "-" there.
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
VALIDATION_DOC = ROOT / "docs" / "validation.md"
HEADLINE = "validation"
BY_DEVICE = "validation-by-device"
FIT_SUFFIX = "_fit"


def run_validate() -> dict[str, Any]:
    """`llmsim validate --check --json`, parsed. Exit 1 only means a suite is above its CI
    ceiling; the figures are printed either way."""
    cmd = [sys.executable, "-m", "simulator", "validate", "--check", "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    try:
        summary: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        sys.exit(f"{' '.join(cmd[1:])} printed no JSON (exit {proc.returncode}):\n{proc.stderr}")
    return summary


def parts(suites: dict[str, Any], name: str) -> list[str]:
    """The suites named `name` + "_..." that are not fits: a union's candidate parts."""
    return [s for s in suites if s.startswith(name + "_") and not s.endswith(FIT_SUFFIX)]


def unions(suites: dict[str, Any]) -> set[str]:
    """Suites whose rows are other suites' rows: `iteration` holds `iteration_prefill` and
    `iteration_decode` (its parts share its name as a prefix and add up to its count)."""
    return {
        name
        for name, entry in suites.items()
        if len(parts(suites, name)) > 1
        and sum(suites[p]["n"] for p in parts(suites, name)) == entry["n"]
    }


def pct(value: float) -> str:
    return f"{value:.1f}%"


def headline(summary: dict[str, Any]) -> str:
    """The README block: one line of headline figures and one row per suite."""
    suites = summary["suites"]
    skip = unions(suites)
    rows = {name: entry for name, entry in suites.items() if name not in skip}
    total = sum(entry["n"] for entry in rows.values())
    held_out = [name for name, entry in rows.items() if not entry["fitted"]]
    end_to_end = [f"`{name}` {pct(suites[name]['mape_pct'])}" for name in held_out if "e2e" in name]
    lines = [
        f"{total:,} predictions against measurements in {len(rows)} suites "
        f"({len(rows) - len(held_out)} fitted, {len(held_out)} held out). "
        f"Held-out end-to-end MAPE: {', '.join(end_to_end)}.",
        "",
        "| suite | cases | MAPE | median APE | rows are |",
        "|---|---:|---:|---:|---|",
    ]
    for name, entry in rows.items():
        lines.append(
            f"| `{name}` | {entry['n']:,} | {pct(entry['mape_pct'])} "
            f"| {pct(entry['median_ape_pct'])} | {'fitted' if entry['fitted'] else 'held out'} |"
        )
    if skip:
        lines += ["", f"Not listed: {_union_note(suites, skip)}."]
    e2e = summary.get("end_to_end")
    if e2e:
        lines += [
            "",
            f"All {e2e['n']} held-out end-to-end rows together: signed median error "
            f"{e2e['signed_median_pct']:+.1f}% (negative: predicted faster or cheaper than "
            f"measured), {pct(e2e['optimistic_pct'])} of rows on that side, "
            f"{pct(e2e['within_25_pct'])} within 25%.",
        ]
    return "\n".join(lines)


def _union_note(suites: dict[str, Any], skip: set[str]) -> str:
    return "; ".join(
        f"`{name}`, the union of {' and '.join(f'`{p}`' for p in parts(suites, name))}"
        for name in sorted(skip)
    )


def by_device(summary: dict[str, Any]) -> str:
    """The docs/validation.md block: every suite by device, with its goal and CI ceiling."""
    suites = summary["suites"]
    skip = unions(suites)
    limits = _limits(summary.get("check", {}).get("rows", []))
    lines = [
        "| suite | device | n | MAPE % | median % | p90 % | worst % | rows are | goal (MAPE %) "
        "| CI ceiling (MAPE %) |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for name, entry in suites.items():
        if name in skip:
            continue
        for device, stats in entry["by_device"].items():
            goal, ceiling = (
                _limit(
                    limits.get((name, device, "mape_pct", kind)),
                    limits.get((name, device, "median_ape_pct", kind)),
                )
                for kind in ("goal", "ceiling")
            )
            lines.append(
                f"| `{name}` | {device} | {stats['n']:,} | {stats['mape_pct']:.1f} "
                f"| {stats['median_ape_pct']:.1f} | {stats['p90_ape_pct']:.1f} "
                f"| {stats['worst_ape_pct']:.0f} | {'fitted' if entry['fitted'] else 'held out'} "
                f"| {goal} | {ceiling} |"
            )
    return "\n".join(lines)


def _limits(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], float]:
    out = {}
    for row in rows:
        for kind in ("goal", "ceiling"):
            if row.get(kind) is not None:
                out[(row["suite"], row["device"], row["stat"], kind)] = float(row[kind])
    return out


def _limit(mape: float | None, median: float | None) -> str:
    text = "-" if mape is None else f"{mape:g}"
    return text if median is None else f"{text} (median {median:g})"


def replace_block(text: str, marker: str, body: str, *, where: Path) -> str:
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        sys.exit(f"{where.relative_to(ROOT)}: no {begin} ... {end} block")
    return f"{head}{begin}\n{body}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write llmsim validate's figures into the docs.")
    parser.add_argument("--check", action="store_true", help="exit 1 when a block differs")
    parser.add_argument(
        "--from", dest="source", type=Path, help="a saved `llmsim validate --json` output"
    )
    args = parser.parse_args(argv)
    summary = json.loads(args.source.read_text()) if args.source else run_validate()
    blocks = {
        README: (HEADLINE, headline(summary)),
        VALIDATION_DOC: (BY_DEVICE, by_device(summary)),
    }
    stale = False
    for path, (marker, body) in blocks.items():
        old = path.read_text()
        new = replace_block(old, marker, body, where=path)
        if new == old:
            continue
        name = str(path.relative_to(ROOT))
        if args.check:
            stale = True
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    f"{name} (committed)",
                    f"{name} (llmsim validate now)",
                )
            )
        else:
            path.write_text(new)
            print(f"rewrote {name}")
    if stale:
        print("stale validation figures: run python tools/readme_validation.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
