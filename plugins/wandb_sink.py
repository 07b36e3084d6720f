"""Weights & Biases sink: every finished run becomes a W&B run (offline unless asked).

``wandb.mode=offline`` (the default) needs no account and makes no network call; it writes under
the job's results folder (``<run folder>/wandb/offline-run-*``), to sync later with ``wandb sync``.
``online`` logs live; ``disabled`` skips W&B.

The environment variable ``WANDB_MODE``, when set, overrides ``wandb.mode`` from the config (and
from the command line), so ``WANDB_MODE=disabled kvbench ...`` turns W&B off as it does for any W&B
program. kvbench reads it itself: W&B lets the ``mode=`` that kvbench passes to ``wandb.init`` win
over the variable. kvbench.app.config.WandbConfig checks its value before the run.

What "no network call" takes (wandb 0.31, checked with strace and a Python audit hook):

- ``WANDB_ERROR_REPORTING=false``: without it an offline run still exports W&B's own telemetry
  from this process, whose first export probes https://api.forge.coreweave.com (a DNS lookup,
  then HTTPS), and wandb-core is started with its error reporting on; with it the telemetry
  records nothing and wandb-core is started with ``--no-observability``. Set for the whole process:
  W&B reads it when it starts wandb-core, once per process.
- ``x_disable_stats``, ``x_disable_meta``, ``x_disable_machine_info``: no system-metrics monitor
  (wandb-symon) and no machine metadata, whose collection may query cloud metadata servers
  (169.254.169.254): none was seen on the machine checked; the settings are for machines where it would be.

What remains is local: wandb-core, W&B's own process, is started and talks to this process over a
Unix socket (127.0.0.1 where Unix sockets are missing); ``git rev-parse`` reads the repository; and
urllib3, on import, binds a socket to ::1 to learn whether IPv6 exists (nothing is sent).
"""

from __future__ import annotations

import math
import os

from kvbench import hookimpl
from kvbench.app.config import WANDB_MODE_ALIASES

#: W&B settings of an offline run: nothing collected that could ask a server (see the docstring)
OFFLINE_SETTINGS = {"x_disable_stats": True, "x_disable_meta": True, "x_disable_machine_info": True}


def _loggable(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))}


def effective_mode(config_mode: str) -> str:
    """The W&B mode of a run: ``WANDB_MODE`` from the environment when set (W&B's old names
    ``dryrun`` and ``run`` read as offline and online), else the config's."""
    env_mode = os.environ.get("WANDB_MODE")
    return WANDB_MODE_ALIASES.get(env_mode, env_mode) if env_mode else config_mode


@hookimpl
def kvbench_run_finished(result) -> None:
    settings = result.config.get("wandb", {})
    mode = effective_mode(settings.get("mode", "offline"))
    if mode == "disabled":
        return
    os.environ.setdefault("WANDB_SILENT", "true")
    if mode == "offline":
        os.environ["WANDB_ERROR_REPORTING"] = "false"  # before wandb starts wandb-core
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
        settings=wandb.Settings(**OFFLINE_SETTINGS) if mode == "offline" else None,
    )
    try:
        # per-step curves stay in results/ (Parquet); W&B gets the summary, to compare runs
        run.summary.update(_loggable(s))
        run.log(_loggable(s))
    finally:
        run.finish()
