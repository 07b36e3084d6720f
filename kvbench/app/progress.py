"""Progress for long work, on stderr and only on a terminal (never into a pipe, a file or a CI log).

Every phase of a run that can take over a second draws a bar with what is done of its total and
an estimate of the time left: the simulation (requests finished), the offline prefix-cache bounds
(requests, per pass), writing the results (files), W&B, ``kvbench paper`` (runs). A bar is
transient: it is gone when its phase ends, and what stays on the screen is kvbench's table and lines.

In a sweep, a line above each bar says which job it belongs to (``job 2/3 allocator=paged``): the
sweep's Hydra callback (:mod:`kvbench.app.sweep_progress`) sets the :class:`Job` this process is
running. When a launcher runs jobs side by side in worker processes, their bars would overwrite
one another on the one terminal: each job then says in one line when it starts and when it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import visible

#: the longest job label a bar shows (a sweep over long values would push the bar off the screen)
LABEL_CHARS = 48


@dataclass(frozen=True)
class Job:
    """The job of a sweep this process is running."""

    #: Hydra's job number (0-based: the job's folder name)
    num: int
    #: jobs in the sweep; None when the sweeper cannot say (a sweeper other than Hydra's basic one)
    num_jobs: int | None
    #: the job's swept values (``allocator=paged``); its overrides when what is swept is unknown
    label: str
    #: the sweep's folder, shared by its jobs whichever process or machine runs them
    sweep_dir: Path
    #: run by a launcher in a worker process beside other jobs: no bars, one line at start and end
    parallel: bool

    @property
    def name(self) -> str:
        """``job 2/3 allocator=paged``: counted from 1, as a person counts."""
        of = f"/{self.num_jobs}" if self.num_jobs is not None else ""
        label = visible(self.label, LABEL_CHARS)
        return f"job {self.num + 1}{of} {label}" if label else f"job {self.num + 1}{of}"


_job: Job | None = None


def current_job() -> Job | None:
    """The sweep job this process is running, or None (a single run, or kvbench used from Python)."""
    return _job


def set_current_job(job: Job | None) -> None:
    global _job
    _job = job


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def say(line: str, *, enabled: bool) -> None:
    """One line on stderr, only on a terminal (progress, not a result: nothing in a pipe or a log)."""
    if not enabled:
        return
    console = _stderr_console()
    if console.is_terminal:
        console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)


def _ignore(n: int, note: str | None = None) -> None:
    pass


@contextlib.contextmanager
def progress_bar(
    total: int | None, description: str, *, enabled: bool, unit: str = ""
) -> Iterator[Callable[..., None]]:
    """Yield ``advance(n, note=None)``; draws a bar on stderr when ``enabled`` and stderr is a
    terminal: the description, the bar, done/total ``unit`` and the time left (``total`` None: the
    count alone, no estimate); above it the sweep job's name, below it ``note`` (what is being done
    now) when one was given. Every line is cut to the terminal's width."""
    job = current_job()
    if not enabled or (job is not None and job.parallel):
        yield _ignore
        return
    console = _stderr_console()
    if not console.is_terminal:
        yield _ignore
        return
    with _progress(console, unit, job.name if job is not None else None, estimate=total is not None) as progress:
        task = progress.add_task(description, total=total)

        def advance(n: int, note: str | None = None) -> None:
            if note is not None:
                progress.note = visible(note)
            progress.advance(task, n)

        yield advance


def _progress(console, unit: str, header: str | None, *, estimate: bool):
    """A transient rich Progress of one bar, with a line above (``header``) and one below (its
    ``note``); the time left when ``estimate``, else the time spent."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column
    from rich.text import Text

    class _Lines(Progress):
        note = ""

        def get_renderables(self):
            if header:
                yield Text(header, no_wrap=True, overflow="ellipsis")
            yield self.make_tasks_table(self.tasks)
            if self.note:
                yield Text(self.note, no_wrap=True, overflow="ellipsis")

    columns = (
        TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
        BarColumn(bar_width=16),
        MofNCompleteColumn(table_column=Column(no_wrap=True)),
        *((TextColumn(unit, table_column=Column(no_wrap=True)),) if unit else ()),
        (TimeRemainingColumn if estimate else TimeElapsedColumn)(table_column=Column(no_wrap=True)),
        TextColumn("left" if estimate else "so far", table_column=Column(no_wrap=True)),
    )
    # stdout is left alone: what a pipe receives never depends on whether stderr is a terminal
    return _Lines(*columns, console=console, transient=True, redirect_stdout=False)


def phase_progress(enabled: bool) -> Callable[[int, str], contextlib.AbstractContextManager[Callable[..., None]]]:
    """``progress(total, description)``: bars for the passes of a long computation in a layer below
    this one (``kvbench.metrics``, ``kvbench.output``), which cannot import this module."""
    return lambda total, description: progress_bar(total, description, enabled=enabled)
