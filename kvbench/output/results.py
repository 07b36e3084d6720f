"""A finished run and how it is written to ``results/``: Parquet (source of truth), CSV, one JSON
of the summary (``summary.json``, :mod:`kvbench.output.run_json`), config, figure.

Every file is written whole or not at all, and ``COMPLETE`` is written last (see
:mod:`kvbench.io.atomic`): a folder without it holds an interrupted run, which readers flag
and never read as a result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kvbench.errors import ConfigError
from kvbench.io.atomic import (
    COMPLETE,
    check_complete,
    check_targets,
    clear_incomplete,
    mark_complete,
    whole_or_none,
    write_json,
    write_table,
)
from kvbench.io.table import ColumnTable
from kvbench.io.textio import read_json_object
from kvbench.output.run_json import run_json
from kvbench.output.step_files import (
    STEP_FILES,
    largest_value,
    read_step_columns,
    step_file_column_max,
    step_file_rows,
)

if TYPE_CHECKING:
    import pandas as pd

TABLES = ("summary", "requests", "steps", "refusals")
FAILED = "failed.json"
#: the summary as one JSON object, with ``vllm bench serve``'s names where they overlap
SUMMARY_JSON = "summary.json"
#: every name a run may write: cleared before a run is rewritten into the same folder, so that a
#: table left by an earlier run with other options (``output.steps=true``) cannot mix in
RESULT_FILES = (
    *(f"{table}.{ext}" for table in TABLES for ext in ("parquet", "csv")),
    SUMMARY_JSON,
    "config.json",
    "memory.png",
    "prefix_cache.png",
    "deployment.png",  # a disaggregated run's figure (deployment=disagg), in place of the two above
    FAILED,
    COMPLETE,
)


def _frame_property(name: str, columns: str) -> property:
    """``RunResult.<name>``: the table held in ``columns`` as a DataFrame, made on first use;
    setting a DataFrame (or a ColumnTable, or None) replaces both."""

    def get(self: RunResult) -> pd.DataFrame | None:
        return self._frame(name, getattr(self, columns))

    def set_(self: RunResult, table: ColumnTable | pd.DataFrame | None) -> None:
        self._frames.pop(name, None)
        setattr(self, columns, self._keep(name, table))

    return property(get, set_)


class RunResult:
    """One job's outputs. ``summary`` is one row; ``out_dir`` is set once written.

    Its tables are held as :class:`~kvbench.io.table.ColumnTable` (``request_columns``,
    ``step_columns``, ``refusal_columns``): summarizing, writing and drawing them imports no
    pandas. ``requests``, ``steps`` and ``refusals`` are the same tables as DataFrames, made on
    first use (a DataFrame given to the constructor, or set, is kept as it is; setting one
    replaces its columns too). What is written is the columns: a column added to a DataFrame in
    place is not, until the frame is set back (``result.steps = frame``).

    ``steps`` is None when the run wrote its step table to its folder as it went
    (``steps_file``: its ``steps.parquet``; :meth:`step_table` reads it back)."""

    def __init__(
        self,
        config: dict[str, Any],
        summary: dict[str, Any],
        requests: ColumnTable | pd.DataFrame | None,
        steps: ColumnTable | pd.DataFrame | None,
        refusals: ColumnTable | pd.DataFrame | None,
        out_dir: Path | None = None,
        steps_file: Path | None = None,
    ) -> None:
        self.config = config
        self.summary = summary
        self.out_dir = out_dir
        self.steps_file = steps_file
        self._frames: dict[str, pd.DataFrame | None] = {}
        self.request_columns = self._keep("requests", requests)
        self.step_columns = self._keep("steps", steps)
        self.refusal_columns = self._keep("refusals", refusals)

    def _keep(self, name: str, table: ColumnTable | pd.DataFrame | None) -> ColumnTable | None:
        if table is None or isinstance(table, ColumnTable):
            return table
        self._frames[name] = table
        return ColumnTable.from_pandas(table)

    def _frame(self, name: str, table: ColumnTable | None) -> pd.DataFrame | None:
        if name not in self._frames:
            self._frames[name] = None if table is None else table.to_pandas()
        return self._frames[name]

    requests = _frame_property("requests", "request_columns")
    steps = _frame_property("steps", "step_columns")
    refusals = _frame_property("refusals", "refusal_columns")

    def summary_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([self.summary])

    def step_table(self, columns: Sequence[str] | None = None, every: int = 1) -> ColumnTable:
        """The step table, held or read back from its file (``columns``: at least those of them it
        has, and every ``every``-th row from the first; a table read back has only those)."""
        if self.step_columns is not None:
            return self.step_columns.every(every)
        if self.steps_file is None:
            raise ValueError("this run kept no step table (no steps and no steps_file)")
        return read_step_columns(self.steps_file, columns, every)

    def num_step_rows(self) -> int:
        """The step table's rows, held or in its file."""
        if self.step_columns is not None:
            return len(self.step_columns)
        if self.steps_file is None:
            raise ValueError("this run kept no step table (no steps and no steps_file)")
        return step_file_rows(self.steps_file)

    def step_column_max(self, name: str) -> float | None:
        """The largest value of a step-table column (NaN ignored), held or in its file; None when
        the table has no such column or no value (a file answers from its footer)."""
        if self.step_columns is not None:
            if name not in self.step_columns:
                return None
            return largest_value(np.asarray(self.step_columns[name], dtype=float))
        if self.steps_file is None:
            raise ValueError("this run kept no step table (no steps and no steps_file)")
        return step_file_column_max(self.steps_file, name)


def check_run_targets(out_dir: Path) -> None:
    """Refuse, in one line, a run folder where a name the run writes is a FIFO, a device, a socket
    or a folder (:func:`kvbench.io.atomic.check_target`): checked before the run, and again before an
    earlier run's files are cleared."""
    check_targets(
        out_dir,
        RESULT_FILES,
        "remove it or write elsewhere (hydra.run.dir=<folder>, hydra.sweep.dir=<folder> for a sweep)",
    )


def clear_run(out_dir: Path, keep: Collection[str] = ()) -> None:
    """Remove what an earlier (finished, failed or interrupted) run left in ``out_dir``, but the
    files named in ``keep`` (this run's own, written as it went). Refused, before anything is
    removed, when one of those names is not a regular file (a FIFO, a device, a folder: the user's)."""
    check_run_targets(out_dir)
    clear_incomplete(out_dir)
    for name in RESULT_FILES:
        if name not in keep:
            (out_dir / name).unlink(missing_ok=True)


#: how writing shows progress: ``progress(total, description)`` is a context manager that yields
#: ``advance(n)`` (:func:`kvbench.app.progress.phase_progress` binds it to a terminal's bar)
Progress = Callable[[int, str], AbstractContextManager[Callable[[int], None]]]


def _no_progress(total: int, description: str) -> AbstractContextManager[Callable[[int], None]]:
    return contextlib.nullcontext(lambda n: None)


def write_run(
    result: RunResult, out_dir: Path, *, steps: bool = True, figures: bool = True, progress: Progress | None = None
) -> Path:
    """Write the run's tables as Parquet and CSV, its summary as JSON, its resolved config and its
    memory figure, then the ``COMPLETE`` marker that makes the folder a result. ``progress`` counts
    the files (a second or more on a long trace: the steps table, the figures). A step table the
    run already wrote to ``out_dir`` as it went (``result.steps_file``) is kept as it is."""
    out_dir.mkdir(parents=True, exist_ok=True)
    streamed = result.steps is None and result.steps_file is not None and result.steps_file.parent == out_dir
    clear_run(out_dir, keep=STEP_FILES if streamed else ())
    tables = {
        "summary": ColumnTable.from_row(result.summary),
        "requests": result.request_columns,
        "refusals": result.refusal_columns,
    }
    if steps and not streamed:  # (a table streamed to another folder is read back to be copied)
        tables["steps"] = result.step_table()
    num_rows = result.num_step_rows() if figures else 0
    plotted = num_rows > 0
    # two files per table, the two JSON files, and the memory and prefix-cache figures
    num_files = 2 * len(tables) + 2 + (2 if plotted else 0)
    written = list(STEP_FILES) if streamed else []
    # a full disk or a signal part way: none of the run's files stay without the COMPLETE marker
    with whole_or_none(out_dir, RESULT_FILES), (progress or _no_progress)(num_files, "writing results") as advance:
        for name, table in tables.items():
            write_table(table, out_dir, name)
            written += [f"{name}.parquet", f"{name}.csv"]
            advance(2)
        write_json(out_dir / SUMMARY_JSON, run_json(result.summary, result.request_columns, result.config))
        write_json(out_dir / "config.json", result.config)
        written += [SUMMARY_JSON, "config.json"]
        advance(2)
        if plotted and result.summary.get("deployment") == "disagg":  # several workers: their own figure
            from kvbench.output.deployment_figure import plot_deployment

            plot_deployment(result.step_table(), result.request_columns, result.summary, out_dir / "deployment.png")
            written.append("deployment.png")
            advance(2)
        elif plotted:
            from kvbench.output.figures import (
                CACHE_STEP_COLUMNS,
                TIMELINE_STEP_COLUMNS,
                draws_prefix_cache,
                plot_memory_timeline,
                plot_prefix_cache,
                thinning,
            )

            # a table streamed to its file is read back for what each figure draws, no more
            timeline = result.step_table(TIMELINE_STEP_COLUMNS, every=thinning(num_rows))
            plot_memory_timeline(timeline, result.summary, out_dir / "memory.png")
            del timeline
            written.append("memory.png")
            advance(1)

            # hit rate over time and cached bytes: only when the run cached prefixes or could have.
            # Whether it did is decided before the step table is read back (a table streamed to its
            # file answers from its footer): a run without a prefix cache reads none of its rows
            # (reading three columns of a 100,000-request run's table set its peak memory)
            def cached_any() -> bool:
                return (result.step_column_max("cached_bytes") or 0.0) > 0

            requests = result.request_columns
            if draws_prefix_cache(requests, result.summary, cached_any) and plot_prefix_cache(
                requests, result.step_table(CACHE_STEP_COLUMNS), result.summary, out_dir / "prefix_cache.png"
            ):
                written.append("prefix_cache.png")
            advance(1)
        mark_complete(out_dir, written)
    result.out_dir = out_dir
    return out_dir


def write_failure(out_dir: Path, label: str, reason: str) -> None:
    """Record a job that stopped on bad input, so a multirun's table can show it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    clear_run(out_dir)
    write_json(out_dir / FAILED, {"job": label, "error": reason})


def finished_config(out_dir: Path) -> dict | None:
    """The resolved config of the complete run in ``out_dir``, or None when there is none (no
    complete, untouched run there). A ConfigError when its config.json cannot be read."""
    if check_complete(out_dir, RESULT_FILES) is not None or not (out_dir / "config.json").is_file():
        return None
    return read_json_object(out_dir / "config.json", "result config")


def _job_label(job_dir: Path) -> str:
    """A job's overrides as Hydra saved them when it started (``.hydra/overrides.yaml``)."""
    overrides = job_dir / ".hydra" / "overrides.yaml"
    try:
        return ",".join(map(str, OmegaConf.load(overrides))) or "defaults"
    except (OSError, ValueError, OmegaConfBaseException):
        return job_dir.name


def read_job(job_dir: Path) -> dict[str, Any] | None:
    """A job folder's summary row, a failure row, a row flagging an incomplete or damaged run, or
    None when the folder holds nothing of a run. An incomplete or damaged run's tables are never
    read: a folder is a result only when its COMPLETE marker lists exactly its files, with their
    sizes (:func:`kvbench.io.atomic.check_complete`)."""
    marker = (job_dir / COMPLETE).is_file()
    problem = check_complete(job_dir, RESULT_FILES) if marker else None
    if marker and problem is None:
        try:
            import pandas as pd

            return pd.read_parquet(job_dir / "summary.parquet").iloc[0].to_dict()
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged file have no common base
            problem = (
                f"summary.parquet cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            )
    if problem is not None:
        return {
            "failed": True,
            "status": "damaged",
            "job": _job_label(job_dir),
            "error": f"{problem}; not read: re-run it",  # the status says "damaged": said once
        }
    failed = job_dir / FAILED
    if failed.is_file():
        try:
            record = read_json_object(failed, "failure record")
        except ConfigError as exc:
            record = {"error": str(exc)}
        return {"failed": True, "status": "failed", **record}
    # Hydra writes .hydra/ when a job starts: a job killed before writing anything is incomplete too
    started = (job_dir / ".hydra").is_dir()
    if started or any((job_dir / name).exists() for name in RESULT_FILES) or any(job_dir.glob(".tmp-*")):
        return {
            "failed": True,
            "status": "incomplete",
            "job": _job_label(job_dir),
            # the status says "incomplete": the error says why, once
            "error": "no COMPLETE marker: the run was interrupted or could not finish writing; not read: re-run it",
        }
    return None
