"""compare.png: each job's relative change per metric that moved, bars beyond tolerance in red.

One panel per job (its label as the panel's title), one bar per metric that moved, named as the
table names it. Every bar's change and verdict is written in a column right of the panels, never
over a bar, so a change too small to see as a bar still reads. All panels share one axis: linear,
or logarithmic beyond +-1 % where a change passes +-100 % (one large change would flatten the
rest to slivers). The figure grows with the rows it draws; past :data:`MAX_METRICS_PER_JOB` a
job and past :data:`MAX_ROWS` in all, the rest is named as a count (the CSV has every row), and
failures are the last left out; what is drawn is in the table's order.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.atomic import write_file
from kvbench.compare.diff import FAILING
from kvbench.compare.report import metric_labels
from kvbench.output.figures import pyplot

COLORS = {"beyond": "#d62728", "missing": "#d62728", "within": "#7f7f7f", "new": "#1f77b4", "ignored": "#c7c7c7"}
LEGEND = {
    "beyond": "beyond tolerance",
    "missing": "missing in HEAD",
    "within": "within tolerance",
    "new": "new in HEAD",
    "ignored": "ignored (tolerance: ignore)",
}
MAX_METRICS_PER_JOB = 40  #: bars per panel; the CSV has every row
MAX_ROWS = 120  #: bars in the whole figure: past it the figure is taller than a reader scrolls
#: the largest change (%) a linear axis shows; past it the axis is logarithmic beyond +-LINEAR_PCT
SYMLOG_FROM_PCT, LINEAR_PCT = 100.0, 1.0
ROW_IN = 0.24  #: inches per bar: room for a 7.5 pt label
WIDTH_IN = 10.0
LABEL_CHARS = 46  #: a metric's name is shortened past this many characters (the tick labels' column)
TITLE_CHARS = 85  #: a job's label wraps past this many characters: the width of the panel under it


def _plotted(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """The rows to draw (failures first in each job, at most MAX_METRICS_PER_JOB of a job) and,
    per job with more, a line saying how many of its moved metrics are left out."""
    moved = frame[frame["verdict"] != "same"].assign(_fail=lambda rows: rows["verdict"].isin(FAILING))
    # failures first, so the cap never hides one before a passing metric; then back in the table's order
    order = moved.sort_values("_fail", ascending=False, kind="stable")
    drawn = order.groupby("job", sort=False).head(MAX_METRICS_PER_JOB).sort_index()
    left = moved.drop(drawn.index)
    notes = {}
    for job, rest in left.groupby("job", sort=False):
        failing = int(rest["_fail"].sum())
        which = f"{failing} failing" if failing else "all passing"
        notes[job] = f"and {len(rest)} more, {which}: see compare.csv"
    return drawn.drop(columns="_fail"), notes


def _jobs(rows: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(jobs drawn in the table's order, jobs left out): failing jobs are taken first, then the
    others, while the figure stays within MAX_ROWS bars (one job at least)."""
    order = list(dict.fromkeys(rows["job"]))
    failing = set(rows.loc[rows["verdict"].isin(FAILING), "job"])
    sizes = rows.groupby("job", sort=False).size()
    taken: set[str] = set()
    total = 0
    for job in sorted(order, key=lambda j: j not in failing):
        if taken and total + sizes[job] > MAX_ROWS:
            continue
        taken.add(job)
        total += int(sizes[job])
    return [j for j in order if j in taken], [j for j in order if j not in taken]


def _change_text(value: float, change: float, verdict: str) -> str:
    if verdict in ("new", "missing"):
        return LEGEND[verdict]
    if math.isinf(value):
        shown = f"{change:+.4g} from 0"  # no relative change from zero: the absolute one, as stored
    elif math.isnan(value):
        shown = "n/a"
    else:
        shown = f"{value:+.3g} %"
    return f"{shown}  {verdict}"


def _axis_limits(rel_pct: np.ndarray) -> tuple[float, float, bool]:
    """(left and right end of the axis in %, logarithmic beyond LINEAR_PCT?) for every drawn
    change: each side as far as its longest bar and a little more, so that a fall of at most
    -100 % is not drawn on an axis reaching -1000 %."""
    finite = rel_pct[np.isfinite(rel_pct)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    largest = max(-low, high)
    if largest > SYMLOG_FROM_PCT:
        # a third of a decade of room past the longest bar; at least the linear part on each side
        return min(low * 2.0, -LINEAR_PCT), max(high * 2.0, LINEAR_PCT), True
    room = largest if largest > 0 else 1.0
    # the side with no bar keeps a tenth of the other's room: the zero line never sits on the frame
    return min(low * 1.15, -0.1 * room), max(high * 1.15, 0.1 * room), False


def _short(label: str, chars: int = LABEL_CHARS) -> str:
    """``label`` in at most ``chars`` characters, its unit kept: the words are what gets shortened."""
    if len(label) <= chars:
        return label
    words, paren, unit = label.rpartition(" (")
    if not paren or chars - len(unit) - 2 < 18:  # a long unit: too few words would be left
        return textwrap.shorten(label, chars, placeholder="...")
    return textwrap.shorten(words, chars - len(unit) - 2, placeholder="...") + f" ({unit}"


def _percent(x: float, _pos=None) -> str:
    return "0" if x == 0 else f"{x:+g}%"


def plot_changes(frame: pd.DataFrame, path: Path) -> Path:
    """One panel per job with a moved metric; a one-line figure saying so when nothing moved."""
    plt = pyplot()
    rows, hidden_metrics = _plotted(frame)
    jobs, hidden_jobs = _jobs(rows) if len(rows) else ([], [])
    if not jobs:
        fig, ax = plt.subplots(figsize=(6, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, f"no metric differs ({frame['job'].nunique()} job(s) compared)", ha="center", va="center")
    else:
        fig = _panels(plt, rows[rows["job"].isin(jobs)], jobs, hidden_metrics, hidden_jobs)
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def _panels(plt, rows: pd.DataFrame, jobs: list[str], hidden_metrics: dict[str, str], hidden_jobs: list[str]):
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    labels = {metric: how.label for metric, how in metric_labels(rows).items()}
    rel_pct = rows["change_rel"].astype(float).to_numpy() * 100
    low, high, logarithmic = _axis_limits(rel_pct)
    # a panel: its bars, a row saying how many metrics are left out, and room for the job's title
    heights = [(rows["job"] == job).sum() + (job in hidden_metrics) + 1.4 for job in jobs]
    fig, axes = plt.subplots(
        len(jobs),
        1,
        figsize=(WIDTH_IN, 1.3 + ROW_IN * sum(heights) + (0.2 if hidden_jobs else 0)),
        height_ratios=heights,
        sharex=True,
        squeeze=False,
        layout="constrained",
    )
    for ax, job in zip(axes[:, 0], jobs):
        _panel(ax, rows[rows["job"] == job], job, labels, (low, high), hidden_metrics.get(job))
        if logarithmic:
            ax.set_xscale("symlog", linthresh=LINEAR_PCT, linscale=0.5)
        ax.set_xlim(low, high)
        ax.xaxis.set_major_formatter(FuncFormatter(_percent))
    top, bottom = axes[0, 0], axes[-1, 0]
    top.tick_params(axis="x", labeltop=True)  # the scale at both ends of a tall figure
    scale = f"; logarithmic beyond +-{LINEAR_PCT:g} %" if logarithmic else ""
    bottom.set_xlabel(f"relative change, HEAD vs BASE (%{scale})", fontsize=8)
    title = "kvbench compare: what moved, per job"
    if hidden_jobs:
        title += f"\n{len(hidden_jobs)} more job(s) with moved metrics not drawn, see compare.csv: " + textwrap.shorten(
            ", ".join(hidden_jobs), 80, placeholder="..."
        )
    # the colours of bars drawn; new and missing metrics have no bar, their text says so
    verdicts = [v for v in ("beyond", "within", "ignored") if v in set(rows["verdict"])]
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    if verdicts:
        fig.legend(
            handles=[Patch(color=COLORS[v], label=LEGEND[v]) for v in verdicts],
            loc="outside upper right",
            ncol=len(verdicts),
            fontsize=7.5,
            frameon=False,
        )
    return fig


def _panel(
    ax, rows: pd.DataFrame, job: str, labels: dict[str, str], limits: tuple[float, float], hidden: str | None
) -> None:
    rel_pct = rows["change_rel"].astype(float).to_numpy() * 100
    verdicts = list(rows["verdict"])
    # a change from zero (inf) is drawn to the axis' edge, hatched: its length is no measure
    edge = np.where(rel_pct < 0, limits[0], limits[1])
    shown = np.where(np.isfinite(rel_pct), rel_pct, np.where(np.isnan(rel_pct), 0.0, edge))
    y = np.arange(len(rows))
    bars = ax.barh(y, shown, height=0.7, color=[COLORS.get(v, "#7f7f7f") for v in verdicts])
    for bar, value in zip(bars, rel_pct):
        if math.isinf(value):
            bar.set_hatch("///")
            bar.set_edgecolor("white")
    for yi, value, change, verdict in zip(y, rel_pct, rows["change_abs"].astype(float), verdicts):
        failing = verdict in FAILING
        # right of the panel, not on the bars: a long bar never hides it, a tiny change still reads
        ax.annotate(
            _change_text(value, change, verdict),
            xy=(1, yi),
            xycoords=("axes fraction", "data"),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=7.5,
            color=COLORS["beyond"] if failing else "black",
            fontweight="bold" if failing else "normal",
        )
    names = [_short(labels.get(m, m)) for m in rows["metric"]]
    ax.set_yticks(np.arange(len(rows) + (hidden is not None)))  # the note, if any, a row of its own
    ax.set_yticklabels([*names, hidden] if hidden else names, fontsize=7.5)
    ticks = ax.get_yticklabels()
    for tick, verdict in zip(ticks, verdicts):
        if verdict in FAILING:
            tick.set_color(COLORS["beyond"])
            tick.set_fontweight("bold")
    if hidden:
        ticks[-1].set_style("italic")
    ax.set_ylim(len(ticks) - 0.5, -0.5)  # first row on top, no margin rows
    ax.axvline(0, color="black", linewidth=0.6)
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.tick_params(axis="x", labelsize=7.5)
    ax.set_title(textwrap.fill(job, TITLE_CHARS), fontsize=9, loc="left", fontweight="bold")
