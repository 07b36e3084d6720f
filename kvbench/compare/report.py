"""What a person reads: a table of the metrics that moved, laid out for the console's width, and
one verdict line.

The table has one block per job: the job's label on a line of its own (so that it wraps only where
the whole table is too narrow for it, at spaces), then one row per metric, named in the catalogue's
words with the unit its values are shown in (:mod:`kvbench.compare.labels`). The verdict line names
failing metrics by their summary keys: the names a ``--tol`` rule matches.
"""

from __future__ import annotations

import math
import re
import textwrap
from numbers import Integral
from typing import Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvbench.compare.diff import FAILING
from kvbench.compare.labels import Shown, shown
from kvbench.compare.tolerance import same_value
from kvbench.output.report import report_console

#: the width laid out for when none is known (a direct call, no console): a CI log, a PR comment
DEFAULT_WIDTH_COLUMNS = 100
QUIET = ("same", "ignored")  #: verdicts left out of the table unless --all
STYLES = {"beyond": "bold red", "missing": "bold red", "within": "yellow", "new": "cyan", "ignored": "dim"}
HEADERS = ("metric", "base", "head", "change", "tolerance", "verdict")
#: a metric's name is indented under its job's label; its wrapped lines a little further
INDENT, HANGING = "  ", "    "
#: the narrowest the metric column gets on a console too narrow for the table: a word or two per line
MIN_NAME_COLUMNS = 16


def console() -> Console:
    """The console the comparison prints to: ``COLUMNS`` columns when set, else the terminal's
    width, else (a pipe, a CI log) the run reports' default width, as every kvbench report."""
    return report_console()


def _value(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NaN"
    if isinstance(value, bool) or not isinstance(value, (Integral, float)):
        return str(value)
    if isinstance(value, Integral):
        return f"{value:,}"
    return f"{value:.{digits}g}"


def value_pair(base: Any, head: Any) -> tuple[str, str]:
    """Both values, with enough digits that two different values never print alike."""
    for digits in (6, 9, 12, 15):
        texts = _value(base, digits), _value(head, digits)
        if texts[0] != texts[1] or same_value(base, head):
            return texts
    # the shortest text that reads back as the same float: different floats never print alike
    return tuple(repr(float(v)) if isinstance(v, float) else _value(v, 17) for v in (base, head))


def change_text(row: pd.Series, scale: float = 1.0) -> str:
    """The relative change; from a zero base (no relative change) the absolute one, in the shown
    unit (``scale``: stored to shown)."""
    if row["verdict"] in ("new", "missing"):
        return row["verdict"]
    rel, change = row["change_rel"], row["change_abs"]
    if row["verdict"] == "same":
        return "0"
    if math.isnan(rel):
        return "n/a"
    if math.isinf(rel):
        return f"{change * scale:+.4g} from 0"
    # a simulator change can be tiny yet real: keep it visible instead of rounding it to +0.00%
    return f"{rel:+.2%}" if rel == 0 or abs(rel) >= 1e-4 else f"{rel * 100:+.1e}%"


def shown_rows(frame: pd.DataFrame, everything: bool) -> pd.DataFrame:
    return frame if everything else frame[~frame["verdict"].isin(QUIET)]


def metric_labels(frame: pd.DataFrame) -> dict[str, Shown]:
    """Each metric's words and shown unit, one per metric for every job (so that its values of
    every job are in one unit): seconds, not milliseconds, where any job's time is long."""
    return {
        metric: shown(metric, tuple(rows["base"]) + tuple(rows["head"]))
        for metric, rows in frame.groupby("metric", sort=False)
    }


def _row_texts(row: pd.Series, how: Shown) -> tuple[str, ...]:
    """(metric, base, head, change, tolerance, verdict) as printed."""
    base, head = value_pair(how.value(row["base"]), how.value(row["head"]))
    label = how.label
    if base == head and not same_value(row["base"], row["head"]):
        # two stored values 1 ulp apart can scale to one float: then show them as stored, by key
        how = Shown(str(row["metric"]))
        label, (base, head) = how.label, value_pair(row["base"], row["head"])
    if row["verdict"] == "new":
        base = "-"
    elif row["verdict"] == "missing":
        head = "-"
    return label, base, head, change_text(row, how.scale), str(row["tolerance"]), str(row["verdict"])


class _Wrapper(textwrap.TextWrapper):
    """Breaks at spaces and after an underscore: a summary key the catalogue lacks (a plugin's)
    breaks between its words (``num_requests_`` / ``refused``), never inside one, nor at a hyphen."""

    wordsep_re = re.compile(r"(\s+|(?<=_)(?=[^\s_]))")


def _wrapped(text: str, width: int, first: str = "", rest: str = "", *, keys: bool = False) -> str:
    """``text`` in lines of at most ``width``, broken at spaces (``keys``: or after an underscore;
    a word longer than a line is cut)."""
    wrapper = (_Wrapper if keys else textwrap.TextWrapper)(
        width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=keys
    )
    return "\n".join(wrapper.wrap(text) or [first])


def table(frame: pd.DataFrame, title: str, width: int = DEFAULT_WIDTH_COLUMNS) -> Table:
    """Each job's label, then its metrics: name, base, head, change, tolerance, verdict, within
    ``width`` columns where it can be. Labels and names wrap at spaces; numbers never do (a cut
    number is a wrong number)."""
    grid = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True
    )
    labels = metric_labels(frame)
    blocks: list[tuple[str, list[tuple[str, ...]]]] = []
    for job, rows in frame.groupby("job", sort=False):
        blocks.append((str(job), [_row_texts(row, labels[row["metric"]]) for _, row in rows.iterrows()]))
    texts = [t for _, rows in blocks for t in rows]
    fixed = [max([len(h), *(len(t[i]) for t in texts)]) for i, h in enumerate(HEADERS)][1:]
    # 2 characters between neighbouring columns (a blank rule and one collapsed padding), none at the edges
    room = width - sum(fixed) - 2 * (len(HEADERS) - 1)
    need = max([len(HEADERS[0]), *(len(INDENT + t[0]) for t in texts), *(len(job) for job, _ in blocks)])
    name_width = max(min(need, room), MIN_NAME_COLUMNS)
    grid.add_column(HEADERS[0], no_wrap=True, width=name_width)
    for header, column_width in zip(HEADERS[1:], fixed):
        grid.add_column(header, justify="left" if header == "verdict" else "right", no_wrap=True, width=column_width)
    for i, (job, rows) in enumerate(blocks):
        # Text, not markup: a label such as workload.s_max_mix=[512,4096] must print as typed
        grid.add_row(Text(_wrapped(job, name_width), style="bold"), *[""] * len(fixed))
        for j, t in enumerate(rows):
            cells = [Text(_wrapped(t[0], name_width, INDENT, HANGING, keys=True)), *map(Text, t[1:-1])]
            grid.add_row(*cells, Text(t[-1], style=STYLES.get(t[-1], "")), end_section=j == len(rows) - 1)
    return grid


def verdict_line(frame: pd.DataFrame, num_jobs: int, width: int = DEFAULT_WIDTH_COLUMNS) -> str:
    """The last line: OK or FAIL with counts; on failure, the failing metrics' keys, as many as fit
    ``width`` columns."""
    failed = frame[frame["verdict"].isin(FAILING)]
    if not len(failed):
        counts = frame["verdict"].value_counts()
        parts = [f"{counts[v]} {v}" for v in ("same", "within", "ignored", "new") if v in counts]
        return f"kvbench compare: OK: {num_jobs} job(s) matched, every metric within tolerance ({', '.join(parts) or 'no metrics'})"
    what = "beyond tolerance or missing" if (failed["verdict"] == "missing").any() else "beyond tolerance"
    head = f"kvbench compare: FAIL: {len(failed)} value(s) {what} ({failed['job'].nunique()} of {num_jobs} jobs)"
    metrics = list(dict.fromkeys(failed["metric"]))
    for count in range(len(metrics), 0, -1):
        rest = f" and {len(metrics) - count} more" if count < len(metrics) else ""
        line = f"{head}: {', '.join(metrics[:count])}{rest}"
        if len(line) <= width:
            return line
    return f"{head}: see the table"


def print_report(frame: pd.DataFrame, num_jobs: int, everything: bool, out: Console) -> None:
    rows = shown_rows(frame, everything)
    if len(rows):
        what = "every metric" if everything else "metrics that differ (--all: every metric)"
        out.print(table(rows, f"kvbench compare: {what}", out.width))
    else:
        out.print(f"no metric differs in the {num_jobs} matched job(s) (--all lists every one)")
