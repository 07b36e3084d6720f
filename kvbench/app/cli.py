"""The ``kvbench`` command: Hydra parses and sweeps the config, each job runs the engine.

    kvbench                                        # one run on the defaults (simulated H100)
    kvbench -m allocator=naive,paged kernel=triton,flashinfer   # a sweep and one comparison table
    kvbench bench-kernels ...                      # the kernel benchmark (needs a CUDA GPU)
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from kvbench.app.config import KvbenchConfig
from kvbench.app.overrides import check_overrides
from kvbench.errors import ConfigError
from kvbench.output.report import print_comparison, print_summary
from kvbench.output.results import write_failure, write_run
from kvbench.plugins import config_searchpaths, plugin_manager

ConfigStore.instance().store(name="kvbench_schema", node=KvbenchConfig)

#: jobs of this process's multirun that failed on bad input (the exit status reports them)
FAILED_JOBS: list[str] = []


def _job_label(hc) -> str:
    return hc.job.override_dirname or "defaults"


def _notify_sinks(result) -> None:
    try:
        plugin_manager().hook.kvbench_run_finished(result=result)
    except Exception as exc:  # noqa: BLE001 - a sink must never fail the run it reports
        warnings.warn(f"a kvbench_run_finished plugin failed: {type(exc).__name__}: {exc}", stacklevel=1)


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    from kvbench.app.run import execute  # after Hydra has parsed: `kvbench --help` stays fast

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    label = _job_label(hc)
    try:
        result = execute(cfg, dict(hc.runtime.choices))
    except ConfigError as exc:
        if not multirun:
            print(f"kvbench: error: {exc}", file=sys.stderr)
            sys.exit(2)
        # NOTE: a bad job must not stop the sweep: record it, and the final table shows why
        FAILED_JOBS.append(label)
        write_failure(out_dir, label, str(exc))
        print(f"kvbench: job {hc.job.num} ({label}) failed: {exc}", file=sys.stderr)
        return
    result.summary["job"] = label
    if cfg.output.write:
        write_run(result, out_dir, steps=cfg.output.steps, figures=cfg.output.figures)
    _notify_sinks(result)
    if not multirun:
        print_summary(result.summary, out_dir if cfg.output.write else None)


def main() -> None:
    """Console entry point."""
    args = sys.argv[1:]
    if args and args[0] == "bench-kernels":
        from kvbench.kernels.bench import main as bench_main

        sys.argv = [f"{sys.argv[0]} bench-kernels", *args[1:]]
        bench_main()
        return
    try:
        searchpaths = config_searchpaths()
        check_overrides(args, searchpaths)
    except ConfigError as exc:
        print(f"kvbench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if searchpaths:
        sys.argv.append(f"hydra.searchpath=[{','.join(searchpaths)}]")
    _hydra_main()
    if FAILED_JOBS:
        sys.exit(1)


class ComparisonTable(Callback):
    """Hydra callback: at the end of a multirun, print and save one table comparing its jobs."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        print_comparison(Path(config.hydra.sweep.dir))
