"""Per-run figures (the memory ledger's stack, the prefix cache over time) and a sweep's bars, from
hand-built tables: each written as a valid PNG, and the numbers they draw computed as they should."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from kvbench.output import figures
from kvbench.output.figures import (
    binned_share,
    cumulative_hit_rate,
    draws_prefix_cache,
    ledger_stack,
    plot_comparison,
    plot_memory_timeline,
    plot_prefix_cache,
)

SUMMARY = {
    "kv_budget_bytes": 1024,
    "model": "m",
    "hardware": "h",
    "allocator": "paged",
    "block_size_tokens": 16,
    "workload": "w",
    "prefix_hit_rate_infinite": 0.5,
    "prefix_hit_rate_belady": 0.4375,
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _steps(cached=(0.0, 256.0, 512.0)) -> pd.DataFrame:
    n = len(cached)
    return pd.DataFrame(
        {
            "start_s": np.arange(n, dtype=float),
            "num_running": [1] * n,
            "token_bytes": [256.0] * n,
            "reserved_future_bytes": [0.0] * n,
            "internal_bytes": [0.0] * n,
            "external_bytes": [0.0] * n,
            "free_bytes": [768.0 - c for c in cached],
            "cached_bytes": list(cached),
        }
    )


def _requests() -> pd.DataFrame:
    # admitted out of id order; r3 never admitted (its tokens must not count)
    return pd.DataFrame(
        {
            "request_id": [0, 1, 2, 3],
            "admitted_s": [0.0, 2.0, 1.0, -1.0],
            "prompt_tokens": [8, 16, 8, 100],
            "cached_prompt_tokens": [0, 12, 4, 0],
        }
    )


def test_cumulative_hit_rate_follows_admissions():
    t_s, rate = cumulative_hit_rate(_requests())
    assert list(t_s) == [0.0, 1.0, 2.0]
    # after r0: 0 / 8; after r2: 4 / 16; after r1: 16 / 32 (the summary's prefix_hit_rate)
    assert list(rate) == [0.0, 0.25, 0.5]
    _, none_yet = cumulative_hit_rate(
        pd.DataFrame({"admitted_s": [0.0], "prompt_tokens": [0], "cached_prompt_tokens": [0]})
    )
    assert math.isnan(none_yet[0])


def test_the_cached_part_is_stacked_only_when_it_holds_something():
    assert [col for col, _, _ in ledger_stack(_steps())][-2:] == ["free_bytes", "cached_bytes"]
    assert "cached_bytes" not in [col for col, _, _ in ledger_stack(_steps(cached=(0.0, 0.0)))]
    assert "cached_bytes" not in [col for col, _, _ in ledger_stack(_steps().drop(columns="cached_bytes"))]


def test_the_prefix_figure_is_written_only_for_a_caching_run(tmp_path):
    path = plot_prefix_cache(_requests(), _steps(), SUMMARY, tmp_path / "prefix_cache.png")
    assert path == tmp_path / "prefix_cache.png" and path.read_bytes()[:8] == PNG_MAGIC
    # no cached_bytes in the steps: the hit rate alone
    assert plot_prefix_cache(_requests(), _steps().drop(columns="cached_bytes"), SUMMARY, tmp_path / "b.png")
    assert (
        plot_prefix_cache(_requests().drop(columns="cached_prompt_tokens"), _steps(), SUMMARY, tmp_path / "none.png")
        is None
    )
    assert not (tmp_path / "none.png").exists()
    # an allocator without a cache: the columns are there, all 0, and the trace shares nothing
    no_cache = _requests().assign(cached_prompt_tokens=0)
    plain = {key: value for key, value in SUMMARY.items() if not key.startswith("prefix_")}
    assert plot_prefix_cache(no_cache, _steps(cached=(0.0, 0.0)), plain, tmp_path / "plain.png") is None
    assert not (tmp_path / "plain.png").exists()
    # zero hits on a trace that shares prefixes (the bounds say why): drawn
    assert plot_prefix_cache(no_cache, _steps(cached=(0.0, 0.0)), SUMMARY, tmp_path / "zero.png")


def test_whether_the_prefix_figure_is_drawn_asks_the_step_table_last():
    """The steps are asked (a table streamed to its file is read back for it) only when the
    requests and the summary leave the answer open."""
    asked = []

    def cached(answer):
        def ask():
            asked.append(answer)
            return answer

        return ask

    no_hits = _requests().assign(cached_prompt_tokens=0)
    plain = {key: value for key, value in SUMMARY.items() if not key.startswith("prefix_")}
    assert draws_prefix_cache(_requests(), plain, cached(False))  # a hit
    assert draws_prefix_cache(no_hits, SUMMARY, cached(False))  # a bound
    assert not draws_prefix_cache(_requests().drop(columns="cached_prompt_tokens"), SUMMARY, cached(True))
    assert not draws_prefix_cache(_requests().iloc[:0], SUMMARY, cached(True))
    assert asked == []
    assert draws_prefix_cache(no_hits, plain, cached(True)) and not draws_prefix_cache(no_hits, plain, cached(False))
    assert asked == [True, False]


def test_the_memory_figure_draws_with_and_without_a_cache(tmp_path):
    for name, steps in (("with.png", _steps()), ("without.png", _steps().drop(columns="cached_bytes"))):
        assert plot_memory_timeline(steps, SUMMARY, tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def _png(path) -> tuple[int, int]:
    """The PNG's (width, height) in pixels, after checking it is whole and readable."""
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def test_the_memory_figure_draws_a_single_step(tmp_path):
    assert _png(plot_memory_timeline(_steps(cached=(0.0,)), SUMMARY, tmp_path / "one.png"))[0] > 0


def test_the_prefix_figure_draws_a_cache_that_never_held_an_unheld_block(tmp_path):
    hits = _requests()  # hits, yet cached_bytes 0 at every step: every cached block stayed held
    assert _png(plot_prefix_cache(hits, _steps(cached=(0.0, 0.0, 0.0)), SUMMARY, tmp_path / "held.png"))[0] > 0


def test_binned_share_weights_each_step_by_its_time_and_keeps_the_highest():
    steps = pd.DataFrame(
        {
            "start_s": [0.0, 1.0, 3.0, 4.0],
            "duration_s": [1.0, 2.0, 1.0, 4.0],
            "cached_bytes": [0.0, 30.0, 60.0, 10.0],
        }
    )
    binned = binned_share(steps, "cached_bytes", budget=100.0, bins=2)  # spans [0, 4) and [4, 8)
    assert binned["start_s"].tolist() == [0.0, 4.0]
    # (0 x 1 + 30 x 2 + 60 x 1) / 4 s = 30 %, highest 60 %; then one step of 10 %
    assert binned["mean_pct"].tolist() == pytest.approx([30.0, 10.0])
    assert binned["max_pct"].tolist() == pytest.approx([60.0, 10.0])


def test_binned_share_counts_a_long_step_in_every_span_it_runs_through():
    # a 1 s step at 0 %, then 3 s at 50 %: spans of 1 s each
    steps = pd.DataFrame(
        {"start_s": [0.0, 1.0, 1.5, 2.0], "duration_s": [1.0, 0.5, 0.5, 2.0], "cached_bytes": [0.0, 20.0, 40.0, 50.0]}
    )
    binned = binned_share(steps, "cached_bytes", budget=100.0, bins=4)
    assert binned["mean_pct"].tolist() == pytest.approx([0.0, 30.0, 50.0, 50.0])
    assert binned["max_pct"].tolist() == pytest.approx([0.0, 40.0, 50.0, 50.0])
    # no time elapses: the steps' values, not a division by zero
    instant = binned_share(steps.assign(start_s=0.0, duration_s=0.0), "cached_bytes", budget=100.0)
    assert instant["max_pct"].tolist() == [50.0]


def test_bounds_at_one_value_are_one_line_naming_them_all():
    lines = figures._bound_lines({"prefix_hit_rate_infinite": 0.968, "prefix_hit_rate_belady": 0.968})
    assert len(lines) == 1 and lines[0][1] == "ceiling = Belady: 96.8 %"
    apart = figures._bound_lines({"prefix_hit_rate_infinite": 0.29, "prefix_hit_rate_belady": 0.14})
    assert [label for _, label, _ in apart] == ["ceiling (infinite cache): 29.0 %", "Belady (optimal eviction): 14.0 %"]


def _sweep_table(allocators: list[str], preemptions: list[str], failed: int = 0) -> pd.DataFrame:
    rows = []
    for i, (allocator, preemption) in enumerate((a, p) for a in allocators for p in preemptions):
        rows.append(
            {
                "swept.allocator": allocator,
                "swept.preemption": preemption,
                "label": f"allocator={allocator} preemption={preemption}",
                "model": "llama2-7b",
                "hardware": "h100-sxm",
                "workload": "lecture_chat",
                "peak_concurrency": 29 + 10 * i,
                "utilization_saturated": 0.1 + 0.05 * i,
                "throughput_tokens_per_s": 2929.0 + i,
                "ttft_p50_s": 21.6 - i,
                "ttft_p99_s": 43.0 - i,
                "preemption_cost_s": 0.1 * i,
                "num_preemptions": i,
                "failed": i < failed,
            }
        )
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    "allocators, preemptions",
    [
        (["paged"], ["swap"]),
        (["naive", "paged"], ["swap"]),
        (["naive", "per_request", "paged"], ["recompute", "swap", "length_aware"]),
    ],
)
def test_the_sweep_figure_is_a_png_for_one_two_and_nine_jobs(tmp_path, allocators, preemptions):
    width, height = _png(plot_comparison(_sweep_table(allocators, preemptions), tmp_path / "comparison.png"))
    assert width > 0 and height > 0


def test_the_sweep_figure_grows_with_its_jobs_and_draws_without_failed_ones(tmp_path):
    two = _png(plot_comparison(_sweep_table(["naive", "paged"], ["swap"]), tmp_path / "two.png"))
    nine = _png(plot_comparison(_sweep_table(["a", "b", "c"], ["x", "y", "z"]), tmp_path / "nine.png"))
    assert nine[1] > two[1] and nine[0] == two[0]  # taller, one bar per job, never squeezed sideways
    some_failed = _sweep_table(["naive", "paged"], ["swap", "recompute"], failed=2)
    assert _png(plot_comparison(some_failed, tmp_path / "failed.png"))[1] > 0
    # labels from the job column alone (no swept values recorded)
    bare = _sweep_table(["naive", "paged"], ["swap"]).drop(columns=["swept.allocator", "swept.preemption"])
    assert _png(plot_comparison(bare, tmp_path / "bare.png"))[1] > 0


def test_the_sweep_figure_labels_jobs_by_their_swept_values():
    labels, title, groups = figures._job_labels(_sweep_table(["naive", "paged"], ["recompute", "swap"]))
    assert labels == ["naive, recompute", "naive, swap", "paged, recompute", "paged, swap"]
    assert title == "allocator, preemption" and groups == [2]  # a rule where the allocator changes


def test_the_sweep_figure_shows_times_in_the_unit_that_reads():
    assert figures._scaled("ttft_p50_s", pd.Series([0.0216, 0.5]))[0] == "TTFT p50 (ms)"
    title, values = figures._scaled("ttft_p50_s", pd.Series([21.6, 13.6]))
    assert title == "TTFT p50 (s)" and values.tolist() == [21.6, 13.6]
    title, values = figures._scaled("utilization_saturated", pd.Series([0.981]))
    assert title.endswith("(% of budget)") and values.tolist() == pytest.approx([98.1])
