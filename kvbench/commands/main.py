"""The ``kvbench`` command: Hydra parses and sweeps the config, each job runs the engine.

kvbench                                        # one run on the defaults (simulated H100)
kvbench -m allocator=naive,paged kernel=triton,flashinfer   # a sweep and one comparison table
kvbench bench-kernels ...                      # the kernel benchmark (needs a CUDA GPU)
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from kvbench.app.compose_once import composed_once
from kvbench.app.config import KvbenchConfig
from kvbench.app.folders import prepare_output
from kvbench.app.searchpath import register as register_searchpath
from kvbench.commands import startup_gc
from kvbench.commands.arguments import MULTIRUN_FLAGS, renamed_slo_flag
from kvbench.commands.help import wants_help
from kvbench.commands.signals import handle_sigterm, signal_number
from kvbench.errors import ConfigError, error_line, visible

# pandas, pyarrow, rich tables and matplotlib are imported where results are written or printed,
# not here: `kvbench --help`, `--version`, tab completion and a typo stay fast

ConfigStore.instance().store(name="kvbench_schema", node=KvbenchConfig)


@dataclass(frozen=True)
class Subcommand:
    """A ``kvbench <name> ...`` command. Its entry in SUBCOMMANDS is all there is to add: the
    dispatch, ``kvbench --help``'s list and tab completion all read it."""

    #: the module whose ``main()`` runs it (it reads ``sys.argv[1:]``)
    module: str
    #: its one line on ``kvbench --help``
    summary: str
    #: the config its ``key=value`` arguments override, for tab completion (None: it takes none,
    #: and the shell completes file names)
    config_name: str | None = None


#: ``kvbench <subcommand> ...``, in the order ``kvbench --help`` lists them
SUBCOMMANDS = {
    "bench-kernels": Subcommand(
        "kvbench.commands.bench_kernels", "the attention-kernel benchmark (needs a CUDA GPU)", "bench_kernels"
    ),
    "calibrate": Subcommand(
        "kvbench.commands.calibrate", "fit the simulator's efficiencies to real runs' measured steps"
    ),
    "compare": Subcommand(
        "kvbench.commands.compare", "two runs or sweeps against tolerances (exit status 1: a metric moved)"
    ),
    "diff-engine": Subcommand(
        "kvbench.commands.diff_engine",
        "kvbench's scheduling decisions against another engine's, step by step",
        "config",
    ),
    "paper": Subcommand("kvbench.commands.paper", "regenerate paper/: the lecture's and the vLLM paper's numbers"),
    "profiles": Subcommand("kvbench.commands.profiles", "the public measured tables kvbench prices runs with, per GPU"),
    "slo-batch": Subcommand(
        "kvbench.commands.slo_batch",
        "the largest decode-only batch meeting slo.tpot_s, beside the memory ceiling",
        "config",
    ),
    "slo-search": Subcommand(
        "kvbench.commands.slo_search", "the largest arrival rate or batch cap whose runs meet the slo.* SLOs", "config"
    ),
    "validate": Subcommand("kvbench.commands.validate", "kvbench's clocks against public measurements of real engines"),
}


def _subcommand_list() -> str:
    """``kvbench --help``'s list of subcommands (the ``${kvbench_subcommands:}`` in ``hydra.help``)."""
    from kvbench.commands.help import subcommand_lines

    return subcommand_lines({name: sub.summary for name, sub in SUBCOMMANDS.items()})


# resolved only when the help page is rendered, by kvbench or by Hydra itself
OmegaConf.register_new_resolver("kvbench_subcommands", _subcommand_list, replace=True)


#: jobs of this command's multirun that failed or did not finish, counted from the sweep folder
#: at its end (a launcher may run jobs in other processes), for the exit status
FAILED_JOBS: list[str] = []


class _Current:
    """The job being run and its sweep folder: what an interruption reports."""

    job_dir: Path | None = None
    sweep_dir: Path | None = None
    #: the sweep this process launched to other processes or machines (a launcher other than
    #: Hydra's basic, in-process one), set when the multirun starts
    launched_sweep: Path | None = None


def _job_label(hc) -> str:
    return hc.job.override_dirname or "defaults"


def _notify_sinks(hook_name: str, **kwargs) -> None:
    from kvbench.plugins import plugin_manager

    try:
        getattr(plugin_manager().hook, hook_name)(**kwargs)
    except Exception as exc:  # noqa: BLE001 - a sink must never fail the run it reports
        warnings.warn(f"a {hook_name} plugin failed: {type(exc).__name__}: {exc}", stacklevel=1)


def _comparable(config: dict) -> dict:
    """A resolved config as it reads back from ``config.json``, less what only changes the display."""
    data = json.loads(json.dumps(config, default=str))
    data.pop("progress", None)
    data.pop("check_memory", None)
    return data


def _already_complete(out_dir: Path, cfg: DictConfig, label: str) -> bool:
    """A sweep re-run into its folder: this job finished before, with this very config, this very
    kvbench (version and commit) and the same calibration file; said in one line when it must be
    re-run for one of the last two."""
    from kvbench.app.run import recorded_config
    from kvbench.output.provenance import provenance
    from kvbench.output.results import finished_config, read_job
    from kvbench.specs.calibration import calibration_digest

    try:
        done = finished_config(out_dir)
    except ConfigError:
        return False  # a damaged config.json: not a result, run the job again
    if done is None or _comparable(done) != _comparable(recorded_config(cfg)):
        return False
    row = read_job(out_dir) or {}
    now = provenance()
    then = {key: row.get(key) for key in now}
    if then != now:
        was = f"kvbench {then['kvbench_version']} (commit {then['kvbench_commit']})"
        print(
            f"kvbench: job {label} in {out_dir} was computed by {was}, not by this kvbench {now['kvbench_version']} "
            f"(commit {now['kvbench_commit']}): re-running it",
            file=sys.stderr,
        )
        return False
    try:
        digest = calibration_digest(str(cfg.hardware.name), str(cfg.kernel.name), cfg.get("calibration_dir"))
    except ConfigError:
        return False  # the job itself will say what is wrong with the file
    if row.get("calibration_sha256", "") != digest:
        print(
            f"kvbench: job {label} in {out_dir} was computed with another calibration file (sha256 "
            f"{row.get('calibration_sha256') or 'none'}, now {digest or 'none'}): re-running it",
            file=sys.stderr,
        )
        return False
    return True


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    startup_gc.end()  # the config is composed: the run's own work, the collector back on
    from kvbench.app.progress import phase_progress
    from kvbench.app.run import execute  # after Hydra has parsed: `kvbench --help` stays fast
    from kvbench.output.results import check_run_targets, write_failure, write_run
    from kvbench.output.run_report import print_summary
    from kvbench.output.step_files import StepFilesError

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    label = _job_label(hc)
    _Current.job_dir, _Current.sweep_dir = out_dir, Path(hc.sweep.dir) if multirun else None

    def fail(reason: str) -> None:
        if not multirun:
            print(error_line("kvbench", reason), file=sys.stderr)
            # the folder Hydra made for this run holds only Hydra's files: no result, so no folder
            from kvbench.app.folders import remove_refused_run

            remove_refused_run(out_dir, OmegaConf.to_container(hc.run, resolve=False)["dir"], hc.output_subdir)
            sys.exit(2)
        # NOTE: a bad job must not stop the sweep: record it, and the final table shows why
        try:
            write_failure(out_dir, label, reason)
        except (OSError, ConfigError):
            pass  # the disk that failed the run may fail this record too; the line below still says why
        print(visible(f"kvbench: job {hc.job.num} ({label}) failed: {reason}"), file=sys.stderr)

    if multirun and _already_complete(out_dir, cfg, f"{hc.job.num} ({label})"):
        print(f"kvbench: job {hc.job.num} ({label}) already complete in {out_dir}: skipped", file=sys.stderr)
        return
    # the step table goes to its files as the run goes (a long run's table is most of its memory)
    steps_dir = out_dir if cfg.output.write and cfg.output.steps else None
    try:
        if cfg.output.write:  # a FIFO, a device or a folder where a result goes: said before the run
            check_run_targets(out_dir)
        result = execute(cfg, dict(hc.runtime.choices), steps_dir=steps_dir)
    except ConfigError as exc:
        from kvbench.app.overrides import with_suggestion

        fail(with_suggestion(str(exc)))  # `preemption.victim='newst'`: did you mean `newest`?
        return
    except StepFilesError as exc:  # the step table, written as the run goes: a full disk, a folder removed
        fail(
            f"could not write the results to {out_dir}: {exc.strerror or exc}; "
            "free space or write elsewhere with hydra.run.dir=<folder>"
        )
        return
    result.summary["job"] = label
    if cfg.output.write:
        try:
            write_run(
                result,
                out_dir,
                steps=cfg.output.steps,
                figures=cfg.output.figures,
                progress=phase_progress(bool(cfg.progress)),
            )
        except OSError as exc:  # a full disk, a folder removed under the run: nothing is marked complete
            fail(
                f"could not write the results to {out_dir}: {exc.strerror or exc}; "
                "free space or write elsewhere with hydra.run.dir=<folder>"
            )
            return
        except ConfigError as exc:  # a result's name became a FIFO, a device or a folder during the run
            fail(str(exc))
            return
    if not multirun:  # the numbers first: a sink (W&B) takes seconds and may say where its files went
        print_summary(result.summary, out_dir if cfg.output.write else None)
    _notify_sinks("kvbench_run_finished", result=result)


def _interrupted(exc: KeyboardInterrupt) -> NoReturn:
    """One line: what was interrupted, what is left incomplete, how to finish; exit 128 + signal."""
    from kvbench.io.atomic import is_complete

    signum = signal_number(exc)
    parts = [f"kvbench: interrupted by {signal.Signals(signum).name}"]
    job, sweep = _Current.job_dir, _Current.sweep_dir
    if job is not None and not is_complete(job):
        parts.append(f"{job} is incomplete (no COMPLETE marker: never read as a result)")
    if sweep is not None:
        done = sum(is_complete(d) for d in sweep.iterdir() if d.is_dir() and d.name.isdigit())
        parts.append(
            f"{done} job(s) complete in {sweep}; finish the rest by running the same command "
            f"with hydra.sweep.dir={sweep} (finished jobs are skipped)"
        )
    print("; ".join(parts), file=sys.stderr)
    sys.exit(128 + signum)


def _compose_error(exc: Exception, args: list[str]) -> NoReturn:
    """Hydra refused the command line (bad override, unknown option or key, wrong type, in any
    job of a sweep): one line, exit 2, before anything ran."""
    from kvbench.app.overrides import hydra_error_line

    print(error_line("kvbench", hydra_error_line(exc, args)), file=sys.stderr)
    sys.exit(2)


def _launcher_failed(exc: Exception, sweep_dir: Path) -> NoReturn:
    """A launcher lost a job (a worker killed, a cluster job cancelled) and raised here, in the
    launching process: one line, the table of what did finish (the lost job reads as incomplete),
    and exit 1; re-running the same command into the same folder finishes the rest."""
    from kvbench.output.report import print_comparison

    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "no message"
    print(
        f"kvbench: error: a job did not finish under the launcher ({type(exc).__name__}: {detail}); "
        f"re-run the command with hydra.sweep.dir={sweep_dir} to finish the sweep (finished jobs are skipped)",
        file=sys.stderr,
    )
    if sweep_dir.is_dir():
        frame = print_comparison(sweep_dir)
        if not frame.empty:
            _notify_sinks("kvbench_sweep_finished", sweep_dir=sweep_dir, comparison=frame)
    sys.exit(1)


def _raised_by_hydra(exc: BaseException) -> bool:
    """Whether Hydra itself raised ``exc`` (its innermost frame is in Hydra's package)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}hydra{os.sep}" in tb.tb_frame.f_code.co_filename


def _unknown_flag(args: list[str]) -> str | None:
    """One line for an option Hydra's command line does not have (``--frobnicate``), or for a
    flag missing its value: Hydra's parser would print its whole usage block above the error."""
    import argparse
    import difflib

    from hydra._internal.utils import get_args_parser

    if not any(arg.startswith("-") for arg in args):
        return None
    parser = get_args_parser()
    problems: list[str] = []

    def error(message: str) -> None:
        problems.append(message)
        raise argparse.ArgumentError(None, message)

    parser.error = error  # type: ignore[method-assign]
    try:
        _, rest = parser.parse_known_args(args)
    except (argparse.ArgumentError, SystemExit):
        return f"{problems[0] if problems else 'the command line is invalid'} (see kvbench --help)"
    flags = [a for a in rest if a.startswith("-")]
    if not flags:
        return None
    known = sorted(o for o in parser._option_string_actions if o.startswith("--"))
    guess = difflib.get_close_matches(flags[0].split("=", 1)[0], known, n=1)
    hint = f" (did you mean {guess[0]}?)" if guess else ""
    return f"unrecognized option {flags[0].split('=', 1)[0]!r}{hint}; see kvbench --help for the options"


def _hydra_os_error(exc: OSError, args: list[str]) -> NoReturn:
    """Hydra could not read or write a file (its config search, ``.hydra/``, the job's log): one line."""
    import errno

    if exc.errno == errno.ENAMETOOLONG:
        longest = max(args, key=len, default="")
        print(
            error_line(
                "kvbench",
                f"{longest[:40]!r}... ({len(longest):,} characters) is too long: a config group's "
                "option is a file name, at most 255 bytes",
            ),
            file=sys.stderr,
        )
    else:
        print(
            error_line(
                "kvbench",
                f"could not {'write' if exc.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES) else 'use'} "
                f"{exc.filename or 'a file'}: {exc.strerror or exc}; free space or write elsewhere "
                "with hydra.run.dir=<folder> (hydra.sweep.dir=<folder> for a sweep)",
            ),
            file=sys.stderr,
        )
    sys.exit(2)


#: the module of composed_once, whose wrappers run inside Hydra's composing
_COMPOSE_ONCE = os.path.join("kvbench", "app", "compose_once.py")


def _raised_within_hydra(exc: BaseException) -> bool:
    """Whether ``exc`` came from Hydra's own work (composing, saving ``.hydra/``, logging): Hydra's
    frames and the standard library's below them, none of kvbench's (a job's own error)."""
    tb, inside = exc.__traceback__, False
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if f"{os.sep}hydra{os.sep}" in name or name.endswith(_COMPOSE_ONCE):
            inside = True  # composed_once's frames stand between Hydra's own: Hydra's work still
        elif inside and (f"{os.sep}kvbench{os.sep}" in name or f"{os.sep}plugins{os.sep}" in name):
            return False
        tb = tb.tb_next
    return inside


def _not_a_subcommand(args: list[str]) -> str | None:
    """One line for a first argument that is neither a subcommand nor an override (``kvbench
    compar a b``, ``kvbench slo_batch``): Hydra would call it an override it cannot parse."""
    from kvbench.errors.suggest import did_you_mean

    first = args[0] if args else ""
    if not first or first.startswith(("-", "+", "~")) or "=" in first:
        return None
    guess = did_you_mean(first, SUBCOMMANDS)
    return (
        f"{first!r} is neither a kvbench subcommand nor a key=value override; {guess + ' ' if guess else ''}"
        f"subcommands: {', '.join(SUBCOMMANDS)} (kvbench --help says what each does)"
    )


def main() -> None:
    """Console entry point."""
    args = sys.argv[1:]
    if args and args[0] in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[args[0]].module)
        sys.argv = [f"{sys.argv[0]} {args[0]}", *args[1:]]
        startup_gc.end()  # the subcommand's own work: the collector back on
        module.main()
        return
    from kvbench.commands.completion import query_shell

    shell = query_shell(args)
    if shell is not None:  # a TAB: answered without composing more than the answer needs
        from kvbench.commands.completion import answer

        print(answer(shell, SUBCOMMANDS))
        return
    refused = _not_a_subcommand(args) or renamed_slo_flag(args)
    if refused:
        print(error_line("kvbench", refused), file=sys.stderr)
        sys.exit(2)
    if "--version" in args:  # kvbench's version, not Hydra's
        from kvbench.output.provenance import version_line

        print(version_line())
        return
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    # `kvbench a=1 -m b=1,2` as users type it: Hydra's parser takes overrides only after its flags
    flags = [arg for arg in args if arg in MULTIRUN_FLAGS]
    if flags and args[: len(flags)] != flags:
        args = [*flags, *(arg for arg in args if arg not in MULTIRUN_FLAGS)]
        sys.argv[1:] = args
    # Hydra re-raises its errors instead of printing them over several lines, so that they become
    # one line below; a user who set HYDRA_FULL_ERROR=1 gets Hydra's full report as usual
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    register_searchpath()  # plugins' config folders join Hydra's search path
    if wants_help(args):  # Hydra's help page, without its cost of listing Hydra's own groups
        from kvbench.commands.help import print_page, render_help

        try:
            page = render_help(args)
        except (HydraException, OmegaConfBaseException) as exc:
            if full_error:
                raise
            _compose_error(exc, args)
        print_page(page)
        return
    handle_sigterm()
    from kvbench.app.config import wandb_refusal
    from kvbench.app.overrides import bool_override_error

    unknown = _unknown_flag(args) or bool_override_error(args) or wandb_refusal(args)
    if unknown:
        print(error_line("kvbench", unknown), file=sys.stderr)
        sys.exit(2)
    with ExitStack() as held:
        try:
            fixed_dir = prepare_output(args)
            if fixed_dir is not None:  # two runs into one named folder would mix their files
                from kvbench.io.atomic import folder_lock

                held.enter_context(folder_lock(fixed_dir))
            with composed_once():  # Hydra would compose the config twice
                _hydra_main()
        except KeyboardInterrupt as exc:
            _interrupted(exc)
        except ConfigError as exc:
            from kvbench.app.overrides import with_suggestion

            print(error_line("kvbench", with_suggestion(str(exc))), file=sys.stderr)
            sys.exit(2)
        except (HydraException, OmegaConfBaseException) as exc:
            if full_error:
                raise
            _compose_error(exc, args)
        except ValueError as exc:  # Hydra's own flag checks ("Only one of --run, --multirun, --cfg...")
            if full_error or not _raised_by_hydra(exc):
                raise
            print(error_line("kvbench", exc), file=sys.stderr)
            sys.exit(2)
        except OSError as exc:
            if full_error or not _raised_within_hydra(exc):
                raise
            _hydra_os_error(exc, args)
        except Exception as exc:
            if full_error or _Current.launched_sweep is None:
                raise
            _launcher_failed(exc, _Current.launched_sweep)
    if FAILED_JOBS:
        sys.exit(1)


class ComparisonTable(Callback):
    """Hydra callback: at the end of a multirun, print and save one table comparing its jobs, hand
    it to the sinks, and count the jobs that failed or did not finish (for the exit status)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        # the sweep's own work: with a launcher that runs the jobs elsewhere, no job ends start-up here
        startup_gc.end()
        # in-process jobs raise their own errors (a bug keeps its traceback); a launcher's are caught
        if not str(config.hydra.launcher.get("_target_", "")).endswith(".BasicLauncher"):
            _Current.launched_sweep = Path(config.hydra.sweep.dir)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from kvbench.output.report import print_comparison

        sweep_dir = Path(config.hydra.sweep.dir)
        frame = print_comparison(sweep_dir)
        if frame.empty:
            return
        # read from the folder, not from this process: a launcher may have run the jobs elsewhere
        FAILED_JOBS[:] = [str(job) for job in frame.loc[frame["failed"], "job"]]
        _notify_sinks("kvbench_sweep_finished", sweep_dir=sweep_dir, comparison=frame)
