"""What a person reads at the end: a run's summary, or one table comparing a sweep's jobs."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from kvbench.metrics.display import METRIC_DEFINITIONS, format_summary
from kvbench.output.atomic import write_frame
from kvbench.output.results import read_job

#: (column, header, format) of the sweep comparison table, in groups; a group shows when its
#: test on the sweep's rows holds, so that a table stays narrow enough to read
_MEMORY = (
    ("block_size_tokens", "block", "{:d}"),
    ("peak_concurrency", "peak seqs", "{:d}"),
    ("min_concurrency_saturated", "floor (sat.)", "{:d}"),
    ("mean_concurrency_saturated", "seqs (sat.)", "{:.1f}"),
    ("utilization_mean", "util.", "{:.1%}"),
    ("utilization_saturated", "util. (sat.)", "{:.1%}"),
    ("frac_internal", "internal", "{:.1%}"),
    ("frac_external", "external", "{:.1%}"),
    ("mean_tail_waste_tokens_per_seq", "unfilled/seq", "{:,.1f}"),
)
_LATENCY = (
    ("throughput_tokens_per_s", "tok/s", "{:,.0f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("tpot_p50_s", "TPOT p50 s", "{:.4f}"),
    ("goodput_requests_per_s", "goodput/s", "{:.2f}"),
    ("num_preemptions", "preempt.", "{:d}"),
)
_PREEMPTION = (
    ("num_swap_preemptions", "by swap", "{:d}"),
    ("num_swap_fallbacks", "fallbacks", "{:d}"),
    ("preemption_cost_s", "preempt. s", "{:.2f}"),
    ("recompute_tax", "recomp. tax", "{:.1%}"),
)
COLUMN_GROUPS = (
    (_MEMORY, lambda rows: True),
    (_LATENCY, lambda rows: True),
    (_PREEMPTION, lambda rows: rows.get("num_preemptions", pd.Series(dtype=float)).fillna(0).gt(0).any()),
    ((("calibration", "calibration", "{}"),), lambda rows: True),
)


def comparison_columns(rows: pd.DataFrame) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """The comparison table's columns for these rows (the job, then every group whose test
    holds), split into those that differ between jobs and those every job shares (shown once)."""
    columns = [column for group, shown in COLUMN_GROUPS if shown(rows) for column in group]
    if len(rows) < 2:
        return [("label", "job", "{}"), *columns], []
    same = [(col, header, fmt) for col, header, fmt in columns
            if col in rows and len({_fmt(fmt, value) for value in rows[col]}) == 1]  # fmt: skip
    return [("label", "job", "{}"), *[c for c in columns if c not in same]], same


def no_effect_warnings(rows: pd.DataFrame) -> list[str]:
    """Lines that say when rows differ in something that cannot change a simulated number."""
    warnings = []
    if "kernel" in rows and rows["kernel"].nunique() > 1 and (rows.get("calibration") == "uncalibrated").all():
        kernels = " and ".join(f"kernel={k}" for k in sorted(rows["kernel"].unique()))
        hardware = ", ".join(sorted(rows["hardware"].astype(str).unique())) if "hardware" in rows else "this hardware"
        warnings.append(
            f"{kernels} run at the same simulated speed: no calibration for {hardware} "
            "(<hardware>/<kernel>.json in kvbench/calibrations/ or calibration_dir=<folder>, written by "
            "kvbench bench-kernels on a GPU)"
        )
    return warnings


def _fmt(fmt: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        if "d}" in fmt:
            value = int(value)
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def wide_console() -> Console:
    """The terminal's console, or a 240-column one where output goes to a pipe or a log."""
    console = Console()
    # a pipe or a CI log is no terminal: rich would squeeze the table into 80 columns
    return console if console.is_terminal else Console(width=240)


def _varying_labels(jobs: pd.Series) -> list[str]:
    """Each job's overrides minus those every job shares: what the sweep varied."""
    parts = [str(j).split(",") for j in jobs]
    common = set.intersection(*map(set, parts)) if parts else set()
    return [" ".join(p for p in job if p not in common) or "defaults" for job in parts]


def print_summary(summary: dict, out_dir: Path | None, console: Console | None = None) -> None:
    console = console or wide_console()
    title = " / ".join(str(summary[key]) for key in ("allocator", "kernel", "scheduler", "preemption", "workload"))
    table = Table(title=f"kvbench: {title}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for label, value in format_summary(summary):
        table.add_row(label, value)
    console.print(table)
    console.print(f"[dim]{METRIC_DEFINITIONS}[/dim]")
    if out_dir is not None:
        console.print(f"results: {out_dir}")


def comparison_frame(sweep_dir: Path) -> pd.DataFrame:
    """One row per job folder of a multirun (finished, failed or incomplete), in job order."""
    rows = []
    for job_dir in sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
        row = read_job(job_dir)
        if row is not None:
            rows.append({"job_num": int(job_dir.name), **row})
    return pd.DataFrame(rows)


def print_comparison(sweep_dir: Path, console: Console | None = None) -> pd.DataFrame:
    """Print the sweep's comparison table and save it (Parquet, CSV, PNG) in the sweep folder."""
    console = console or wide_console()
    frame = comparison_frame(sweep_dir)
    if frame.empty:
        console.print(f"kvbench: no job results under {sweep_dir}")
        return frame
    if "failed" not in frame:
        frame["failed"] = False
    frame["failed"] = frame["failed"].fillna(False).astype(bool)
    # failed (bad input) or incomplete (interrupted: never read); "ok" rows are finished results
    status = frame["status"] if "status" in frame else pd.Series(pd.NA, index=frame.index, dtype=object)
    frame["status"] = status.fillna(frame["failed"].map({True: "failed", False: "ok"}))
    frame["label"] = _varying_labels(frame["job"])
    columns, shared = comparison_columns(frame[~frame["failed"]])
    for warning in no_effect_warnings(frame[~frame["failed"]]):
        console.print(f"[bold yellow]{warning}[/bold yellow]", highlight=False)
    table = Table(title=f"kvbench comparison ({len(frame)} jobs)")
    # a long job label wraps between its overrides rather than losing its end
    widest = max((len(part) for label in frame["label"] for part in str(label).split()), default=3)
    for _, header, _ in columns:
        job = header == "job"
        table.add_column(header, justify="left" if header in ("job", "calibration") else "right",
                         overflow="fold" if job else "ellipsis", min_width=widest if job else None)  # fmt: skip
    for _, row in frame.iterrows():
        if row["failed"]:
            table.add_row(row["label"], *[f"[red]{row['status']}[/red]", *[""] * (len(columns) - 2)])
        else:
            table.add_row(*[_fmt(fmt, row.get(col)) for col, _, fmt in columns])
    console.print(table)
    if shared:
        first = frame[~frame["failed"]].iloc[0]
        console.print("same in every job: " + ", ".join(f"{header} {_fmt(fmt, first.get(col))}" for col, header, fmt in shared))
    for _, row in frame[frame["failed"]].iterrows():
        console.print(f"[red]{row['status']}[/red] {row['label']}: {row['error']}", highlight=False)
    console.print(f"[dim]{METRIC_DEFINITIONS}[/dim]")
    write_frame(frame, sweep_dir, "comparison")
    if (~frame["failed"]).any():
        from kvbench.output.figures import plot_comparison

        plot_comparison(frame, sweep_dir / "comparison.png")
    console.print(f"comparison: {sweep_dir / 'comparison.csv'}")
    return frame
