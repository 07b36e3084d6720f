"""One run's report on the terminal: its headline numbers, one screen (a sweep's comparison is
:mod:`kvbench.output.report`). Kept apart from the sweep's report, which builds its tables with
pandas: a run prints its summary without importing it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvbench.errors import ConfigError
from kvbench.io.textio import read_json_object
from kvbench.metrics.display import METRIC_DEFINITIONS, headline_rows
from kvbench.output.results import SUMMARY_JSON

#: the width a report is laid out for when the output is no terminal (a pipe, a CI log) and
#: ``COLUMNS`` is unset: a common terminal, so that a log reads as the screen did
REPORT_WIDTH = 100


def report_console() -> Console:
    """The console reports are laid out for: ``COLUMNS`` columns when set, else the terminal's
    width, else (a pipe or a log) :data:`REPORT_WIDTH` columns."""
    console = Console()  # rich itself takes COLUMNS from the environment when it is set
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return Console(width=REPORT_WIDTH)


def wide_console() -> Console:
    """The subcommands' console (``slo-*``, ``validate``, ``profiles``, ``diff-engine``): laid out
    as every report, :func:`report_console` (100 columns in a pipe or a log, where rich alone would
    squeeze a table into 80)."""
    return report_console()


def compact_table(title: str, headers: Iterable[str]) -> Table:
    """A table of right-aligned, unwrapped columns of numbers with units under its ``headers`` and
    no vertical rules or outer edge: the subcommands' many-column tables (``slo-batch``,
    ``slo-search``) fit 100 columns, a pipe's width, this way."""
    from rich import box

    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    return table


def _slo_from_config(out_dir: Path | None) -> bool | None:
    """Whether the run was given an SLO, from its ``config.json``; None when that is not known."""
    if out_dir is None:
        return None
    try:
        slo = read_json_object(out_dir / "config.json", "result config").get("slo")
    except ConfigError:
        return None
    return None if not isinstance(slo, dict) else any(value is not None for value in slo.values())


def print_summary(
    summary: dict, out_dir: Path | None, console: Console | None = None, *, slo_given: bool | None = None
) -> None:
    """Print a run's headline numbers (one screen) and where all of them are."""
    console = console or report_console()
    if slo_given is None:
        slo_given = _slo_from_config(out_dir)
    get = lambda key: summary.get(key, "?")
    block = f" (block {get('block_size_tokens')})" if "block_size_tokens" in summary else ""
    title = f"kvbench: {get('allocator')}{block} / {get('kernel')} / {get('scheduler')} / {get('preemption')} / {get('workload')}"
    setting = f"{get('model')} on {get('hardware')}, seed {get('seed')}"
    if "calibration" in summary:
        setting += f", {summary['calibration']}"
    table = Table(title=escape(f"{title}\n{setting}"), show_header=False)
    table.add_column("metric", overflow="fold")  # a narrow terminal wraps a row, never cuts it
    table.add_column("value", justify="right", overflow="fold")
    for label, value in headline_rows(summary, slo_given=slo_given):
        table.add_row(escape(label), escape(value))
    console.print(table)
    console.print(f"[dim]{METRIC_DEFINITIONS}[/dim]", highlight=False)
    if out_dir is not None:
        console.print(f"all {len(summary)} metrics: {out_dir / SUMMARY_JSON}", highlight=False)
    else:
        console.print(f"{len(summary)} metrics in all (output.write=false: no files written)", highlight=False)
