"""Weights & Biases sink: every finished run becomes a W&B run, when asked for.

W&B is an optional extra (``pip install -e '.[wandb]'``) and off by default (``wandb.mode=disabled``):
a run writes its tables under ``results/`` whether or not it is logged. ``wandb.mode=offline`` needs
no account and makes no network call; it writes under the job's results folder
(``<run folder>/wandb/offline-run-*``), and nowhere else: W&B's own cache and data folders
(wandb-core's logs, table staging) are pointed into the command's folder too, unless
WANDB_CACHE_DIR or WANDB_DATA_DIR is set. A plain ``wandb sync`` looks in ``./wandb`` and finds none
of them, so kvbench prints the command that uploads them (:func:`sync_command`). ``online`` logs
live. Asking for W&B (config or ``WANDB_MODE``) without the package installed is refused before the
run starts (kvbench.app.config.WandbConfig).

What a team browsing the project sees:

- a sweep's jobs share a ``group``: the sweep folder relative to the results root
  (``multirun/2026-11-30/18-48-39-123456``), ``job_type`` ``sweep-job``, each run named by its
  swept values (``allocator=paged scheduler=chunked``); when the sweep ends, one more run of
  ``job_type`` ``comparison`` in the same group holds the comparison table and figure.
- a single run has no group (it belongs to no study; W&B groups runs by date or any config key on
  demand), ``job_type`` ``run``, and is named by its overrides (``defaults`` when none).
- every run: the summary row as the run summary and as a one-row table, the per-request table
  (at most ``wandb.Table.MAX_ROWS`` rows, evenly sampled, said in the run's notes: the whole table
  is in ``results/``), the memory figure, and the resolved config with kvbench's version and
  commit. The per-step table stays in ``results/`` (Parquet): it is too long for a W&B table.

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
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench import hookimpl
from kvbench.app.config import WANDB_MODE_ALIASES
from kvbench.app.folders import DEFAULT_ROOT
from kvbench.output.sweep_info import job_overrides, swept_keys, swept_values

if TYPE_CHECKING:  # pandas is not imported by this module: plugins load even for `kvbench --help`
    import pandas as pd

#: W&B settings of an offline run: nothing collected that could ask a server (see the docstring)
OFFLINE_SETTINGS = {"x_disable_stats": True, "x_disable_meta": True, "x_disable_machine_info": True}
#: W&B refuses group and run names over 128 characters
MAX_NAME_CHARS = 128
#: overrides that change how a run is shown or logged, never its numbers: left out of its name
DISPLAY_ONLY = ("progress", "wandb.", "output.", "hydra.")


def _loggable(summary: dict) -> dict:
    return {
        k: v for k, v in summary.items() if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))
    }


def _summary_values(summary: dict) -> dict:
    """The summary row as a W&B run summary: numbers, text and flags; NaN (no value) left out."""
    return {k: v for k, v in summary.items() if isinstance(v, (str, bool)) or k in _loggable(summary)}


def effective_mode(config_mode: str) -> str:
    """The W&B mode of a run: ``WANDB_MODE`` from the environment when set (W&B's old names
    ``dryrun`` and ``run`` read as offline and online), else the config's."""
    env_mode = os.environ.get("WANDB_MODE")
    return WANDB_MODE_ALIASES.get(env_mode, env_mode) if env_mode else config_mode


def _tail(text: str) -> str:
    """A name within W&B's limit; a long path keeps its end, where runs differ."""
    return text if len(text) <= MAX_NAME_CHARS else "..." + text[-(MAX_NAME_CHARS - 3) :]


def sweep_group(sweep_dir: Path) -> str:
    """A sweep's W&B group: its folder relative to the results root (else to the working folder,
    else absolute), so every job and the comparison of one sweep, and only they, share it."""
    folder = Path(os.path.abspath(sweep_dir))
    for root in (Path.cwd() / DEFAULT_ROOT, Path.cwd()):
        if folder.is_relative_to(root) and folder != root:
            return _tail(folder.relative_to(root).as_posix())
    return _tail(folder.as_posix())


def sweep_of(out_dir: Path | None) -> Path | None:
    """The sweep folder of a multirun's job folder (Hydra: ``<sweep>/<job num>``, and ``multirun.yaml``
    in ``<sweep>``), or None for a single run."""
    if out_dir is None or not (Path(out_dir).parent / "multirun.yaml").is_file():
        return None
    return Path(out_dir).parent


def _label(values: dict[str, str]) -> str:
    return " ".join(f"{key}={value}" for key, value in values.items())


def run_name(result, sweep_dir: Path | None) -> str:
    """A sweep job by its swept values; a single run by the overrides that change its numbers."""
    if sweep_dir is not None:
        keys = swept_keys(sweep_dir)
        if keys:
            return _tail(_label(swept_values(result.out_dir, keys)))
    own = job_overrides(result.out_dir) if result.out_dir is not None else {}
    return _tail(_label({k: v for k, v in own.items() if not k.startswith(DISPLAY_ONLY)}) or "defaults")


def table(frame: pd.DataFrame):
    """A ``wandb.Table`` of a frame: a missing value is an empty cell, whatever the column's type
    (W&B refuses a text column holding NaN). Built from rows, not ``dataframe=``: W&B reads a
    frame cell by cell through pandas, 4x slower (4.8 s against 1.2 s for 10,000 requests)."""
    import wandb

    cells = frame.astype(object).where(frame.notna(), None)
    return wandb.Table(columns=[str(c) for c in cells.columns], data=cells.to_numpy().tolist(), allow_mixed_types=True)


def sampled(frame: pd.DataFrame, max_rows: int) -> pd.DataFrame:
    """At most ``max_rows`` rows, every k-th one: spread over the whole run, not just its start."""
    if len(frame) <= max_rows:
        return frame
    return frame.iloc[:: math.ceil(len(frame) / max_rows)]


#: W&B's folders outside a run: wandb-core's debug logs (``~/.cache/wandb/logs``, two files per
#: process) and the staging copies of logged tables (``~/.local/share/wandb/artifacts``). kvbench
#: points them into the command's own folder unless the user set them; the names it set itself
#: are re-pointed per run (a test process runs many)
_W_AND_B_FOLDERS = {"WANDB_CACHE_DIR": ".cache", "WANDB_DATA_DIR": ".data"}
_SET_BY_KVBENCH: set[str] = set()


def _keep_inside(directory: Path | None) -> None:
    """W&B's cache and data folders under ``<command folder>/wandb/``: the sweep's folder for a
    sweep's job (wandb-core starts once per process and keeps the first folder it is given),
    the run's own folder otherwise. Nothing is written under the user's home."""
    if directory is None:
        return
    root = (sweep_of(directory) or Path(directory)) / "wandb"
    for name, sub in _W_AND_B_FOLDERS.items():
        if name not in os.environ or name in _SET_BY_KVBENCH:
            os.environ[name] = str(Path(os.path.abspath(root)) / sub)
            _SET_BY_KVBENCH.add(name)


def sync_command(folder: Path, *, sweep: bool) -> str:
    """The ``wandb sync`` command that uploads the offline runs kvbench wrote under ``folder``: a
    run's own, or a sweep's (one per job and the comparison's)."""
    import shlex

    where = shlex.quote(str(folder))
    runs = f"{where}/wandb/offline-run-*"
    return f"wandb sync {where}/*/wandb/offline-run-* {runs}" if sweep else f"wandb sync {runs}"


def _say_offline(folder: Path | None, *, sweep: bool) -> None:
    """One line on stderr: where the offline W&B runs are and how to upload them."""
    import sys

    if folder is None:
        return
    what = "runs of this sweep are" if sweep else "run is"
    print(
        f"kvbench: the W&B {what} offline in {folder}; upload with: {sync_command(folder, sweep=sweep)}",
        file=sys.stderr,
    )


def _init(settings: dict, mode: str, *, directory: Path | None, **kwargs):
    os.environ.setdefault("WANDB_SILENT", "true")
    if mode == "offline":
        os.environ["WANDB_ERROR_REPORTING"] = "false"  # before wandb starts wandb-core
        _keep_inside(directory)
    import wandb  # heavy: imported only when a run is actually logged

    return wandb.init(
        project=settings.get("project") or "kvbench",
        entity=settings.get("entity"),
        mode=mode,
        dir=str(directory) if directory is not None else None,
        reinit="finish_previous",
        settings=wandb.Settings(**OFFLINE_SETTINGS) if mode == "offline" else None,
        **kwargs,
    )


#: the phases of logging one run, for its progress bar: start wandb-core, build the tables, log, finish
_RUN_PHASES = 4


@hookimpl
def kvbench_run_finished(result) -> None:
    settings = result.config.get("wandb", {})
    mode = effective_mode(settings.get("mode", "disabled"))
    if mode == "disabled":
        return
    from kvbench.app.progress import progress_bar

    # W&B takes seconds (wandb-core's start, a table of every request): said on screen, not silent
    with progress_bar(
        _RUN_PHASES, f"W&B ({mode}): logging the run", enabled=bool(result.config.get("progress"))
    ) as advance:
        import wandb

        from kvbench.output.provenance import provenance

        s = result.summary
        sweep_dir = sweep_of(result.out_dir)
        requests = sampled(result.requests, wandb.Table.MAX_ROWS)
        notes = None
        if len(requests) < len(result.requests):
            notes = (
                f"requests table: {len(requests)} of {len(result.requests)} rows (every "
                f"{math.ceil(len(result.requests) / len(requests))}-th row); all in {result.out_dir or 'results/'}/requests.parquet"
            )
        run = _init(
            settings,
            mode,
            directory=result.out_dir,
            name=run_name(result, sweep_dir),
            group=settings.get("group") or (sweep_group(sweep_dir) if sweep_dir is not None else None),
            job_type="sweep-job" if sweep_dir is not None else "run",
            notes=notes,
            config={**result.config, **provenance()},
            tags=[str(s[key]) for key in ("mode", "hardware", "model") if key in s],
        )
        advance(1)
        try:
            media = {"summary_table": table(result.summary_frame()), "requests": table(requests)}
            figure = Path(result.out_dir) / "memory.png" if result.out_dir is not None else None
            if figure is not None and figure.is_file():
                media["memory"] = wandb.Image(str(figure))
            advance(1)
            # per-step curves stay in results/ (Parquet); the numbers also go to history, for charts
            run.log({**_loggable(s), **media})
            run.summary.update(_summary_values(s))
            run.summary["requests_table_rows"] = len(requests)
            advance(1)
        finally:
            run.finish()
            advance(1)
    if mode == "offline" and sweep_dir is None:  # a sweep's jobs are said once, when it ends
        _say_offline(result.out_dir, sweep=False)


def _sweep_settings(sweep_dir: Path) -> dict:
    """The sweep's ``wandb`` settings, as Hydra saved its config in ``multirun.yaml``."""
    from omegaconf import OmegaConf

    try:
        node = OmegaConf.select(OmegaConf.load(sweep_dir / "multirun.yaml"), "wandb", default=None)
        return dict(OmegaConf.to_container(node, resolve=True)) if node is not None else {}
    except Exception:  # noqa: BLE001 - an unreadable record: W&B's defaults, the table still logs
        return {}


@hookimpl
def kvbench_sweep_finished(sweep_dir, comparison) -> None:
    sweep_dir = Path(sweep_dir)
    settings = _sweep_settings(sweep_dir)
    mode = effective_mode(settings.get("mode", "disabled"))
    if mode == "disabled" or comparison is None or comparison.empty:
        return
    from kvbench.app.config import wandb_installed

    if not wandb_installed():  # asked for in a config file: each job already failed saying so
        return
    import wandb

    from kvbench.output.provenance import provenance

    keys = swept_keys(sweep_dir)
    run = _init(
        settings,
        mode,
        directory=sweep_dir,
        name=_tail("comparison " + (" ".join(keys) or sweep_dir.name)),
        group=settings.get("group") or sweep_group(sweep_dir),
        job_type="comparison",
        config={"swept": keys, "num_jobs": len(comparison), "sweep_dir": str(sweep_dir), **provenance()},
    )
    try:
        media = {"comparison": table(comparison)}
        figure = sweep_dir / "comparison.png"
        if figure.is_file():
            media["comparison_figure"] = wandb.Image(str(figure))
        run.log(media)
        failed = int(comparison["failed"].fillna(False).astype(bool).sum()) if "failed" in comparison else 0
        run.summary.update({"num_jobs": len(comparison), "num_failed_jobs": failed})
    finally:
        run.finish()
    if mode == "offline":
        _say_offline(sweep_dir, sweep=True)
