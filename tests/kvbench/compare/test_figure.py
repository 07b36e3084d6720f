"""compare.png: written as a valid PNG for one job or many, one metric or many, never taller than a
screen; it draws the largest changes, failures first, and says how much it left out."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from kvbench.compare import figure
from kvbench.compare.diff import COLUMNS
from kvbench.compare.figure import MAX_BARS_PER_JOB, MAX_JOBS, plot_changes

KEYS = ("ttft_p50_s", "peak_concurrency", "utilization_mean", "throughput_tokens_per_s", "sim_wall_s", "num_steps")


def _row(job: str, metric: str, base, head, verdict: str) -> dict:
    change = head - base
    rel = change / abs(base) if base else (math.copysign(math.inf, change) if change else 0.0)
    return dict(
        job=job,
        base_job="b",
        head_job="h",
        metric=metric,
        base=base,
        head=head,
        change_abs=change,
        change_rel=rel,
        tolerance="close",
        verdict=verdict,
        passed=verdict not in ("beyond", "missing"),
    )


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(
        {c: pd.Series([r[c] for r in rows], dtype=object if c in ("base", "head") else None) for c in COLUMNS}
    )


def _jobs_frame(num_jobs: int, num_metrics: int, failing_every: int = 3) -> pd.DataFrame:
    return _frame(
        [
            _row(
                f"allocator.block_size_tokens={2**j} preemption=swap",
                f"{KEYS[i % len(KEYS)]}_{i}",
                1.0,
                1.0 + 0.01 * (i + 1),
                "beyond" if i % failing_every == 0 else "within",
            )
            for j in range(num_jobs)
            for i in range(num_metrics)
        ]
    )


def _png_size(path) -> tuple[int, int]:
    with Image.open(path) as image:
        image.verify()  # a whole, readable PNG, not only its first bytes
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


#: the tallest compare.png may be, in pixels: one screen, read without scrolling
SCREEN_PX = 1200


@pytest.mark.parametrize("num_jobs, num_metrics", [(1, 1), (2, 3), (12, 40), (3, MAX_BARS_PER_JOB + 10), (1, 240)])
def test_the_figure_is_a_png_for_any_number_of_jobs_and_metrics(tmp_path, num_jobs, num_metrics):
    width, height = _png_size(plot_changes(_jobs_frame(num_jobs, num_metrics), tmp_path / "compare.png"))
    assert 0 < width and 0 < height <= SCREEN_PX


def test_the_figure_grows_with_the_rows_it_draws_up_to_one_screen(tmp_path):
    heights = [
        _png_size(plot_changes(_jobs_frame(jobs, metrics), tmp_path / f"{jobs}x{metrics}.png"))[1]
        for jobs, metrics in ((1, 2), (2, 4), (MAX_JOBS, 40), (30, 40))
    ]
    assert heights[0] < heights[1] < heights[2] <= SCREEN_PX
    # past MAX_JOBS panels the rest is counted, not drawn: 30 jobs draw no taller than MAX_JOBS
    assert heights[3] <= heights[2] * 1.05


def test_the_text_is_readable_at_a_glance():
    assert figure.FONT_PT >= 10 and figure.ROW_IN * 72 >= 2.4 * figure.FONT_PT  # a bar's row holds its label


def test_nothing_moved_is_a_figure_that_says_so(tmp_path):
    frame = _frame([_row("run", "ttft_p50_s", 1.0, 1.0, "same")])
    assert _png_size(plot_changes(frame, tmp_path / "compare.png"))[1] > 0


def test_new_missing_and_from_zero_changes_draw(tmp_path):
    frame = _frame(
        [
            _row("run", "num_preemptions", 0, 5, "beyond"),  # from 0: no relative change
            _row("run", "prefix_hit_rate", 0.5, math.nan, "missing"),
            _row("run", "some_new_metric_s", math.nan, 3.0, "new"),
            _row("run", "kvbench_commit_number", 1.0, 2.0, "ignored"),
            _row("run", "utilization_mean", 0.5, 0.45, "within"),
            _row("run", "frac_external", 0.0036, 0.0336, "beyond"),  # +833 %: a logarithmic axis
        ]
    )
    assert _png_size(plot_changes(frame, tmp_path / "compare.png"))[1] > 0


def test_only_new_and_missing_metrics_draw_without_bars(tmp_path):
    frame = _frame([_row("run", "a_metric_s", 1.0, math.nan, "missing"), _row("run", "b_s", math.nan, 2.0, "new")])
    assert _png_size(plot_changes(frame, tmp_path / "compare.png"))[1] > 0


def test_a_job_past_the_cap_keeps_its_failures_and_counts_the_rest():
    rows = [_row("j", f"m{i}", 1.0, 1.1, "within") for i in range(MAX_BARS_PER_JOB)]
    rows += [_row("j", "late_failure", 1.0, 2.0, "beyond"), _row("j", "late_pass", 1.0, 1.1, "within")]
    drawn, notes = figure._plotted(_frame(rows))
    assert len(drawn) == MAX_BARS_PER_JOB and list(drawn["metric"])[0] == "late_failure"
    assert notes == {"j": "and 2 more, all passing: see compare.csv"}
    failing = [_row("j", f"f{i}", 1.0, 2.0, "beyond") for i in range(MAX_BARS_PER_JOB + 3)]
    assert figure._plotted(_frame(failing))[1] == {"j": "and 3 more, 3 failing: see compare.csv"}


def test_the_largest_changes_are_drawn_first_failures_before_them():
    rows = [
        _row("j", "small", 1.0, 1.01, "within"),
        _row("j", "no_size", 1.0, math.nan, "missing"),
        _row("j", "large", 1.0, 0.5, "within"),
        _row("j", "failing_small", 1.0, 1.001, "beyond"),
        _row("j", "from_zero", 0.0, 3.0, "within"),
        _row("j", "unchanged", 1.0, 1.0, "same"),
    ]
    drawn, _ = figure._plotted(_frame(rows))
    assert list(drawn["metric"]) == ["failing_small", "no_size", "from_zero", "large", "small"]


def test_past_max_jobs_failing_jobs_are_drawn_first_in_the_tables_order():
    rows = [_row(f"pass{j}", "m0", 1.0, 1.0 + 0.1 * (j + 1), "within") for j in range(MAX_JOBS + 2)]
    rows += [_row("fails", "m0", 1.0, 1.001, "beyond")]
    drawn, _ = figure._plotted(_frame(rows))
    jobs, left_out = figure._jobs(drawn)
    # the failing job first, then the passing ones whose change is largest; drawn in the table's order
    largest = [f"pass{j}" for j in range(MAX_JOBS + 2)][-(MAX_JOBS - 1) :]
    assert jobs == [*largest, "fails"]
    assert left_out == [f"pass{j}" for j in range(MAX_JOBS + 2 - (MAX_JOBS - 1))]


def test_the_axis_is_linear_for_small_changes_and_logarithmic_past_100_percent():
    low, high, log = figure._axis_limits(np.array([0.4, -2.0, np.inf, np.nan]))
    assert not log and low == pytest.approx(-2.3) and high == pytest.approx(0.46)
    low, high, log = figure._axis_limits(np.array([-36.0, 843.0]))
    assert log and low == pytest.approx(-72.0) and high == pytest.approx(1686.0)
    # one side without a bar keeps some room: the zero line is not drawn on the frame
    low, high, _ = figure._axis_limits(np.array([5.0]))
    assert low < 0 < high


def test_a_long_metric_name_is_shortened_keeping_its_unit():
    short = figure._short("KV blocks allocated when saturated, a server's gauge (% of budget)")
    assert len(short) <= figure.LABEL_CHARS and short.endswith("(% of budget)") and short.startswith("KV blocks")
