"""A disaggregated run's figure: each worker's KV memory over time, the KV on the links, and where
the TTFT goes (``deployment.png`` beside the run's tables)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvbench.deploy.loop import kv_in_flight
from kvbench.io.atomic import write_file
from kvbench.io.table import ColumnTable, as_table
from kvbench.output.figures import agg_figure

#: the TTFT's parts, bottom up: (summary key, words, colour)
TTFT_BARS = (
    ("ttft_prefill_queue_mean_s", "prefill queue", "#bdbdbd"),
    ("ttft_prefill_mean_s", "prefill", "#1f77b4"),
    ("ttft_transfer_mean_s", "KV transfer", "#ff7f0e"),
    ("ttft_first_decode_mean_s", "first decode step", "#2ca02c"),
)


def plot_deployment(steps, requests, summary: dict, path: Path) -> Path:
    """Three panels: allocated KV per worker (% of its budget) over time, KV bytes in flight on the
    links over time, and the mean TTFT split into its four parts."""
    steps, requests = as_table(steps), as_table(requests)
    fig = agg_figure(figsize=(12, 4.2), layout="constrained")
    memory, links, ttft = fig.subplots(1, 3, width_ratios=(2.2, 1.6, 0.8))
    workers = np.asarray(steps["worker"]).astype(str)
    for name in dict.fromkeys(workers.tolist()):
        rows = workers == name
        t_s = np.asarray(steps["start_s"], dtype=float)[rows]
        used = sum(
            np.asarray(steps[c], dtype=float)[rows] for c in ("token_bytes", "reserved_future_bytes", "internal_bytes")
        )
        budget = float(summary[f"{name}_kv_budget_bytes"])
        style = "-" if name.startswith("decode") else "--"
        memory.step(t_s, used / budget * 100, where="post", linestyle=style, linewidth=1, label=name)
    memory.set_xlabel("simulated time (s)")
    memory.set_ylabel("allocated KV (% of the worker's budget)")
    memory.set_ylim(0, 105)
    memory.legend(fontsize=7, ncol=2, loc="lower right")
    memory.set_title("KV memory per worker")
    moved = ColumnTable({k: requests[k] for k in ("transfer_start_s", "transfer_end_s", "kv_transfer_bytes")})
    times, in_flight = kv_in_flight(moved)
    if len(times):
        links.step(times, in_flight / 1e9, where="post", color="#ff7f0e", linewidth=1)
    links.set_xlabel("simulated time (s)")
    links.set_ylabel("KV in flight (GB)")
    links.set_title("KV on the links")
    bottom = 0.0
    for key, words, color in TTFT_BARS:
        value = float(summary.get(key) or 0.0) * 1e3
        ttft.bar(0, value, bottom=bottom, color=color, label=f"{words} {value:,.1f} ms")
        bottom += value
    ttft.set_xticks([])
    ttft.set_ylabel("mean TTFT (ms)")
    ttft.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.02))
    ttft.set_title("TTFT")
    fig.suptitle(
        f"{summary.get('model')} on {summary.get('hardware')}: {summary.get('prefill_workers')}P"
        f"{summary.get('decode_workers')}D, {summary.get('router')}, {summary.get('transfer')}",
        fontsize=10,
    )
    write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    return path
