"""Progress for long work, on stderr: a bar on a terminal, a plain line every 10 s elsewhere.

Every phase of a run that can take over a second shows what is done of its total: the simulation
(requests finished), the offline prefix-cache bounds (requests, per pass), writing the results
(files), W&B, ``kvbench paper`` (runs), ``kvbench validate`` (replays), ``kvbench slo-search``
(probes). On a terminal it is a bar with an estimate of the time left; a bar is transient: it is
gone when its phase ends, and what stays on the screen is kvbench's table and lines. Where stderr
is no terminal (a pipe, a file, a CI log) a phase that runs past :data:`PLAIN_INTERVAL_S` says
where it is in one plain line each :data:`PLAIN_INTERVAL_S` seconds (what phase, done/total,
seconds so far) and in one more when it ends, so that a long job in a log shows it is alive; a
short phase says nothing. stdout is never touched: it holds kvbench's tables and lines only.

In a sweep, each bar and line says which job it belongs to (``job 2/3 allocator=paged``): the
sweep's Hydra callback (:mod:`kvbench.app.sweep_progress`) sets the :class:`Job` this process is
running. When a launcher runs jobs side by side in worker processes, their bars would overwrite
one another on the one terminal: each job then says in one line when it starts and when it ends
(plain lines, one per line, still go to a log).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import visible

#: the longest job label a bar shows (a sweep over long values would push the bar off the screen)
LABEL_CHARS = 48
#: seconds between two plain progress lines where stderr is no terminal: a CI log shows a long
#: phase is alive without a line per request
PLAIN_INTERVAL_S = 10.0
#: how often a phase's plain progress checks whether a line is due while nothing advances (one
#: request, probe or file that takes minutes still gets its line every PLAIN_INTERVAL_S)
PLAIN_POLL_S = 1.0
#: a plain progress line is cut to this many characters (a log read at the report's width)
PLAIN_LINE_CHARS = 100

#: the clock plain progress reads (seconds; tests give a fake one)
monotonic = time.monotonic


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
    """One line on stderr, only on a terminal (where a job starts and ends: in a pipe or a log, its
    plain progress lines name the job)."""
    if not enabled:
        return
    console = _stderr_console()
    if console.is_terminal:
        console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)


def _ignore(n: int, note: str | None = None) -> None:
    pass


#: one lock for every phase's plain progress in this process (the work's thread and the tickers)
_plain_lock = threading.Lock()
#: when this process last wrote a plain progress line, any phase's: a line is due only after
#: PLAIN_INTERVAL_S of silence, so a sweep's lines and its job's phase lines never double up
_last_line_s = float("-inf")


class PlainProgress:
    """A phase's progress as plain lines (for a pipe, a file, a CI log): one when
    :data:`PLAIN_INTERVAL_S` seconds have passed since the phase began and since the process's
    last progress line, one more when a phase that said something ends. ``write`` takes a line;
    ``clock`` gives seconds. :meth:`advance` and :meth:`tick` may be called from several threads
    (the work and a ticker)."""

    def __init__(
        self,
        total: int | None,
        description: str,
        *,
        write: Callable[[str], None],
        unit: str = "",
        header: str | None = None,
        clock: Callable[[], float] | None = None,
        interval_s: float = PLAIN_INTERVAL_S,
    ) -> None:
        self.total, self.description, self.unit, self.header = total, description, unit, header
        self._write, self._clock, self._interval_s = write, clock or monotonic, interval_s
        self.done = 0
        self.note: str | None = None
        self._started_s = self._last_s = self._clock()
        self.lines = 0  #: lines written so far

    def advance(self, n: int, note: str | None = None) -> None:
        with _plain_lock:
            self.done += n
            if note is not None:
                self.note = note
            self._due()

    def tick(self) -> None:
        """Write a line if one is due (the ticker's call: the work itself may not advance for minutes)."""
        with _plain_lock:
            self._due()

    def finish(self) -> None:
        """The phase is over: one line saying so, where it said anything before (a short phase stays silent)."""
        with _plain_lock:
            if self.lines:
                now = self._clock()
                self._say(f"done, {self._count()} in {now - self._started_s:.0f} s", now)

    def _due(self) -> None:
        now = self._clock()
        if now - max(self._last_s, _last_line_s) < self._interval_s:
            return
        self._last_s = now
        elapsed_s = now - self._started_s
        where = f"{self._count()}, {elapsed_s:.0f} s so far"
        if self.total and 0 < self.done < self.total:
            where += f", about {elapsed_s * (self.total - self.done) / self.done:.0f} s left"
        self._say(where + (f" ({self.note})" if self.note else ""), now)

    def _count(self) -> str:
        of = f"/{self.total:,}" if self.total is not None else ""
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        return f"{self.done:,}{of}{f' {self.unit}' if self.unit else ''}{share}"

    def _say(self, what: str, now: float) -> None:
        global _last_line_s
        # "kvbench paper: ..." names itself; any other phase says whose it is
        name = self.description if self.description.startswith("kvbench") else f"kvbench: {self.description}"
        if self.header:
            name = f"kvbench: {self.header}: {self.description}"
        line = visible(f"{name}: {what}")
        self._write(line if len(line) <= PLAIN_LINE_CHARS else line[: PLAIN_LINE_CHARS - 3] + "...")
        self.lines += 1
        _last_line_s = now


class Ticker:
    """A daemon thread that gives a :class:`PlainProgress` its due lines while the work does not
    advance it (one request, probe or file can take minutes)."""

    def __init__(self, plain: PlainProgress, poll_s: float | None = None) -> None:
        self._plain = plain
        self._poll_s = PLAIN_POLL_S if poll_s is None else poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvbench-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            self._plain.tick()

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def _ticking(plain: PlainProgress, poll_s: float | None = None) -> Iterator[None]:
    ticker = Ticker(plain, poll_s).start()
    try:
        yield
    finally:
        ticker.stop()


def _plain_writer(console) -> Callable[[str], None]:
    def write(line: str) -> None:
        console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)

    return write


#: a sweep's own plain progress (jobs done), where its jobs run in this process and stderr is no terminal
_sweep: tuple[PlainProgress, Ticker] | None = None


def start_sweep(num_jobs: int | None, *, enabled: bool) -> None:
    """A sweep of ``num_jobs`` jobs run one after another in this process begins: where stderr
    is no terminal, a line each PLAIN_INTERVAL_S of silence says how many jobs are done (between
    two jobs, or in a job's phases too short to say anything themselves)."""
    global _sweep
    end_sweep()
    console = _stderr_console()
    if not enabled or console.is_terminal:
        return
    plain = PlainProgress(num_jobs, "sweep", write=_plain_writer(console), unit="jobs")
    _sweep = (plain, Ticker(plain).start())


def sweep_job_done() -> None:
    if _sweep is not None:
        _sweep[0].advance(1)


def end_sweep() -> None:
    global _sweep
    if _sweep is not None:
        plain, ticker = _sweep
        _sweep = None
        ticker.stop()
        plain.finish()


@contextlib.contextmanager
def progress_bar(
    total: int | None, description: str, *, enabled: bool, unit: str = ""
) -> Iterator[Callable[..., None]]:
    """Yield ``advance(n, note=None)``. When ``enabled``: on a terminal (stderr), a bar with the
    description, done/total ``unit`` and the time left (``total`` None: the count alone, no
    estimate), above it the sweep job's name, below it ``note`` (what is being done now), every
    line cut to the terminal's width; elsewhere, :class:`PlainProgress` lines on stderr. Jobs
    run side by side draw no bars (they would overwrite one another) but do write plain lines."""
    job = current_job()
    if not enabled:
        yield _ignore
        return
    console = _stderr_console()
    header = job.name if job is not None else None
    if not console.is_terminal:
        plain = PlainProgress(total, description, write=_plain_writer(console), unit=unit, header=header)
        with _ticking(plain):
            yield plain.advance
        plain.finish()
        return
    if job is not None and job.parallel:
        yield _ignore
        return
    with _progress(console, unit, header, estimate=total is not None) as progress:
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
    # stdout is left alone where it is a pipe or a file: what it receives never depends on whether
    # stderr is a terminal; where it is this terminal too, its lines print above the bar, not over it
    return _Lines(*columns, console=console, transient=True, redirect_stdout=_stdout_on_terminal())


def _stdout_on_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced by an object without a file, or closed
        return False


def phase_progress(enabled: bool) -> Callable[[int, str], contextlib.AbstractContextManager[Callable[..., None]]]:
    """``progress(total, description)``: bars for the passes of a long computation in a layer below
    this one (``kvbench.metrics``, ``kvbench.output``), which cannot import this module."""
    return lambda total, description: progress_bar(total, description, enabled=enabled)
