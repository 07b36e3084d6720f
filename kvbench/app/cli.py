"""The ``kvbench`` command: Hydra parses and sweeps the config, each job runs the engine.

    kvbench                                        # one run on the defaults (simulated H100)
    kvbench -m allocator=naive,paged kernel=triton,flashinfer   # a sweep and one comparison table
    kvbench bench-kernels ...                      # the kernel benchmark (needs a CUDA GPU)
"""

from __future__ import annotations

import importlib
import json
import signal
import sys
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from kvbench.app.config import KvbenchConfig
from kvbench.app.folders import prepare_output
from kvbench.app.overrides import check_overrides
from kvbench.errors import ConfigError
from kvbench.output.atomic import folder_lock, is_complete
from kvbench.output.report import print_comparison, print_summary
from kvbench.output.results import finished_config, write_failure, write_run
from kvbench.plugins import config_searchpaths, plugin_manager

ConfigStore.instance().store(name="kvbench_schema", node=KvbenchConfig)

#: ``kvbench <subcommand> ...``: the module whose ``main()`` runs it (it reads ``sys.argv[1:]``)
SUBCOMMANDS = {
    "bench-kernels": "kvbench.kernels.bench",
    "slo-batch": "kvbench.slo.batch",
    "slo-search": "kvbench.slo.search",
}

#: jobs of this process's multirun that failed on bad input (the exit status reports them)
FAILED_JOBS: list[str] = []


class _Current:
    """The job being run and its sweep folder: what an interruption reports."""

    job_dir: Path | None = None
    sweep_dir: Path | None = None


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so it unwinds like Ctrl-C (temporary files removed,
    locks released, no ``COMPLETE`` marker written)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum: int, frame) -> None:
    raise Interrupted(signum)


def _job_label(hc) -> str:
    return hc.job.override_dirname or "defaults"


def _notify_sinks(result) -> None:
    try:
        plugin_manager().hook.kvbench_run_finished(result=result)
    except Exception as exc:  # noqa: BLE001 - a sink must never fail the run it reports
        warnings.warn(f"a kvbench_run_finished plugin failed: {type(exc).__name__}: {exc}", stacklevel=1)


def _comparable(config: dict) -> dict:
    """A resolved config as it reads back from ``config.json``, less what only changes the display."""
    data = json.loads(json.dumps(config, default=str))
    data.pop("progress", None)
    return data


def _already_complete(out_dir: Path, cfg: DictConfig) -> bool:
    """A sweep re-run into its folder: this job finished before, with this very config."""
    done = finished_config(out_dir)
    return done is not None and _comparable(done) == _comparable(OmegaConf.to_container(cfg, resolve=True))


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    from kvbench.app.run import execute  # after Hydra has parsed: `kvbench --help` stays fast

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    label = _job_label(hc)
    _Current.job_dir, _Current.sweep_dir = out_dir, Path(hc.sweep.dir) if multirun else None

    def fail(reason: str) -> None:
        if not multirun:
            print(f"kvbench: error: {reason}", file=sys.stderr)
            sys.exit(2)
        # NOTE: a bad job must not stop the sweep: record it, and the final table shows why
        FAILED_JOBS.append(label)
        try:
            write_failure(out_dir, label, reason)
        except OSError:
            pass  # the disk that failed the run may fail this record too; the line below still says why
        print(f"kvbench: job {hc.job.num} ({label}) failed: {reason}", file=sys.stderr)

    if multirun and _already_complete(out_dir, cfg):
        print(f"kvbench: job {hc.job.num} ({label}) already complete in {out_dir}: skipped", file=sys.stderr)
        return
    try:
        result = execute(cfg, dict(hc.runtime.choices))
    except ConfigError as exc:
        fail(str(exc))
        return
    result.summary["job"] = label
    if cfg.output.write:
        try:
            write_run(result, out_dir, steps=cfg.output.steps, figures=cfg.output.figures)
        except OSError as exc:  # a full disk, a folder removed under the run: nothing is marked complete
            fail(f"could not write the results to {out_dir}: {exc.strerror or exc}; "
                 "free space or write elsewhere with hydra.run.dir=<folder>")  # fmt: skip
            return
    _notify_sinks(result)
    if not multirun:
        print_summary(result.summary, out_dir if cfg.output.write else None)


def _interrupted(exc: KeyboardInterrupt) -> NoReturn:
    """One line: what was interrupted, what is left incomplete, how to finish; exit 128 + signal."""
    signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
    parts = [f"kvbench: interrupted by {signal.Signals(signum).name}"]
    job, sweep = _Current.job_dir, _Current.sweep_dir
    if job is not None and not is_complete(job):
        parts.append(f"{job} is incomplete (no COMPLETE marker: never read as a result)")
    if sweep is not None:
        done = sum(is_complete(d) for d in sweep.iterdir() if d.is_dir() and d.name.isdigit())
        parts.append(f"{done} job(s) complete in {sweep}; finish the rest by running the same command "
                     f"with hydra.sweep.dir={sweep} (finished jobs are skipped)")  # fmt: skip
    print("; ".join(parts), file=sys.stderr)
    sys.exit(128 + signum)


def main() -> None:
    """Console entry point."""
    args = sys.argv[1:]
    if args and args[0] in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[args[0]])
        sys.argv = [f"{sys.argv[0]} {args[0]}", *args[1:]]
        module.main()
        return
    signal.signal(signal.SIGTERM, _on_signal)
    with ExitStack() as held:
        try:
            searchpaths = config_searchpaths()
            check_overrides(args, searchpaths)
            fixed_dir = prepare_output(args)
            if fixed_dir is not None:  # two runs into one named folder would mix their files
                held.enter_context(folder_lock(fixed_dir))
        except ConfigError as exc:
            print(f"kvbench: error: {exc}", file=sys.stderr)
            sys.exit(2)
        if searchpaths:
            sys.argv.append(f"hydra.searchpath=[{','.join(searchpaths)}]")
        try:
            _hydra_main()
        except KeyboardInterrupt as exc:
            _interrupted(exc)
    if FAILED_JOBS:
        sys.exit(1)


class ComparisonTable(Callback):
    """Hydra callback: at the end of a multirun, print and save one table comparing its jobs."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        print_comparison(Path(config.hydra.sweep.dir))
