"""Figures next to the numbers: a run's memory over time, a sweep's side-by-side bars."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.output.atomic import write_file

LEDGER = (
    ("token_bytes", "token states", "#2b8cbe"),
    ("reserved_future_bytes", "reserved (future tokens)", "#a6bddb"),
    ("internal_bytes", "internal fragmentation", "#e34a33"),
    ("external_bytes", "external fragmentation", "#fdbb84"),
    ("free_bytes", "free", "#f0f0f0"),
)
MAX_POINTS = 4000


def pyplot():
    """matplotlib's pyplot on the Agg backend (every kvbench figure goes to a file)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI or on a GPU box
    import matplotlib.pyplot as plt

    return plt


def plot_memory_timeline(steps: pd.DataFrame, summary: dict, path: Path) -> Path:
    """Stacked memory ledger (fraction of the KV budget) and batch size over simulated time."""
    plt = pyplot()
    if len(steps) > MAX_POINTS:  # keep the file small; the Parquet table has every step
        steps = steps.iloc[:: int(np.ceil(len(steps) / MAX_POINTS))]
    budget = float(summary["kv_budget_bytes"])
    t_s = steps["start_s"].to_numpy()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.stackplot(
        t_s,
        *[steps[col].to_numpy() / budget * 100 for col, _, _ in LEDGER],
        labels=[label for _, label, _ in LEDGER],
        colors=[color for _, _, color in LEDGER],
        step="post",
    )
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("% of KV budget")
    ax.set_ylim(0, 100)
    ax2 = ax.twinx()
    ax2.plot(t_s, steps["num_running"].to_numpy(), color="black", linewidth=1, label="batch size")
    ax2.set_ylabel("sequences in the batch")
    ax2.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.1, 1.0), fontsize=8)
    ax.set_title(
        f"{summary['model']} on {summary['hardware']}: {summary['allocator']} "
        f"(block {summary['block_size_tokens']}), {summary['workload']}"
    )
    fig.tight_layout()
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def plot_comparison(table: pd.DataFrame, path: Path) -> Path:
    """One bar chart per headline metric, one bar per job of a sweep."""
    plt = pyplot()
    ok = table[~table.get("failed", pd.Series(False, index=table.index)).fillna(False).astype(bool)]
    # (column, title with the unit the tables use, scale from the column's unit to it)
    metrics = [
        ("peak_concurrency", "peak concurrency (seqs)", 1),
        ("utilization_saturated", "KV utilization while saturated (%)", 100),
        ("throughput_tokens_per_s", "throughput (output tok/s)", 1),
        ("ttft_p50_s", "TTFT p50 (ms)", 1e3),
    ]
    if "num_preemptions" in ok and ok["num_preemptions"].fillna(0).gt(0).any():
        metrics += [("ttft_p99_s", "TTFT p99 (ms)", 1e3), ("preemption_cost_s", "preemption cost (s)", 1)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.8))
    for ax, (col, title, scale) in zip(axes, metrics):
        if col in ok:
            ax.bar(range(len(ok)), ok[col].astype(float).to_numpy() * scale, color="#2b8cbe")
        ax.set_xticks(range(len(ok)))
        ax.set_xticklabels(ok["label"] if "label" in ok else ok["job"], rotation=30, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path
