"""Writing a run's tables as CSV: kvbench's numeric writer against pandas' ``to_csv``, on the same
tables, in the same process, with identical output.

    python benchmarks/csv_writing.py                       # every request of the trace, 3 pairs
    python benchmarks/csv_writing.py --requests 5000 --pairs 5

One run of kvbench (``workload=azure_conv``: the packaged Azure LLM 2023 conversation trace with its
own arrival times, its first ``--requests`` requests; all of them, 17,754 of its 19,366 rows, by
default) makes the steps and request tables a long run writes. Each table is then written
``--pairs`` times by each writer, in turn (pandas first in even pairs, kvbench first in odd ones),
into a scratch folder; the statistic is the median over the pairs of pandas' time / kvbench's time. Both files of every pair must be byte-identical, or the script says so and
exits 1: a faster writer of other bytes would not be a speed-up. Writes ``<out>/csv_writing.json``
and ``<out>/csv_writing.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from report_files import check_report, report_header, write_report

from kvbench.api import run
from kvbench.errors import ConfigError
from kvbench.io.atomic import write_csv


def timed(write, path: Path) -> float:
    start_s = time.perf_counter()
    write(path)
    return time.perf_counter() - start_s


def measure(frame, pairs: int, scratch: Path) -> dict:
    """Both writers on ``frame``, ``pairs`` times each, alternating who goes first."""
    pandas_path, kvbench_path = scratch / "pandas.csv", scratch / "kvbench.csv"
    writers = {
        "pandas": (lambda path: frame.to_csv(path, index=False), pandas_path),
        "kvbench": (lambda path: write_csv(frame, path), kvbench_path),
    }
    times_s: dict[str, list[float]] = {"pandas": [], "kvbench": []}
    for pair in range(pairs):
        for name in ("pandas", "kvbench") if pair % 2 == 0 else ("kvbench", "pandas"):
            write, path = writers[name]
            times_s[name].append(timed(write, path))
        if pandas_path.read_bytes() != kvbench_path.read_bytes():
            raise SystemExit("error: kvbench's CSV differs from pandas' for the same table")
    return {
        "rows": len(frame),
        "columns": frame.shape[1],
        "csv_bytes": kvbench_path.stat().st_size,
        "pandas_s": statistics.median(times_s["pandas"]),
        "kvbench_s": statistics.median(times_s["kvbench"]),
        "speedup": statistics.median(p / k for p, k in zip(times_s["pandas"], times_s["kvbench"])),
    }


def markdown(report: dict) -> str:
    lines = [
        "# Writing a run's tables as CSV",
        "",
        f"Measured {report['measured_utc']} with `{report['command']}` on {report['machine']}: "
        f"the tables of one run of {report['requests']:,} Azure conversation requests, each written "
        f"{report['pairs']} times by each writer in turn; medians. Both files were byte-identical every time.",
        "",
        "| table | rows x columns | CSV MB | pandas to_csv s | kvbench s | speed-up (median of pairs) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in report["tables"].items():
        lines.append(
            f"| {name} | {row['rows']:,} x {row['columns']} | {row['csv_bytes'] / 1e6:.1f} | "
            f"{row['pandas_s']:.2f} | {row['kvbench_s']:.2f} | {row['speedup']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=None, help="the trace's first N requests (default: all)")
    parser.add_argument("--pairs", type=int, default=3, help="timed pairs per table (default 3)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    if (args.requests is not None and args.requests < 1) or args.pairs < 1:
        print("error: --requests and --pairs must be at least 1", file=sys.stderr)
        return 2
    check_report("csv_writing", args.out, ["csv_writing.json", "csv_writing.md"])
    overrides = ["workload=azure_conv", "progress=false", "wandb.mode=disabled", "output.write=false"]
    if args.requests is not None:
        overrides.append(f"workload.num_requests={args.requests}")
    print("running kvbench to make the tables...", file=sys.stderr)
    try:
        result = run(overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tables = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, frame in (("steps", result.steps), ("requests", result.requests)):
            tables[name] = measure(frame, args.pairs, Path(scratch))
            print(f"{name}: {tables[name]['speedup']:.2f}x", file=sys.stderr)
    report = {
        **report_header("csv_writing.py", argv),
        "requests": len(result.requests),
        "pairs": args.pairs,
        "tables": tables,
    }
    write_report(
        "csv_writing",
        args.out,
        {"csv_writing.json": json.dumps(report, indent=2) + "\n", "csv_writing.md": markdown(report)},
    )
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
