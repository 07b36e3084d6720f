"""Figures next to the numbers: a run's memory over time, a sweep's side-by-side bars."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.atomic import write_file
from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.metrics.catalogue import ledger_parts, metric

#: how each ledger part is drawn (stacked in :data:`LEDGER_FIELDS` order): (field, legend, colour),
#: from the catalogue
LEDGER = tuple((f"{m.key.removeprefix('frac_')}_bytes", m.legend, m.colour) for m in ledger_parts())
MAX_POINTS = 4000
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


def ledger_stack(steps: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The ledger parts to stack, bottom up: ``(column, label, colour)`` for each field of
    :data:`LEDGER_FIELDS` the step table has; the prefix cache's part only where it ever holds
    something (it is 0 throughout for allocators without a cache: no legend entry for nothing)."""
    drawn = {col: (label, color) for col, label, color in LEDGER}
    stack = []
    for col in LEDGER_FIELDS:
        if col not in steps or (col == "cached_bytes" and not steps[col].gt(0).any()):
            continue
        label, color = drawn.get(col, (col.removesuffix("_bytes").replace("_", " "), "#bdbdbd"))
        stack.append((col, label, color))
    return stack


def _thinned(frame: pd.DataFrame) -> pd.DataFrame:
    """At most about :data:`MAX_POINTS` rows, evenly spaced: keeps the file small (the Parquet table
    has every row)."""
    return frame.iloc[:: int(np.ceil(len(frame) / MAX_POINTS))] if len(frame) > MAX_POINTS else frame


def _title(summary: dict) -> str:
    return (
        f"{summary['model']} on {summary['hardware']}: {summary['allocator']} "
        f"(block {summary['block_size_tokens']}), {summary['workload']}"
    )


def plot_memory_timeline(steps: pd.DataFrame, summary: dict, path: Path) -> Path:
    """Stacked memory ledger (fraction of the KV budget) and batch size over simulated time."""
    plt = pyplot()
    steps = _thinned(steps)
    budget = float(summary["kv_budget_bytes"])
    t_s = steps["start_s"].to_numpy()
    stack = ledger_stack(steps)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.stackplot(
        t_s,
        *[steps[col].to_numpy() / budget * 100 for col, _, _ in stack],
        labels=[label for _, label, _ in stack],
        colors=[color for _, _, color in stack],
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
    ax.set_title(_title(summary))
    fig.tight_layout()
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def cumulative_hit_rate(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(admission times (s), hit rate so far)``: after each admission, prompt tokens served from
    the prefix cache / prompt tokens, over the requests admitted until then. A request's hits are
    placed at its first admission (the request table keeps no time for a re-admission's), so the
    last value is the summary's ``prefix_hit_rate``."""
    admitted = requests[requests["admitted_s"].to_numpy(dtype=float) >= 0]
    admitted = admitted.sort_values("admitted_s", kind="stable")
    cached = np.cumsum(admitted["cached_prompt_tokens"].to_numpy(dtype=np.int64))
    prompt = np.cumsum(admitted["prompt_tokens"].to_numpy(dtype=np.int64))
    with np.errstate(invalid="ignore", divide="ignore"):  # zero-token prompts so far: no rate yet
        rate = np.where(prompt > 0, cached / np.maximum(prompt, 1), np.nan)
    return admitted["admitted_s"].to_numpy(dtype=float), rate


def plot_prefix_cache(requests: pd.DataFrame, steps: pd.DataFrame, summary: dict, path: Path) -> Path | None:
    """The prefix cache over simulated time: the cumulative hit rate (with the offline ceiling,
    Belady and LRU bounds when the summary has them) above the cached blocks' share of the KV
    budget. None, and no file, when there is nothing to draw: no hit column, or (the request table
    may carry one for every allocator) no hit, no cached block and no offline bound."""
    if "cached_prompt_tokens" not in requests or not len(requests):
        return None
    cached_any = "cached_bytes" in steps and bool(steps["cached_bytes"].gt(0).any())
    bounds_given = any(key in summary for key, _, _ in _BOUNDS)
    if not (cached_any or bounds_given or requests["cached_prompt_tokens"].gt(0).any()):
        return None
    plt = pyplot()
    t_s, rate = cumulative_hit_rate(requests)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    top.step(t_s, rate * 100, where="post", color="#2b8cbe", label="hit rate so far (admitted prompt tokens)")
    for key, label, style in _BOUNDS:
        value = summary.get(key)
        if isinstance(value, (int, float)) and np.isfinite(value):
            top.axhline(value * 100, color="black", linestyle=style, linewidth=1, label=f"{label}: {value * 100:.1f} %")
    top.set_ylabel("prefix hits (% of prompt tokens)")
    top.set_ylim(0, 100)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    if "cached_bytes" in steps and len(steps):
        thin = _thinned(steps)
        budget = float(summary["kv_budget_bytes"])
        bottom.fill_between(
            thin["start_s"].to_numpy(),
            thin["cached_bytes"].to_numpy() / budget * 100,
            step="post",
            color={col: color for col, _, color in LEDGER}["cached_bytes"],
        )
    else:
        bottom.text(0.5, 0.5, "no cached_bytes in the step table", transform=bottom.transAxes, ha="center")
    bottom.set_ylabel("cached, evictable\n(% of KV budget)")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("simulated time (s)")
    top.set_title(_title(summary))
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
