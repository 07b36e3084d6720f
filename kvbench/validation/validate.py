"""``kvbench validate``'s work: replay the silicon rows, compare, summarize, draw.

Each admitted row (:mod:`kvbench.validation.silicon`) runs twice through :func:`kvbench.api.run`:
on the profiled clock (the engine's measured kernel and its framework's tables) and on the
roofline (``kernel=torch``, uncalibrated), so a reader sees what the tables buy. Where
aiconfigurator-core's own estimator runs on this machine (:mod:`kvbench.validation.aic`) its
prediction for the same rows stands beside them. Errors are absolute percentage errors of the
run's mean TTFT and mean TPOT (vllm bench serve's definitions: TPOT per request is
``(E2E - TTFT) / (output tokens - 1)``, averaged over requests) against the measured ones.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from kvbench.errors import ConfigError
from kvbench.validation.silicon import Replay, admitted, read_silicon, replay, select

CLOCKS = ("profiled", "roofline")
#: the issue's goals on the TP1 rows: median absolute percentage error
GOALS = {"tpot": 0.10, "ttft": 0.20}
GROUP = ["model_path", "system", "backend", "tp_size"]


def _run_one(job: Replay) -> tuple[float, float, int, str]:
    """One replay in a worker: (mean TTFT ms, mean TPOT ms, extrapolated lookups, status)."""
    from kvbench.api import run

    try:
        summary = run(list(job.overrides)).summary
    except ConfigError as exc:
        return math_nan, math_nan, 0, str(exc).splitlines()[0]
    lookups = int(summary.get("profile_extrapolated_lookups", 0))
    return summary["ttft_mean_s"] * 1e3, summary["tpot_mean_s"] * 1e3, lookups, "ok"


math_nan = float("nan")


@dataclass
class Validation:
    rows: object  #: pandas DataFrame: one row per silicon row, predictions and errors per clock
    groups: object  #: pandas DataFrame: median and p90 errors per (model, system, engine, TP)
    headline: object  #: pandas DataFrame: TP1 and TP>1 medians per clock, against the goals
    refused: object  #: pandas Series: rows not replayed, counted by reason
    source: str
    aic_status: str | None  #: None when aiconfigurator's estimator ran


def run_validation(
    *,
    models=None,
    systems=None,
    backends=None,
    limit: int | None = None,
    workers: int | None = None,
    with_aic: bool = True,
    advance=lambda n: None,
) -> Validation:
    frame, source = read_silicon()
    rows, refused = admitted(frame)
    rows = select(rows, models, systems, backends, limit).reset_index(drop=True)
    if rows.empty:
        raise ConfigError("no silicon row is left to replay: widen --model, --system or --backend")
    jobs = [replay(row, clock) for _, row in rows.iterrows() for clock in CLOCKS]
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        results = []
        for job in jobs:
            results.append(_run_one(job))
            advance(1)
    else:
        with ProcessPoolExecutor(workers) as pool:
            results = []
            for result in pool.map(_run_one, jobs, chunksize=4):
                results.append(result)
                advance(1)
    for i, clock in enumerate(CLOCKS):
        part = results[i :: len(CLOCKS)]
        rows[f"{clock}_ttft_ms"] = [r[0] for r in part]
        rows[f"{clock}_tpot_ms"] = [r[1] for r in part]
        rows[f"{clock}_status"] = [r[3] for r in part]
        if clock == "profiled":
            rows["profile_extrapolated_lookups"] = [r[2] for r in part]
    aic_status = None
    if with_aic:
        from kvbench.validation.aic import aic_available, estimate_rows

        aic_status = aic_available()
        if aic_status is None:
            rows = rows.join(estimate_rows(rows))
    clocks = [*CLOCKS, *(["aic"] if "aic_ttft_ms" in rows else [])]
    for clock in clocks:
        for metric in ("ttft", "tpot"):
            measured = rows[f"silicon_{metric}_ms"]
            rows[f"{clock}_{metric}_ape"] = (rows[f"{clock}_{metric}_ms"] - measured).abs() / measured
    groups = _groups(rows, clocks)
    headline = _headline(rows, clocks)
    return Validation(rows, groups, headline, refused, source, aic_status)


def _stats(frame, clocks) -> dict:
    out = {"rows": len(frame)}
    for clock in clocks:
        for metric in ("ttft", "tpot"):
            ape = frame[f"{clock}_{metric}_ape"].dropna()
            out[f"{clock}_{metric}_n"] = len(ape)
            out[f"{clock}_{metric}_median"] = float(np.median(ape)) if len(ape) else math_nan
            out[f"{clock}_{metric}_p90"] = float(np.quantile(ape, 0.9)) if len(ape) else math_nan
    return out


def _groups(rows, clocks):
    import pandas as pd

    records = [{**dict(zip(GROUP, key)), **_stats(part, clocks)} for key, part in rows.groupby(GROUP, sort=True)]
    return pd.DataFrame.from_records(records)


def _headline(rows, clocks):
    import pandas as pd

    records = []
    for name, part in (("TP1", rows[rows["tp_size"] == 1]), ("TP>1", rows[rows["tp_size"] > 1]), ("all", rows)):
        if len(part):
            records.append({"subset": name, **_stats(part, clocks)})
    return pd.DataFrame.from_records(records)


def worst(rows, clock: str = "profiled", n: int = 5):
    """The rows with the largest TPOT and TTFT errors on ``clock``, for the report."""
    return {
        metric: rows.nlargest(n, f"{clock}_{metric}_ape")[
            [
                "id",
                "model_path",
                "system",
                "backend",
                "tp_size",
                "isl",
                "osl",
                "batch_size",
                f"silicon_{metric}_ms",
                f"{clock}_{metric}_ms",
                f"{clock}_{metric}_ape",
            ]
        ]
        for metric in ("tpot", "ttft")
    }


def parity_figure(rows, clocks):
    """Predicted against measured TTFT and TPOT, log axes, one marker per engine, one colour per clock."""
    from kvbench.output.figures import pyplot

    plt = pyplot()
    markers = {"vllm": "o", "sglang": "s", "trtllm": "^"}
    colours = {"profiled": "tab:blue", "roofline": "tab:gray", "aic": "tab:orange"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, metric in zip(axes, ("ttft", "tpot")):
        measured = rows[f"silicon_{metric}_ms"]
        for clock in clocks:
            for backend, marker in markers.items():
                pick = rows["backend"] == backend
                if pick.any():
                    ax.scatter(
                        measured[pick],
                        rows.loc[pick, f"{clock}_{metric}_ms"],
                        s=14,
                        marker=marker,
                        color=colours[clock],
                        alpha=0.6,
                        label=f"{clock}, {backend}",
                    )
        lo, hi = float(measured.min()) / 2, float(measured.max()) * 2
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        for band in (0.8, 1.25):
            ax.plot([lo, hi], [lo * band, hi * band], color="black", lw=0.4, ls=":")
        ax.set(xscale="log", yscale="log", xlabel=f"measured {metric.upper()} (ms)", ylabel="predicted (ms)")
        ax.set_title(f"{metric.upper()}: predicted vs measured (dotted: ±20-25 %)")
    axes[1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig
