"""Weights & Biases sink: every finished run becomes a W&B run (offline unless asked).

``wandb.mode=offline`` (the default) needs no account and no network and writes under the job's
results folder, to sync later with ``wandb sync``; ``online`` logs live; ``disabled`` skips W&B.
"""

from __future__ import annotations

import math
import os

from kvbench import hookimpl


def _loggable(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))}


@hookimpl
def kvbench_run_finished(result) -> None:
    settings = result.config.get("wandb", {})
    mode = settings.get("mode", "offline")
    if mode == "disabled":
        return
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb  # heavy: imported only when a run is actually logged

    s = result.summary
    run = wandb.init(
        project=settings.get("project", "kvbench"),
        entity=settings.get("entity"),
        mode=mode,
        dir=str(result.out_dir) if result.out_dir else None,
        name=f"{s['allocator']}-{s['kernel']}-{s['workload']}",
        config=result.config,
        tags=[s["mode"], s["hardware"], s["model"]],
        reinit="finish_previous",
    )
    try:
        # per-step curves stay in results/ (Parquet); W&B gets the summary, to compare runs
        run.summary.update(_loggable(s))
        run.log(_loggable(s))
    finally:
        run.finish()
