"""The Hydra callback that tells each job of a sweep which one it is, for its progress on a
terminal (``job 2/3 allocator=paged: simulating``) and for what its jobs share (the sweep's folder).

Hydra's own lines that said it (``[HYDRA] Launching 3 jobs locally``, ``#1 : allocator=paged``) are
off: they went to stdout, into the table a user pipes or saves (conf/hydra/hydra_logging/kvbench.yaml).

The sweep's size is worked out in the launching process, where the sweep starts, as Hydra's basic
sweeper splits it; the callback travels with the jobs (a launcher pickles it with Hydra's context),
so a job in a worker process knows it too, and knows that it runs beside others.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from kvbench.app.progress import Job, current_job, end_sweep, say, set_current_job, start_sweep, sweep_job_done

#: the sweepers whose split kvbench can count: kvbench's own (its default) and Hydra's basic one
_KVBENCH_SWEEPER = "KvbenchSweeper"
_BASIC_SWEEPER = "BasicSweeper"


def _parse(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(overrides)


def sweep_size(config: DictConfig) -> tuple[int | None, tuple[str, ...]]:
    """How many jobs the sweep of ``config`` (the multirun's config) runs, and the keys it sweeps,
    as kvbench's sweeper (or Hydra's basic one) splits ``hydra.sweeper.params`` and the command
    line; (None, ()) when another sweeper runs it or the split cannot be worked out here (a
    ``glob()`` over options)."""
    target = str(config.hydra.sweeper.get("_target_", ""))
    if not target.endswith((_KVBENCH_SWEEPER, _BASIC_SWEEPER)):
        return None, ()
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    from kvbench.app.sweep_jobs import config_option_keys, sweep_jobs

    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()] + list(config.hydra.overrides.task)
    try:
        overrides = _parse(arguments)
        if target.endswith(_KVBENCH_SWEEPER):
            num_jobs = len(sweep_jobs(overrides, config_option_keys(config)))
        else:
            num_jobs = sum(len(batch) for batch in BasicSweeper.split_arguments(overrides, None))
    except Exception:  # noqa: BLE001 - Hydra's own sweep will say what is wrong; progress just counts less
        return None, ()
    swept = tuple(dict.fromkeys(o.get_key_element() for o in overrides if o.is_sweep_override()))
    return num_jobs, swept


def job_label(task_overrides: list[str], swept: tuple[str, ...]) -> str:
    """The job's values of the swept keys (``allocator=paged kernel=triton``); its overrides when
    what is swept is unknown."""
    if swept:
        try:
            mine = {o.get_key_element(): o.input_line for o in _parse(task_overrides)}
        except Exception:  # noqa: BLE001 - a label is only for a person: fall back to the overrides
            mine = {}
        if mine:
            return " ".join(mine[key] for key in swept if key in mine)
    return ",".join(task_overrides)


class JobProgress(Callback):
    """Sets the :class:`~kvbench.app.progress.Job` of each sweep job (none for a single run); in a
    launcher's worker process, says in one line on a terminal when each job starts and ends; where
    the jobs run one after another in this process and stderr is no terminal (a CI log), says every
    10 s of silence how many jobs are done."""

    def __init__(self) -> None:
        self.num_jobs: int | None = None
        self.swept: tuple[str, ...] = ()
        #: the process that launched the sweep: a job elsewhere runs beside others
        self.launcher_pid: int | None = None
        self._started_s = 0.0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.launcher_pid = os.getpid()
        self.num_jobs, self.swept = sweep_size(config)
        # Hydra's basic launcher runs the jobs here, in turn; another launcher's jobs report from their processes
        if str(OmegaConf.select(config, "hydra.launcher._target_", default="")).endswith(".BasicLauncher"):
            start_sweep(self.num_jobs, enabled=bool(config.get("progress", True)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        end_sweep()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hc = config.hydra
        if hc.mode != RunMode.MULTIRUN:
            set_current_job(None)
            return
        job = Job(
            num=int(hc.job.num),
            num_jobs=self.num_jobs,
            label=job_label(list(hc.overrides.task), self.swept),
            sweep_dir=Path(str(hc.sweep.dir)).absolute(),
            parallel=os.getpid() != self.launcher_pid,
        )
        set_current_job(job)
        self._started_s = time.perf_counter()
        if job.parallel:
            say(f"kvbench: {job.name}: started", enabled=bool(config.get("progress", True)))

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        job = current_job()
        set_current_job(None)
        sweep_job_done()
        if job is None or not job.parallel:
            return
        from hydra.core.utils import JobStatus

        failed = getattr(job_return, "status", None) == JobStatus.FAILED
        took_s = time.perf_counter() - self._started_s
        say(
            f"kvbench: {job.name}: {'failed' if failed else 'done'} after {took_s:.0f} s",
            enabled=bool(config.get("progress", True)),
        )
