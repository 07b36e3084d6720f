"""Peak memory of a kvbench run in two versions of kvbench, on identical requests, in alternating
runs: what a change did to the peak RSS goal of issue 22 (at most 200 MB for 100,000 requests
with the default outputs).

    python benchmarks/peak_memory.py                              # the working tree against HEAD
    python benchmarks/peak_memory.py --base 07887f0 --head HEAD --pairs 5 --scenario arxiv-poisson3-100k

Each side (``--base``, ``--head``: commits, or by default those ``speed_gate.py`` picks) runs the
scenario (``scale.py``'s, default ``azure-conv-1x-100k``: 100,000 requests of the Azure conversation trace)
as the ``kvbench`` command with its default outputs (Parquet and CSV tables, the figures), each run
a process of its own, measured alone (``child_process.py``: its own peak RSS, from ``wait4``).
The two sides take turns, the order alternating from pair to pair: what a process's peak counts of
a shared library depends on the pages other processes read before it (a run right after a fresh
install counts up to 30 MB more of pyarrow's library), so both sides share that drift. The report
gives each side's median and the median of the pairs' head / base ratios. Both sides must write
the same summary (steps, requests, simulated time), or the comparison is refused.

Exit status: 0 measured, 2 cannot compare (no git, an unknown commit, a failed run, different work)
or cannot write --out, 130 interrupted.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from child_process import measure
from loop_instructions import NotComparable, compile_tree
from main_exits import one_line_failures
from report_files import check_report, write_report
from scale import DEFAULT_OUTPUTS, SPECS
from side_by_side import kvbench_command
from source_trees import TreeError, child_env, export_pair
from speed_gate import add_revision_arguments, default_revisions, head_without_base
from speed_report import MB, PEAK_RSS_GOAL_MB

#: the summary's values both sides must agree on: the same work
WORK_KEYS = ("num_steps", "num_finished", "duration_s")
#: scenarios of this many requests and more are what the goal speaks of
GOAL_REQUESTS = 100_000


def run_once(tree: Path, overrides: list[str], run_dir: Path) -> dict:
    """One ``kvbench`` process of ``tree`` with its default outputs: its peak RSS, wall time and work."""
    argv = [*kvbench_command(), *overrides, *DEFAULT_OUTPUTS, f"hydra.run.dir={run_dir}"]
    try:
        run = measure(argv, env=child_env(tree)).check(f"kvbench in {tree.name}")
        with (run_dir / "summary.csv").open(newline="") as f:
            summary = next(csv.DictReader(f))
    except (RuntimeError, OSError, StopIteration) as exc:
        lines = str(exc).strip().splitlines() or [f"kvbench in {tree.name} wrote no summary"]
        raise NotComparable(" ".join(dict.fromkeys((lines[0], lines[-1])))) from None
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "peak_rss_bytes": run.peak_rss_bytes,
        "wall_s": run.wall_s,
        "work": [summary[key] for key in WORK_KEYS],
    }


def compare(base: Path, head: Path, overrides: list[str], pairs: int, work_dir: Path, progress=None) -> dict:
    """``pairs`` runs of each side, in turns (base first in even pairs, head first in odd ones)."""
    for tree in (base, head):
        compile_tree(tree)
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    for pair in range(pairs):
        for side in ("base", "head") if pair % 2 == 0 else ("head", "base"):
            row = run_once(base if side == "base" else head, overrides, work_dir / f"{side}-{pair}")
            runs[side].append(row)
            if progress is not None:
                progress(f"pair {pair + 1}/{pairs} {side}: {row['peak_rss_bytes'] / MB:.1f} MB, {row['wall_s']:.2f} s")
    works = {side: {tuple(r["work"]) for r in rows} for side, rows in runs.items()}
    if len(works["base"] | works["head"]) != 1:
        raise NotComparable(
            f"the two versions simulate different work ({', '.join(WORK_KEYS)}: base {sorted(works['base'])}, "
            f"head {sorted(works['head'])}); measure them again once the change is the base"
        )
    return runs


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Each side's medians and the median of the pairs' head / base ratios."""
    out = {
        side: {
            "peak_rss_mb": statistics.median(r["peak_rss_bytes"] / MB for r in rows),
            "peak_rss_mib": statistics.median(r["peak_rss_bytes"] / 2**20 for r in rows),
            "wall_s": statistics.median(r["wall_s"] for r in rows),
        }
        for side, rows in runs.items()
    }
    out["peak_ratio"] = statistics.median(
        h["peak_rss_bytes"] / b["peak_rss_bytes"] for b, h in zip(runs["base"], runs["head"])
    )
    out["wall_ratio"] = statistics.median(h["wall_s"] / b["wall_s"] for b, h in zip(runs["base"], runs["head"]))
    return out


def report(meta: dict, runs: dict[str, list[dict]], stats: dict) -> str:
    goal = (
        f" The goal (issue 22): at most {PEAK_RSS_GOAL_MB:g} MB at 100,000 requests with the default outputs."
        if meta["num_requests"] >= GOAL_REQUESTS
        else ""
    )
    lines = [
        "# Peak memory of a run: two versions of kvbench",
        "",
        f"Measured {meta['date']} with `{meta['command']}` on {meta['machine']}: {meta['scenario']}, "
        f"kvbench's default outputs (tables and figures), {meta['pairs']} pairs, the order alternating. "
        f"Base {meta['base']}, head {meta['head']}. MB = 10^6 bytes, MiB = 2^20.{goal}",
        "",
        "| side | peak RSS MB (median) | MiB | wall s (median) | each run's peak MB |",
        "|---|---:|---:|---:|---|",
    ]
    for side in ("base", "head"):
        each = ", ".join(f"{r['peak_rss_bytes'] / MB:.1f}" for r in runs[side])
        s = stats[side]
        lines.append(f"| {side} | {s['peak_rss_mb']:.1f} | {s['peak_rss_mib']:.1f} | {s['wall_s']:.2f} | {each} |")
    lines += [
        "",
        f"Head / base, the median of the pairs' ratios: peak RSS **{stats['peak_ratio']:.4f}**, "
        f"wall time {stats['wall_ratio']:.3f}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/peak_memory.py", description=__doc__.split("\n\n")[0])
    add_revision_arguments(parser)
    names = [spec.name for spec in SPECS]
    parser.add_argument(
        "--scenario",
        default="azure-conv-1x-100k",
        choices=names,
        help="scale.py's scenario (default azure-conv-1x-100k)",
    )
    parser.add_argument("--requests", type=int, help="replay this many of its requests (default: the scenario's)")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each side, in turns (default 3)")
    parser.add_argument("--out", type=Path, help="write peak_memory.{md,json} to this folder")
    args = parser.parse_args(argv)
    if head_without_base("peak memory", args):
        return 2
    if args.pairs < 1 or (args.requests is not None and args.requests < 1):
        print("peak memory: error: --pairs and --requests must be at least 1", file=sys.stderr)
        return 2
    if args.out is not None:
        check_report("peak memory", args.out, ["peak_memory.md", "peak_memory.json"])
    spec = next(spec for spec in SPECS if spec.name == args.scenario)
    num_requests = args.requests or spec.full
    with one_line_failures("peak memory", TreeError, NotComparable) as ending:
        base_rev, head_rev = (args.base, args.head) if args.base else default_revisions()
        with tempfile.TemporaryDirectory(prefix="kvbench-peak-memory-") as tmp:
            work = Path(tmp)
            scenario = spec.build(num_requests, work)
            base_tree, base_name, head_tree, head_name = export_pair(base_rev, head_rev, work / "trees")
            runs = compare(
                base_tree,
                head_tree,
                list(scenario.kvbench_overrides),
                args.pairs,
                work,
                progress=lambda m: print(f"  {m}", file=sys.stderr),
            )
    if ending.exit_status is not None:
        return ending.exit_status
    stats = summarize(runs)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python benchmarks/peak_memory.py " + " ".join(argv),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "scenario": f"{args.scenario}, {num_requests:,} request{'' if num_requests == 1 else 's'}",
        "num_requests": num_requests,
        "pairs": args.pairs,
        "base": base_name,
        "head": head_name,
    }
    text = report(meta, runs, stats)
    print(text, end="")
    if args.out is not None:
        data = json.dumps({**meta, "runs": runs, **stats}, indent=2) + "\n"
        write_report("peak memory", args.out, {"peak_memory.md": text, "peak_memory.json": data})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
