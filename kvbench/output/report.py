"""What a person reads at the end: a run's summary, or one table comparing a sweep's jobs."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from kvbench.metrics.display import METRIC_DEFINITIONS, format_summary
from kvbench.output.results import read_job

#: (column, header, format) of the sweep comparison table
COMPARISON_COLUMNS = (
    ("label", "job", "{}"),
    ("block_size_tokens", "block", "{:d}"),
    ("peak_concurrency", "peak seqs", "{:d}"),
    ("mean_concurrency_saturated", "mean seqs (sat.)", "{:.1f}"),
    ("utilization_saturated", "util. (sat.)", "{:.1%}"),
    ("frac_internal", "internal", "{:.1%}"),
    ("frac_external", "external", "{:.1%}"),
    ("throughput_tokens_per_s", "tok/s", "{:,.0f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("tpot_p50_s", "TPOT p50 s", "{:.4f}"),
    ("goodput_requests_per_s", "goodput req/s", "{:.2f}"),
    ("num_preemptions", "preempt.", "{:d}"),
    ("calibration", "calibration", "{}"),
)


def _fmt(fmt: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        if "d}" in fmt:
            value = int(value)
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def _console() -> Console:
    console = Console()
    # a pipe or a CI log is no terminal: rich would squeeze the table into 80 columns
    return console if console.is_terminal else Console(width=200)


def _varying_labels(jobs: pd.Series) -> list[str]:
    """Each job's overrides minus those every job shares: what the sweep varied."""
    parts = [str(j).split(",") for j in jobs]
    common = set.intersection(*map(set, parts)) if parts else set()
    return [",".join(p for p in job if p not in common) or "defaults" for job in parts]


def print_summary(summary: dict, out_dir: Path | None, console: Console | None = None) -> None:
    console = console or _console()
    table = Table(title=f"kvbench: {summary['allocator']} / {summary['kernel']} / {summary['workload']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for label, value in format_summary(summary):
        table.add_row(label, value)
    console.print(table)
    console.print(f"[dim]{METRIC_DEFINITIONS}[/dim]")
    if out_dir is not None:
        console.print(f"results: {out_dir}")


def comparison_frame(sweep_dir: Path) -> pd.DataFrame:
    """One row per job folder of a multirun (finished or failed), in job order."""
    rows = []
    for job_dir in sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
        row = read_job(job_dir)
        if row is not None:
            rows.append({"job_num": int(job_dir.name), **row})
    return pd.DataFrame(rows)


def print_comparison(sweep_dir: Path, console: Console | None = None) -> pd.DataFrame:
    """Print the sweep's comparison table and save it (Parquet, CSV, PNG) in the sweep folder."""
    console = console or _console()
    frame = comparison_frame(sweep_dir)
    if frame.empty:
        console.print(f"kvbench: no job results under {sweep_dir}")
        return frame
    if "failed" not in frame:
        frame["failed"] = False
    frame["failed"] = frame["failed"].fillna(False).astype(bool)
    frame["label"] = _varying_labels(frame["job"])
    table = Table(title=f"kvbench comparison ({len(frame)} jobs)")
    for _, header, _ in COMPARISON_COLUMNS:
        table.add_column(header, justify="left" if header in ("job", "calibration") else "right")
    for _, row in frame.iterrows():
        if row["failed"]:
            table.add_row(row["label"], *["[red]failed[/red]", *[""] * (len(COMPARISON_COLUMNS) - 2)])
        else:
            table.add_row(*[_fmt(fmt, row.get(col)) for col, _, fmt in COMPARISON_COLUMNS])
    console.print(table)
    for _, row in frame[frame["failed"]].iterrows():
        console.print(f"[red]failed[/red] {row['label']}: {row['error']}", highlight=False)
    console.print(f"[dim]{METRIC_DEFINITIONS}[/dim]")
    frame.to_parquet(sweep_dir / "comparison.parquet", index=False)
    frame.to_csv(sweep_dir / "comparison.csv", index=False)
    if (~frame["failed"]).any():
        from kvbench.output.figures import plot_comparison

        plot_comparison(frame, sweep_dir / "comparison.png")
    console.print(f"comparison: {sweep_dir / 'comparison.csv'}")
    return frame
