"""compare.png: what moved most, per job, in a figure read at a glance; bars beyond tolerance in red.

One panel per job (its label as the panel's title), one bar per metric that moved, named as the
table names it, the largest changes on top: failures first, then by the size of the relative
change. Every bar's change and verdict is written in a column right of the panels, never over a
bar, so a change too small to see as a bar still reads. All panels share one axis: linear, or
logarithmic beyond +-1 % where a change passes +-100 % (one large change would flatten the rest to
slivers). The figure stays one screen tall with 10-point text: at most :data:`MAX_JOBS` panels
(failing jobs first, then those whose largest change is largest, drawn in the table's order) of
at most :data:`MAX_BARS_PER_JOB` bars; what is left out is named as a count (the table and the CSV
have every row).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.compare.diff import FAILING
from kvbench.compare.report import metric_labels
from kvbench.io.atomic import write_file
from kvbench.output.figures import pyplot

COLORS = {"beyond": "#d62728", "missing": "#d62728", "within": "#7f7f7f", "new": "#1f77b4", "ignored": "#c7c7c7"}
LEGEND = {
    "beyond": "beyond tolerance",
    "missing": "missing in HEAD",
    "within": "within tolerance",
    "new": "new in HEAD",
    "ignored": "ignored (tolerance: ignore)",
}
MAX_JOBS = 3  #: panels drawn: the rest of the jobs that moved are named as a count
MAX_BARS_PER_JOB = 6  #: bars per panel, the largest changes: the rest are counted (compare.csv has them)
#: the largest change (%) a linear axis shows; past it the axis is logarithmic beyond +-LINEAR_PCT
SYMLOG_FROM_PCT, LINEAR_PCT = 100.0, 1.0
FONT_PT = 10.0  #: every label's size: read at a glance on a screen, as the table is
ROW_IN = 0.36  #: inches per bar: room for a FONT_PT label
WIDTH_IN = 11.0
DPI = 100
LABEL_CHARS = 46  #: a metric's name is shortened past this many characters (the tick labels' column)
TITLE_CHARS = 90  #: a job's label wraps past this many characters: the width of the panel under it


def _priority(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` most telling first: failures, then the largest relative change (a change from zero
    first of all, one that has no relative size last)."""
    size = rows["change_rel"].astype(float).abs().fillna(-1.0)
    return rows.assign(_fail=rows["verdict"].isin(FAILING), _size=size).sort_values(
        ["_fail", "_size"], ascending=False, kind="stable"
    )


def _plotted(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """The rows to draw, most telling first in each job, at most MAX_BARS_PER_JOB a job, and per
    job with more, a line saying how many of its moved metrics are left out."""
    moved = _priority(frame[frame["verdict"] != "same"])
    table_order = {job: i for i, job in enumerate(dict.fromkeys(frame["job"]))}
    drawn = moved.groupby("job", sort=False).head(MAX_BARS_PER_JOB)
    # jobs in the table's order, each one's rows most telling first (a stable sort keeps them so)
    drawn = drawn.sort_values("job", key=lambda jobs: jobs.map(table_order), kind="stable")
    left = moved.drop(drawn.index)
    notes = {}
    for job, rest in left.groupby("job", sort=False):
        failing = int(rest["_fail"].sum())
        which = f"{failing} failing" if failing else "all passing"
        notes[job] = f"and {len(rest)} more, {which}: see compare.csv"
    return drawn.drop(columns=["_fail", "_size"]), notes


def _jobs(rows: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(jobs drawn in the table's order, jobs left out): at most MAX_JOBS, failing jobs first, then
    those whose largest change is largest."""
    order = list(dict.fromkeys(rows["job"]))
    ranked = list(dict.fromkeys(_priority(rows)["job"]))
    taken = set(ranked[:MAX_JOBS])
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
        ax.text(
            0.5,
            0.5,
            f"no metric differs ({frame['job'].nunique()} job(s) compared)",
            ha="center",
            va="center",
            fontsize=FONT_PT,
        )
    else:
        fig = _panels(plt, rows[rows["job"].isin(jobs)], jobs, hidden_metrics, hidden_jobs, rows)
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format="png"))
    plt.close(fig)
    return path


def _panels(
    plt,
    rows: pd.DataFrame,
    jobs: list[str],
    hidden_metrics: dict[str, str],
    hidden_jobs: list[str],
    every: pd.DataFrame,
):
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    labels = {metric: how.label for metric, how in metric_labels(rows).items()}
    rel_pct = rows["change_rel"].astype(float).to_numpy() * 100
    low, high, logarithmic = _axis_limits(rel_pct)
    # a panel: its bars, a row saying how many metrics are left out, and room for the job's title
    heights = [(rows["job"] == job).sum() + (job in hidden_metrics) + 1.6 for job in jobs]
    fig, axes = plt.subplots(
        len(jobs),
        1,
        figsize=(WIDTH_IN, 1.6 + ROW_IN * sum(heights) + (0.3 if hidden_jobs else 0)),
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
    bottom = axes[-1, 0]
    scale = f"; logarithmic beyond +-{LINEAR_PCT:g} %" if logarithmic else ""
    bottom.set_xlabel(f"relative change, HEAD vs BASE (%{scale})", fontsize=FONT_PT)
    title = "kvbench compare: what moved most, per job"
    if hidden_jobs:
        left = every[every["job"].isin(hidden_jobs)]
        failing = left.loc[left["verdict"].isin(FAILING), "job"].nunique()
        which = f", {failing} of them failing" if failing else ", all passing"
        title += f"\n{len(hidden_jobs)} more job(s) with moved metrics not drawn{which}: see the table or compare.csv"
    # the colours of bars drawn; new and missing metrics have no bar, their text says so
    verdicts = [v for v in ("beyond", "within", "ignored") if v in set(rows["verdict"])]
    fig.suptitle(title, fontsize=FONT_PT + 1, x=0.01, ha="left")
    if verdicts:
        fig.legend(
            handles=[Patch(color=COLORS[v], label=LEGEND[v]) for v in verdicts],
            loc="outside upper right",
            ncol=len(verdicts),
            fontsize=FONT_PT,
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
            fontsize=FONT_PT,
            color=COLORS["beyond"] if failing else "black",
            fontweight="bold" if failing else "normal",
        )
    names = [_short(labels.get(m, m)) for m in rows["metric"]]
    ax.set_yticks(np.arange(len(rows) + (hidden is not None)))  # the note, if any, a row of its own
    ax.set_yticklabels([*names, hidden] if hidden else names, fontsize=FONT_PT)
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
    ax.tick_params(axis="x", labelsize=FONT_PT)
    ax.set_title(textwrap.fill(job, TITLE_CHARS), fontsize=FONT_PT, loc="left", fontweight="bold")
