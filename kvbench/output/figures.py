"""Figures next to the numbers: a run's memory over time, a sweep's side-by-side bars."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.io.atomic import write_file
from kvbench.io.table import ColumnTable, as_table
from kvbench.metrics.catalogue import ledger_parts, metric

if TYPE_CHECKING:
    import pandas as pd

    Table = ColumnTable | pd.DataFrame

#: how each ledger part is drawn (stacked in :data:`LEDGER_FIELDS` order): (field, legend, colour),
#: from the catalogue
LEDGER = tuple((f"{m.key.removeprefix('frac_')}_bytes", m.legend, m.colour) for m in ledger_parts())
MAX_POINTS = 4000
#: the ledger's parts drawn only where a run ever holds them (a prefix cache's, per-request state)
OPTIONAL_PARTS = ("cached_bytes", "state_bytes")
#: the step-table columns each figure draws (all a table streamed to its file is read back for)
TIMELINE_STEP_COLUMNS = ("start_s", "duration_s", "num_running", *LEDGER_FIELDS)
CACHE_STEP_COLUMNS = ("start_s", "duration_s", "cached_bytes")
#: the offline bounds drawn over the cumulative hit rate: (summary key, legend, line style)
_BOUNDS = tuple(
    (key, metric(key).legend, style)
    for key, style in (
        ("prefix_hit_rate_infinite", ":"),
        ("prefix_hit_rate_belady", "--"),
        ("prefix_hit_rate_lru_offline", "-."),
    )
)


def pyplot():
    """matplotlib's pyplot on the Agg backend (every kvbench figure goes to a file)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI or on a GPU box
    import matplotlib.pyplot as plt

    return plt


def agg_figure(**kwargs):
    """A matplotlib ``Figure(**kwargs)`` drawn by the Agg backend, made without pyplot: a run's
    figures are saved and closed at once, and pyplot's import and its figure manager would cost
    them time for nothing (the same pixels, the same file)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def ledger_stack(steps: Table) -> list[tuple[str, str, str]]:
    """The ledger parts to stack, bottom up: ``(column, label, colour)`` for each field of
    :data:`LEDGER_FIELDS` the step table has; the prefix cache's part only where it ever holds
    something (it is 0 throughout for allocators without a cache: no legend entry for nothing)."""
    drawn = {col: (label, color) for col, label, color in LEDGER}
    stack = []
    for col in LEDGER_FIELDS:
        if col not in steps or (col in OPTIONAL_PARTS and not (np.asarray(steps[col]) > 0).any()):
            continue
        label, color = drawn.get(col, (col.removesuffix("_bytes").replace("_", " "), "#bdbdbd"))
        stack.append((col, label, color))
    return stack


def thinning(num_rows: int) -> int:
    """Every how many rows of a step table the memory timeline draws: at most about
    :data:`MAX_POINTS` points, evenly spaced, keep the figure's file small (the Parquet table has
    every row)."""
    return int(np.ceil(num_rows / MAX_POINTS)) if num_rows > MAX_POINTS else 1


def _thinned(table: ColumnTable) -> ColumnTable:
    """Every :func:`thinning`-th row (a table already thinned stays as it is)."""
    return table.every(thinning(len(table)))


def _title(summary: dict) -> str:
    return (
        f"{summary['model']} on {summary['hardware']}: {summary['allocator']} "
        f"(block {summary['block_size_tokens']}), {summary['workload']}"
    )


def _budget_words(summary: dict) -> str:
    """``% of KV budget (62.5 GB)``: the axis' 100 % in bytes, so that a share reads as an amount."""
    from kvbench.metrics.display import format_bytes

    return f"% of KV budget ({format_bytes(float(summary['kv_budget_bytes']))})"


def _end_s(steps: Table) -> float:
    """When the last step ends (its start where the table has no durations)."""
    start_s = float(np.asarray(steps["start_s"])[-1])
    return start_s + (float(np.asarray(steps["duration_s"])[-1]) if "duration_s" in steps else 0.0)


def _held_to_end(steps: ColumnTable) -> ColumnTable:
    """``steps`` and one more row at the end of the last step, a copy of it: a step-wise curve then
    draws the last step for as long as it lasted instead of stopping where it starts."""
    held = ColumnTable({name: np.append(steps[name], steps[name][-1:]) for name in steps.columns})
    held["start_s"][-1] = _end_s(steps)
    return held


def plot_memory_timeline(steps: Table, summary: dict, path: Path) -> Path:
    """Stacked memory ledger (fraction of the KV budget) and batch size over simulated time."""
    steps = _held_to_end(_thinned(as_table(steps)))
    budget = float(summary["kv_budget_bytes"])
    t_s = np.asarray(steps["start_s"], dtype=float)
    stack = ledger_stack(steps)
    fig = agg_figure(figsize=(10, 4.8), layout="constrained")
    ax = fig.subplots()
    ax.stackplot(
        t_s,
        *[np.asarray(steps[col], dtype=float) / budget * 100 for col, _, _ in stack],
        labels=[label for _, label, _ in stack],
        colors=[color for _, _, color in stack],
        step="post",
    )
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(_budget_words(summary))
    ax.set_ylim(0, 100)
    if t_s[-1] > t_s[0]:  # no margins: the stack fills the budget from the first step to the last
        ax.set_xlim(t_s[0], t_s[-1])
    ax2 = ax.twinx()
    running = np.asarray(steps["num_running"], dtype=float)
    (line,) = ax2.step(t_s, running, where="post", color="black", linewidth=1, label="batch size (right axis)")
    ax2.set_ylabel("sequences in the batch")
    # headroom: a batch size at its peak for most of the run would otherwise run along the frame
    ax2.set_ylim(0, max(float(np.nanmax(running)) if len(running) else 0.0, 1.0) * 1.15)
    # the legend lists the stack top down, as it is drawn, then the line; a thin edge shows the
    # near-white "free" part on the legend's white
    from matplotlib.patches import Patch

    boxes = [Patch(facecolor=color, edgecolor="#9e9e9e", linewidth=0.5, label=label) for _, label, color in stack]
    handles = [line, *reversed(boxes)]
    # right of the batch-size axis: over the stack it would hide the memory it explains
    ax.legend(
        handles=handles,
        labels=[h.get_label() for h in handles],
        loc="upper left",
        bbox_to_anchor=(1.1, 1.0),
        fontsize=8,
    )
    ax.set_title(_title(summary))
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    return path


def cumulative_hit_rate(requests: Table) -> tuple[np.ndarray, np.ndarray]:
    """``(admission times (s), hit rate so far)``: after each admission, prompt tokens served from
    the prefix cache / prompt tokens, over the requests admitted until then. A request's hits are
    placed at its first admission (the request table keeps no time for a re-admission's), so the
    last value is the summary's ``prefix_hit_rate``."""
    requests = as_table(requests)
    admitted_s = np.asarray(requests["admitted_s"], dtype=float)
    admitted = np.flatnonzero(admitted_s >= 0)
    admitted = admitted[np.argsort(admitted_s[admitted], kind="stable")]
    cached = np.cumsum(np.asarray(requests["cached_prompt_tokens"], dtype=np.int64)[admitted])
    prompt = np.cumsum(np.asarray(requests["prompt_tokens"], dtype=np.int64)[admitted])
    with np.errstate(invalid="ignore", divide="ignore"):  # zero-token prompts so far: no rate yet
        rate = np.where(prompt > 0, cached / np.maximum(prompt, 1), np.nan)
    return admitted_s[admitted], rate


#: time bins of the cached-bytes panel: a step's value flickers from step to step (a block is
#: cached when its sequence ends, taken back by the next admission), so thousands of steps drawn
#: one by one read as noise; per bin, its time-weighted mean and its highest value read as a trend
CACHE_BINS = 150


def binned_share(steps: Table, column: str, budget: float, bins: int = CACHE_BINS) -> ColumnTable:
    """``column`` as a % of ``budget`` in at most ``bins`` equal spans of simulated time: per span,
    its start (``start_s``), its time-weighted mean (``mean_pct``) and the highest value any step
    overlapping it had (``max_pct``). Each step's value holds from its start to the next step's
    start (the last one's, to its end), as the step curves draw it."""
    start_s = np.asarray(steps["start_s"], dtype=float)
    end_s = max(_end_s(steps), float(start_s[-1]))
    share = np.asarray(steps[column], dtype=float) / budget * 100
    bins = max(1, min(bins, len(steps)))  # more spans than steps would draw each step anyway
    if end_s <= start_s[0]:  # no time elapses: one span, the steps' plain values
        return ColumnTable({"start_s": start_s[:1], "mean_pct": [float(share.mean())], "max_pct": [share.max()]})
    edges = np.linspace(start_s[0], end_s, bins + 1)
    # the integral of the share over time, exact at any time (linear within a step): mean = its
    # rise over a span / the span's width
    bounds = np.append(start_s, end_s)
    integral = np.concatenate([[0.0], np.cumsum(share * np.diff(bounds))])
    mean = np.diff(np.interp(edges, bounds, integral)) / np.diff(edges)
    # the highest: of the step running as a span begins and of every step starting inside it
    running = share[np.clip(np.searchsorted(start_s, edges[:-1], side="right") - 1, 0, len(share) - 1)]
    highest = running.copy()
    np.fmax.at(highest, np.clip(np.searchsorted(edges, start_s, side="right") - 1, 0, bins - 1), share)
    return ColumnTable({"start_s": edges[:-1], "mean_pct": mean, "max_pct": highest})


def _bound_lines(summary: dict) -> list[tuple[float, str, str]]:
    """The offline bounds the summary has, as ``(value %, legend, line style)``; bounds at one value
    (a trace where eviction never binds) are one line naming them all, not lines drawn over each other."""
    lines: list[tuple[float, list[str], str]] = []
    for key, label, style in _BOUNDS:
        value = summary.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value):
            continue
        same = next((line for line in lines if f"{line[0]:.1f}" == f"{value * 100:.1f}"), None)
        if same:
            same[1].append(label)
        else:
            lines.append((value * 100, [label], style))
    # one bound: its legend whole; several at one value: the first words of each, or the line's
    # legend would squeeze the plot ("ceiling = Belady = LRU: 96.8 %")
    return [
        (
            value,
            (labels[0] if len(labels) == 1 else " = ".join(w.split(" (")[0] for w in labels)) + f": {value:.1f} %",
            style,
        )
        for value, labels, style in lines
    ]


def _nice_top(value: float) -> float:
    """The axis' top for values up to ``value`` %: 100, or the next multiple of 10 above 1.25x it
    (a 6 % hit rate under a 29 % ceiling is not drawn as a line along the floor of a 0-100 axis)."""
    return float(min(100.0, max(10.0, np.ceil(value * 1.25 / 10.0) * 10.0)))


def draws_prefix_cache(requests: Table, summary: dict, cached_any: Callable[[], bool]) -> bool:
    """Whether :func:`plot_prefix_cache` has something to draw: a request table with a hit column
    and a hit, an offline bound in the summary, or a step that held cached blocks (``cached_any``,
    asked last: it may read the step table back)."""
    if "cached_prompt_tokens" not in requests or not len(requests):
        return False
    if any(key in summary for key, _, _ in _BOUNDS) or (np.asarray(requests["cached_prompt_tokens"]) > 0).any():
        return True
    return bool(cached_any())


def plot_prefix_cache(requests: Table, steps: Table, summary: dict, path: Path) -> Path | None:
    """The prefix cache over simulated time: the cumulative hit rate (with the offline ceiling,
    Belady and LRU bounds when the summary has them) above the cached blocks' share of the KV
    budget. None, and no file, when there is nothing to draw: no hit column, or (the request table
    may carry one for every allocator) no hit, no cached block and no offline bound."""
    if not draws_prefix_cache(
        requests, summary, lambda: "cached_bytes" in steps and bool((np.asarray(steps["cached_bytes"]) > 0).any())
    ):
        return None
    steps = as_table(steps)
    t_s, rate = cumulative_hit_rate(requests)
    end_s = _end_s(steps) if len(steps) else (float(t_s[-1]) if len(t_s) else 0.0)
    if len(t_s) and end_s > t_s[-1]:  # no admission after the last: the rate holds until the run ends
        t_s, rate = np.append(t_s, end_s), np.append(rate, rate[-1])
    fig = agg_figure(figsize=(10, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.step(
        t_s, rate * 100, where="post", color="#2b8cbe", linewidth=1.5, label="hit rate so far (admitted prompt tokens)"
    )
    bounds = _bound_lines(summary)
    for value, label, style in bounds:
        top.axhline(value, color="black", linestyle=style, linewidth=1, label=label)
    highest = max([float(np.nanmax(rate)) * 100 if np.isfinite(rate).any() else 0.0, *(v for v, _, _ in bounds)])
    top.set_ylabel("prefix hits\n(% of prompt tokens)")
    top.set_ylim(0, _nice_top(highest))
    top.grid(axis="y", color="#e0e0e0", linewidth=0.6)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    colour = {col: color for col, _, color in LEDGER}["cached_bytes"]
    if "cached_bytes" in steps and len(steps):
        bins = binned_share(steps, "cached_bytes", float(summary["kv_budget_bytes"]))
        span_s = (end_s - float(bins["start_s"][0])) / len(bins)
        # the last bin drawn as wide as the others: a step curve ends where its last point is
        binned = _held_to_end(bins)
        binned["start_s"][-1] = end_s
        bottom.fill_between(
            binned["start_s"],
            binned["max_pct"],
            step="post",
            color=colour,
            alpha=0.35,
            linewidth=0,
            label=f"highest in each {span_s:.3g} s",
        )
        bottom.step(
            binned["start_s"],
            binned["mean_pct"],
            where="post",
            color="#238b45",
            linewidth=1.2,
            label=f"mean over each {span_s:.3g} s",
        )
        peak = float(binned["max_pct"].max())
        bottom.set_ylim(0, max(peak * 1.15, 1.0))
        if peak > 0:
            bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        else:
            bottom.set_yticks([0.0])  # no scale to read: the note says what the flat line means
            bottom.text(
                0.5,
                0.5,
                "0 % at every recorded step: no cached prefix block sat unheld (evictable);\n"
                "the blocks in the cache were all held by running sequences",
                transform=bottom.transAxes,
                ha="center",
                va="center",
                fontsize=8.5,
            )
    else:
        bottom.text(0.5, 0.5, "no cached_bytes in the step table", transform=bottom.transAxes, ha="center")
        bottom.set_ylim(0, 1)
    bottom.set_ylabel("cached, evictable\n(" + _budget_words(summary) + ")")
    bottom.grid(axis="y", color="#e0e0e0", linewidth=0.6)
    bottom.set_xlabel("simulated time (s)")
    bottom.set_xlim(float(t_s[0]) if len(t_s) else 0.0, end_s if end_s > 0 else None)
    top.set_title(_title(summary))
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    return path


def _compact(value: float, whole: bool = False) -> str:
    """A bar's value in a few characters: ``21,642``, ``98.1``, ``1.19``, ``0``; ``whole``: a count,
    never with decimals."""
    if not np.isfinite(value):
        return "-"
    if value == 0:
        return "0"
    size = abs(value)
    return f"{value:,.0f}" if whole or size >= 100 else f"{value:.1f}" if size >= 10 else f"{value:.2f}"


#: the sweep's headline metrics: (summary key, drawn only where a job preempted?)
HEADLINE = (
    ("peak_concurrency", False),
    ("utilization_saturated", False),
    ("throughput_tokens_per_s", False),
    ("ttft_p50_s", False),
    ("ttft_p99_s", True),
    ("preemption_cost_s", True),
)
PANEL_COLUMNS = 3  #: panels side by side; more metrics go to another row
JOB_ROW_IN = 0.3  #: inches per job in a panel: room for a tick label of 8 pt


def _scaled(key: str, values: pd.Series) -> tuple[str, np.ndarray]:
    """The catalogue's words for ``key`` and its values in the unit they name (seconds shown in
    milliseconds, in seconds where they reach 10 s; fractions in percent)."""
    import pandas as pd  # a sweep's comparison table is a DataFrame

    m = metric(key)
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    label = m.label.strip()
    if m.show == "ms":
        if np.nanmax(np.abs(numbers), initial=0.0) >= 10.0:
            return label.replace("(ms)", "(s)"), numbers
        return label, numbers * 1e3
    if m.show == "pct":
        return label, numbers * 100
    return label, numbers


def _job_labels(ok: pd.DataFrame) -> tuple[list[str], str | None, list[int]]:
    """Each job's tick label, the axis' title naming what the labels are, and where the first
    swept key's value changes (a rule between groups). From the swept values (``swept.<key>``)
    where the report found them: ``naive, swap`` under ``allocator, preemption``."""
    from kvbench.output.sweep_info import SWEPT_PREFIX

    keys = [c for c in ok.columns if c.startswith(SWEPT_PREFIX)]
    if not keys:
        labels = ok["label"] if "label" in ok else ok["job"] if "job" in ok else ok.index
        return [str(v) for v in labels], None, []
    values = ok[keys].astype(str)
    labels = [", ".join(row) for row in values.itertuples(index=False)]
    first = values[keys[0]].tolist()
    groups = [i for i in range(1, len(first)) if first[i] != first[i - 1]] if len(keys) > 1 else []
    return labels, ", ".join(k.removeprefix(SWEPT_PREFIX) for k in keys), groups


def plot_comparison(table: pd.DataFrame, path: Path) -> Path:
    """The sweep's headline metrics side by side: one panel per metric, one bar per finished job,
    jobs down the side (a label reads whole at any number of jobs), each bar's value at its end."""
    import textwrap

    import pandas as pd  # a sweep's comparison table is a DataFrame

    plt = pyplot()
    failed = table.get("failed", pd.Series(False, index=table.index)).fillna(False).astype(bool)
    ok = table[~failed]
    preempted = "num_preemptions" in ok and ok["num_preemptions"].fillna(0).gt(0).any()
    keys = [key for key, only_preempted in HEADLINE if key in ok and (preempted or not only_preempted)]
    labels, axis_title, groups = _job_labels(ok)
    labels = [textwrap.shorten(label, 48, placeholder="...") for label in labels]
    ncols = max(1, min(PANEL_COLUMNS, len(keys)))
    nrows = max(1, -(-len(keys) // ncols))
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(2.2 + 3.4 * ncols, nrows * (1.0 + JOB_ROW_IN * max(len(ok), 2))),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    y = np.arange(len(ok))
    for ax, key in zip(axes.flat, keys):
        title, values = _scaled(key, ok[key])
        ax.barh(y, np.nan_to_num(values), height=0.7, color="#2b8cbe")
        finite = values[np.isfinite(values)]
        high = float(finite.max()) if finite.size else 0.0
        ax.set_xlim(0, high * 1.3 if high > 0 else 1.0)  # room for the value right of the longest bar
        for yi, value in zip(y, values):
            ax.annotate(
                _compact(value, metric(key).show == "int"),
                xy=(max(float(np.nan_to_num(value)), 0.0), yi),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=7.5,
            )
        for boundary in groups:
            ax.axhline(boundary - 0.5, color="#9e9e9e", linewidth=0.6)
        ax.set_title(textwrap.fill(title, 48), fontsize=9)
        ax.tick_params(axis="x", labelsize=7.5)
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
    for ax in axes.flat[len(keys) :]:
        ax.axis("off")
    for row in axes[:, 0]:  # the panels share the jobs' axis: labelled at the left of each row
        row.set_yticks(y)
        row.set_yticklabels(labels, fontsize=8)
        row.set_ylim(len(ok) - 0.5, -0.5)  # the first job on top, as in the table
        if axis_title:
            row.set_ylabel(axis_title, fontsize=8)
    title = f"kvbench sweep: {len(ok)} job(s)"
    shared = [str(ok[c].iloc[0]) for c in ("model", "hardware", "workload") if c in ok and ok[c].nunique() == 1]
    if len(shared) == 3:
        title += f", {shared[0]} on {shared[1]}, {shared[2]}"
    if failed.any():
        title += f" ({int(failed.sum())} failed job(s) not drawn)"
    if "kernel" in ok and ok["kernel"].nunique() > 1 and (ok.get("calibration") == "uncalibrated").all():
        # bars equal across kernels are no finding: without a calibration every kernel is priced alike
        title += "\nno kernel calibration for this hardware: every kernel runs at the same simulated speed"
    fig.suptitle(title, fontsize=10)
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path
