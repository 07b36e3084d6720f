"""compare.png: each job's relative change per metric that moved, bars beyond tolerance in red."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.atomic import write_file
from kvbench.compare.diff import FAILING
from kvbench.output.figures import pyplot

COLORS = {"beyond": "#d62728", "missing": "#d62728", "within": "#7f7f7f", "new": "#1f77b4", "ignored": "#c7c7c7"}
MAX_METRICS_PER_JOB = 40  #: keeps the figure readable; the CSV has every row


def _plotted(frame: pd.DataFrame) -> pd.DataFrame:
    moved = frame[frame["verdict"] != "same"]
    # failures first, so the cap never hides one
    order = moved.assign(_fail=moved["verdict"].isin(FAILING)).sort_values("_fail", ascending=False, kind="stable")
    return order.groupby("job", sort=False).head(MAX_METRICS_PER_JOB).drop(columns="_fail")


def plot_changes(frame: pd.DataFrame, path: Path) -> Path:
    """One panel per job with a moved metric; a one-line figure saying so when nothing moved."""
    plt = pyplot()
    rows = _plotted(frame)
    jobs = list(dict.fromkeys(rows["job"]))
    if not jobs:
        fig, ax = plt.subplots(figsize=(6, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, f"no metric differs ({frame['job'].nunique()} job(s) compared)", ha="center", va="center")
    else:
        heights = [max(1, (rows["job"] == job).sum()) for job in jobs]
        fig, axes = plt.subplots(
            len(jobs),
            1,
            figsize=(9, 1.0 + 0.28 * sum(heights) + 0.6 * len(jobs)),
            gridspec_kw={"height_ratios": heights},
            squeeze=False,
        )
        for ax, job in zip(axes[:, 0], jobs):
            _panel(ax, rows[rows["job"] == job], job)
    fig.suptitle("kvbench compare: relative change HEAD vs BASE (red: beyond tolerance)", fontsize=10)
    fig.tight_layout()
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def _panel(ax, rows: pd.DataFrame, job: str) -> None:
    rel_pct = rows["change_rel"].astype(float).to_numpy() * 100
    finite = rel_pct[np.isfinite(rel_pct)]
    # a change from zero (inf) or a metric only one side has (nan) is drawn at the panel's edge
    edge = max(float(np.abs(finite).max()) if finite.size else 0.0, 1.0) * 1.15
    shown = np.where(np.isfinite(rel_pct), rel_pct, np.where(np.isnan(rel_pct), 0.0, np.sign(rel_pct) * edge))
    y = np.arange(len(rows))
    ax.barh(y, shown, color=[COLORS.get(v, "#7f7f7f") for v in rows["verdict"]])
    for yi, value, verdict in zip(y, rel_pct, rows["verdict"]):
        label = verdict if verdict in ("new", "missing") else ("from 0" if math.isinf(value) else f"{value:+.3g}%")
        failing = verdict in FAILING
        # a failing change can be far too small to see as a bar: its label says it in red
        ax.text(
            0,
            yi,
            f" {label}{' beyond tolerance' if verdict == 'beyond' else ''}",
            va="center",
            fontsize=7,
            color=COLORS["beyond"] if failing else "black",
            fontweight="bold" if failing else "normal",
        )
    ax.set_yticks(y)
    ax.set_yticklabels(rows["metric"], fontsize=7)
    for tick, verdict in zip(ax.get_yticklabels(), rows["verdict"]):
        if verdict in FAILING:
            tick.set_color(COLORS["beyond"])
            tick.set_fontweight("bold")
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_xlim(-edge * 1.1, edge * 1.1)
    ax.set_xlabel("change (%)", fontsize=8)
    ax.set_title(job, fontsize=9, loc="left")
