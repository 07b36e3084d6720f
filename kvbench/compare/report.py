"""What a person reads: a table of the metrics that moved (at most 100 columns wide) and one
verdict line."""

from __future__ import annotations

import math
from numbers import Integral
from typing import Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvbench.compare.diff import FAILING
from kvbench.compare.tolerance import same_value

#: the widest the table may be: a CI log, a PR comment, a split terminal
MAX_WIDTH_COLUMNS = 100
QUIET = ("same", "ignored")  #: verdicts left out of the table unless --all
STYLES = {"beyond": "bold red", "missing": "bold red", "within": "yellow", "new": "cyan", "ignored": "dim"}


def console() -> Console:
    """A console at most 100 columns wide: the terminal's width when narrower."""
    terminal = Console()
    width = min(terminal.width, MAX_WIDTH_COLUMNS) if terminal.is_terminal else MAX_WIDTH_COLUMNS
    return Console(width=width)


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


def change_text(row: pd.Series) -> str:
    if row["verdict"] in ("new", "missing"):
        return row["verdict"]
    rel, change = row["change_rel"], row["change_abs"]
    if row["verdict"] == "same":
        return "0"
    if math.isnan(rel):
        return "n/a"
    if math.isinf(rel):
        return f"{change:+.4g} from 0"
    # a simulator change can be tiny yet real: keep it visible instead of rounding it to +0.00%
    return f"{rel:+.2%}" if rel == 0 or abs(rel) >= 1e-4 else f"{rel * 100:+.1e}%"


def shown_rows(frame: pd.DataFrame, everything: bool) -> pd.DataFrame:
    return frame if everything else frame[~frame["verdict"].isin(QUIET)]


def _name_widths(texts: list[tuple[str, ...]], room: int) -> tuple[int, int]:
    """Widths of the job and metric columns sharing ``room``: each its longest text if both fit,
    else the job label gets a third of the room (its overrides wrap at spaces) and the metric the rest."""
    job_need = max([len("job"), *(len(t[0]) for t in texts)])
    metric_need = max([len("metric"), *(len(t[1]) for t in texts)])
    if job_need + metric_need <= room:
        return job_need, metric_need
    job = min(job_need, max(12, room // 3))  # at least "allocator=" whole
    return job, max(len("metric"), room - job)


def table(frame: pd.DataFrame, title: str, width: int = MAX_WIDTH_COLUMNS) -> Table:
    """Job, metric, base, head, change, tolerance, verdict within ``width`` columns; a job's label
    on its first row only. Labels and metric names fold; numbers never do (a cut number is a wrong
    number)."""
    grid = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True
    )
    texts = []
    for _, row in frame.iterrows():
        base, head = value_pair(row["base"], row["head"])
        base, head = (
            ("-", head) if row["verdict"] == "new" else (base, "-") if row["verdict"] == "missing" else (base, head)
        )
        texts.append((row["job"], row["metric"], base, head, change_text(row), row["tolerance"], row["verdict"]))
    headers = ("job", "metric", "base", "head", "change", "tolerance", "verdict")
    fixed = [max([len(h), *(len(t[i]) for t in texts)]) for i, h in enumerate(headers)][2:]
    # 2 characters between neighbouring columns (a blank rule and one collapsed padding), none at the edges
    job_width, metric_width = _name_widths(texts, width - sum(fixed) - 2 * (len(headers) - 1))
    grid.add_column("job", overflow="fold", width=job_width)
    grid.add_column("metric", overflow="fold", width=metric_width)
    for header, column_width in zip(headers[2:], fixed):
        grid.add_column(header, justify="left" if header == "verdict" else "right", no_wrap=True, width=column_width)
    for i, t in enumerate(texts):
        first = i == 0 or texts[i - 1][0] != t[0]
        last = i == len(texts) - 1 or texts[i + 1][0] != t[0]
        # Text, not markup: a label such as workload.s_max_mix=[512,4096] must print as typed
        cells = [Text(t[0] if first else ""), *map(Text, t[1:-1]), Text(t[-1], style=STYLES.get(t[-1], ""))]
        grid.add_row(*cells, end_section=last)
    return grid


def verdict_line(frame: pd.DataFrame, num_jobs: int) -> str:
    """The last line: OK or FAIL with counts; on failure, as many failing metrics as fit 100 columns."""
    failed = frame[frame["verdict"].isin(FAILING)]
    if not len(failed):
        counts = frame["verdict"].value_counts()
        parts = [f"{counts[v]} {v}" for v in ("same", "within", "ignored", "new") if v in counts]
        return f"kvbench compare: OK: {num_jobs} job(s) matched, every metric within tolerance ({', '.join(parts) or 'no metrics'})"
    what = "beyond tolerance or missing" if (failed["verdict"] == "missing").any() else "beyond tolerance"
    head = f"kvbench compare: FAIL: {len(failed)} value(s) {what} ({failed['job'].nunique()} of {num_jobs} jobs)"
    metrics = list(dict.fromkeys(failed["metric"]))
    for shown in range(len(metrics), 0, -1):
        rest = f" and {len(metrics) - shown} more" if shown < len(metrics) else ""
        line = f"{head}: {', '.join(metrics[:shown])}{rest}"
        if len(line) <= MAX_WIDTH_COLUMNS:
            return line
    return f"{head}: see the table"


def print_report(frame: pd.DataFrame, num_jobs: int, everything: bool, out: Console) -> None:
    rows = shown_rows(frame, everything)
    if len(rows):
        what = "every metric" if everything else "metrics that differ (--all: every metric)"
        out.print(table(rows, f"kvbench compare: {what}", out.width))
    else:
        out.print(f"no metric differs in the {num_jobs} matched job(s) (--all lists every one)")
