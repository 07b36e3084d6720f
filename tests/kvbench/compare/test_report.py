"""The comparison table fits 100 columns without cutting a header or a number."""

from __future__ import annotations

import math

import pandas as pd
from rich.console import Console

from kvbench.compare.diff import COLUMNS
from kvbench.compare.report import table, value_pair, verdict_line

HEADERS = ("job", "metric", "base", "head", "change", "tolerance", "verdict")


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


def _render(frame: pd.DataFrame) -> list[str]:
    console = Console(width=100, record=True)
    console.print(table(frame, "kvbench compare: metrics that differ"))
    return console.export_text().splitlines()


def test_long_labels_and_metric_names_fold_within_100_columns():
    job = "allocator=orca_oracle model=opt-13b hardware=a100-40gb workload=sharegpt_like scheduler.max_num_seqs=256"
    frame = _frame(
        [
            _row(job, "num_requests_refused_by_fragmentation", 123_456_789_012, 123_456_789_013, "beyond"),
            _row(job, "mean_tail_waste_bytes_per_seq", 1266809925.966517, 1266809925.966518, "beyond"),
            _row("allocator=paged", "simulated_requests_per_wall_s", 5026.325101, 3000.0, "within", ">=x0.5"),
        ]
    )
    lines = _render(frame)
    assert max(map(len, lines)) <= 100
    header = next(line for line in lines if line.startswith("job"))
    assert header.split() == list(HEADERS)  # every header whole, none cut to an ellipsis
    text = "\n".join(lines)
    # numbers are never cut, and two different values print differently
    assert "123,456,789,012" in text and "123,456,789,013" in text
    assert "1266809925.966517" in text and "1266809925.966518" in text
    assert "…" not in text
    # a folded label or name keeps every character, down its column
    start = header.index("metric")
    body = lines[lines.index(header) + 2 :]
    assert "workload=sharegpt_like" in "".join(line[:start].strip() for line in body)
    assert "num_requests_refused_by_fragmentation" in "".join(line[start:].split("  ")[0] for line in body)


def test_value_pair_adds_digits_until_values_differ():
    assert value_pair(1.0, 1.0 + 1e-12) == ("1", "1.000000000001")  # 15 digits tell them apart
    assert value_pair(0.5, 0.5) == ("0.5", "0.5")
    assert value_pair(10**12, 10**12 + 1) == ("1,000,000,000,000", "1,000,000,000,001")
    assert value_pair(math.nan, 1.0) == ("NaN", "1")


def test_verdict_line_fits_and_names_the_failures():
    frame = _frame([_row("j", f"metric_number_{i}", 1.0, 2.0, "beyond") for i in range(12)])
    line = verdict_line(frame, 3)
    assert line.startswith("kvbench compare: FAIL: 12 value(s) beyond tolerance (1 of 3 jobs): metric_number_0")
    assert line.endswith("more") and len(line) <= 100
    ok = verdict_line(_frame([_row("j", "m", 1.0, 1.0, "same")]), 1)
    assert ok == "kvbench compare: OK: 1 job(s) matched, every metric within tolerance (1 same)"


def test_labels_print_as_typed_not_as_markup():
    lines = _render(_frame([_row("workload.s_max_mix=[512,4096] tag=[bold]", "peak_concurrency", 3, 4, "beyond")]))
    assert "workload.s_max_mix=[512,4096]" in "\n".join(lines) and "tag=[bold]" in "\n".join(lines)
