"""The comparison table: laid out for the width it is given, metrics in the catalogue's words with
the unit their values are shown in, never a header or a number cut."""

from __future__ import annotations

import math

import pandas as pd
from rich.console import Console

from kvbench.compare.diff import COLUMNS
from kvbench.compare.report import HEADERS, table, value_pair, verdict_line

LONG_JOB = "allocator=orca_oracle model=opt-13b hardware=a100-40gb workload=sharegpt_like scheduler.max_num_seqs=256"


def _frame(rows: list[dict]) -> pd.DataFrame:
    # object columns, as compare_jobs builds them: ints stay ints
    return pd.DataFrame({c: pd.Series([r[c] for r in rows], dtype=object) for c in COLUMNS})


def _row(job: str, metric: str, base, head, verdict: str, tolerance: str = "exact") -> dict:
    change = head - base
    return {
        "job": job,
        "base_job": "b",
        "head_job": "h",
        "metric": metric,
        "base": base,
        "head": head,
        "change_abs": change,
        "change_rel": change / abs(base) if base else math.inf,
        "tolerance": tolerance,
        "verdict": verdict,
        "passed": verdict != "beyond",
    }


def _render(frame: pd.DataFrame, width: int = 100) -> list[str]:
    console = Console(width=width, record=True)
    console.print(table(frame, "kvbench compare: metrics that differ", width))
    return [line.rstrip() for line in console.export_text().splitlines()]


def _body(lines: list[str]) -> list[str]:
    """The lines under the header's rule."""
    header = next(i for i, line in enumerate(lines) if line.split() == list(HEADERS))
    return lines[header + 2 :]


def _metric_row(lines: list[str], words: str) -> list[str]:
    """The cells right of the name of the row whose name starts with ``words``."""
    row = next(line for line in lines if line.strip().startswith(words))
    return row[row.index(words) + len(words) :].split()


def test_long_labels_and_metric_names_wrap_within_100_columns():
    frame = _frame(
        [
            _row(LONG_JOB, "plugin_requests_refused_by_fragmentation", 123_456_789_012, 123_456_789_013, "beyond"),
            _row(LONG_JOB, "mean_tail_waste_bytes_per_seq", 1266809925.966517, 1266809925.966518, "beyond"),
            _row("allocator=paged", "simulated_requests_per_wall_s", 5026.325101, 3000.0, "within", ">=x0.5"),
        ]
    )
    lines = _render(frame)
    assert max(map(len, lines)) <= 100
    text = "\n".join(lines)
    # every header whole, none cut to an ellipsis; numbers never cut, and different values print differently
    assert "…" not in text
    assert "123,456,789,012" in text and "123,456,789,013" in text
    assert "1266809925.966517" in text and "1266809925.966518" in text
    body = _body(lines)
    # the job's label heads its block, wrapped at spaces only: every override whole on some line
    label_lines = body[: next(i for i, line in enumerate(body) if line.startswith("  "))]
    assert " ".join(line.strip() for line in label_lines) == LONG_JOB
    # a key the catalogue lacks (a plugin's), longer than its column, keeps every character down its
    # lines, broken after an underscore: between its words, never inside one
    pieces = [line.split()[0] for line in body[5:7]]
    assert "".join(pieces) == "plugin_requests_refused_by_fragmentation"
    assert pieces[0].endswith("_") and all(len(piece) > 2 for piece in pieces)


def test_the_table_uses_the_width_it_is_given():
    job = "allocator=paged kernel=flashinfer scheduler=chunked preemption=swap"
    frame = _frame(
        [
            _row(job, "block_utilization_saturated", 0.9, 0.8, "beyond", "close"),
            _row(job, "goodput_requests_per_s", 30.5, 31.5, "beyond", "close"),
        ]
    )
    wide, narrow = _render(frame, 200), _render(frame, 70)
    assert max(map(len, wide)) <= 200 and max(map(len, narrow)) <= 70
    # at 200 columns the label and every name fit on one line each; at 70 they wrap, at spaces
    assert job in wide
    assert _metric_row(wide, "KV blocks allocated when saturated, a server's gauge (% of budget)")[:2] == ["90", "80"]
    assert job not in narrow and " ".join(_body(narrow)[:4]) == job
    assert len(_body(narrow)) > len(_body(wide))


def test_metrics_read_in_the_catalogues_words_with_the_unit_of_their_values():
    frame = _frame(
        [
            _row("j", "ttft_p50_s", 0.0216, 0.0232, "beyond", "close"),
            _row("j", "ttft_p99_s", 43.0, 53.0, "beyond", "close"),
            _row("j", "utilization_mean", 0.136, 0.132, "beyond", "close"),
            _row("j", "peak_concurrency", 29, 18, "beyond", "close"),
            _row("j", "sim_wall_s", 0.2, 0.21, "within", "<=x2"),
            _row("j", "num_requests_refused_by_fragmentation", 3, 4, "beyond", "close"),
            _row("j", "plugin_metric_s", 0.2, 0.21, "within", "<=x2"),
        ]
    )
    lines = _render(frame, 120)
    # seconds shown in milliseconds, as the label says; in seconds where they reach 10 s
    assert _metric_row(lines, "TTFT p50 (ms)")[:3] == ["21.6", "23.2", "+7.41%"]
    assert _metric_row(lines, "TTFT p99 (s)")[:2] == ["43", "53"]
    # a fraction in percent, a count as an integer
    assert _metric_row(lines, "KV utilization mean (% of budget)")[:2] == ["13.6", "13.2"]
    assert _metric_row(lines, "peak concurrency (sequences)")[:2] == ["29", "18"]
    # every number a run writes has the catalogue's words, the wall-clock and refusal counts too
    assert _metric_row(lines, "simulation's wall-clock time (ms)")[:2] == ["200", "210"]
    assert _metric_row(lines, "requests refused for fragmentation")[:2] == ["3", "4"]
    # a key the catalogue lacks (a plugin's) keeps its own name and its stored values
    assert _metric_row(lines, "plugin_metric_s")[:2] == ["0.2", "0.21"]


def test_two_values_a_unit_change_would_print_alike_print_as_stored():
    # 1 ulp apart: times 1000 they are one float, so in milliseconds they would read as no change
    base, head = 4.237321250949226, 4.237321250949227
    assert base * 1e3 == head * 1e3 and base != head
    lines = _render(_frame([_row("j", "ttft_p50_s", base, head, "beyond")]))
    assert _metric_row(lines, "ttft_p50_s")[:2] == ["4.237321250949226", "4.237321250949227"]


def test_value_pair_adds_digits_until_values_differ():
    assert value_pair(1.0, 1.0 + 1e-12) == ("1", "1.000000000001")  # 15 digits tell them apart
    assert value_pair(0.5, 0.5) == ("0.5", "0.5")
    assert value_pair(10**12, 10**12 + 1) == ("1,000,000,000,000", "1,000,000,000,001")
    assert value_pair(math.nan, 1.0) == ("NaN", "1")


def test_verdict_line_fits_its_width_and_names_the_failures_by_key():
    frame = _frame([_row("j", f"metric_number_{i}", 1.0, 2.0, "beyond") for i in range(12)])
    line = verdict_line(frame, 3)
    assert line.startswith("kvbench compare: FAIL: 12 value(s) beyond tolerance (1 of 3 jobs): metric_number_0")
    assert line.endswith("more") and len(line) <= 100
    wide = verdict_line(frame, 3, 300)
    assert wide.endswith("metric_number_11") and len(wide) <= 300
    ok = verdict_line(_frame([_row("j", "m", 1.0, 1.0, "same")]), 1)
    assert ok == "kvbench compare: OK: 1 job(s) matched, every metric within tolerance (1 same)"


def test_labels_print_as_typed_not_as_markup():
    lines = _render(_frame([_row("workload.s_max_mix=[512,4096] tag=[bold]", "peak_concurrency", 3, 4, "beyond")]))
    assert "workload.s_max_mix=[512,4096]" in "\n".join(lines) and "tag=[bold]" in "\n".join(lines)
