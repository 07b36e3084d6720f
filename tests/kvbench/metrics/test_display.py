"""Numbers for people: units instead of exponents, and a headline that fits one screen."""

from __future__ import annotations

import io
import math

import pytest
from prefix_summary import ZERO_HIT_NOTE, ZERO_PREFIX_HITS
from rich.console import Console

from kvbench.metrics.display import METRIC_DEFINITIONS, format_bytes, format_number, format_summary, headline_rows


@pytest.mark.parametrize(
    "num_bytes, shown",
    [
        (62.5e9, "62.5 GB"),
        (5e9, "5.00 GB"),
        (13476831232, "13.5 GB"),
        (3924899.3, "3.92 MB"),
        (1.3e12, "1.30 TB"),
        (512, "512 B"),
        (0, "0 B"),
        (math.nan, "n/a"),
    ],
)
def test_bytes_read_in_decimal_units(num_bytes, shown):
    assert format_bytes(num_bytes) == shown


@pytest.mark.parametrize(
    "value, shown",
    [
        (6.25e10, "62,500,000,000"),
        (1.2992e12 + 0.5, "1,299,200,000,000.5"),
        (128000, "128,000"),
        (1.5, "1.5"),
        (0.0418676, "0.04187"),
        (3.1e-6, "0.0000031"),
        (0, "0"),
        (math.nan, "n/a"),
        ("sim", "sim"),
    ],
)
def test_numbers_never_show_an_exponent(value, shown):
    assert format_number(value) == shown


def _summary(**changes) -> dict:
    summary = {
        "num_requests": 1000,
        "num_finished": 998,
        "duration_s": 29.5,
        "throughput_tokens_per_s": 4338.53,
        "throughput_requests_per_s": 33.89,
        "goodput_requests_per_s": 30.0,
        "slo_attainment": 0.9,
        "ttft_p50_s": 13.5792,
        "ttft_p99_s": 26.9367,
        "ttft_mean_s": 13.4308,
        "sched_delay_mean_s": 0.0,
        "queue_mean_s": 13.1899,
        "prefill_mean_s": 0.2409,
        "tpot_p50_s": 0.0416,
        "tpot_p99_s": 0.0641,
        "e2e_p50_s": 19.2072,
        "e2e_p99_s": 29.5031,
        "peak_concurrency": 223,
        "min_concurrency_saturated": 184,
        "mean_concurrency": 184.4,
        "mean_concurrency_saturated": 203.2,
        "utilization_mean": 0.879,
        "utilization_saturated": 0.981,
        "saturated_s": 11.06,
        "saturated_fraction": 0.375,
        "breakdown_period": "saturated",
        "frac_token": 0.981,
        "frac_reserved_future": 0.013,
        "frac_internal": 0.0,
        "frac_external": 0.0,
        "frac_free": 0.006,
        "mean_tail_waste_tokens_per_seq": 7.5,
        "kv_budget_bytes": 62_500_000_000,
        "kv_bytes_per_token": 524288,
        "num_preemptions": 0,
        "num_recompute_preemptions": 0,
        "num_swap_preemptions": 0,
        "num_swap_fallbacks": 0,
        "recompute_tax": 0.0,
        "preemption_cost_s": 0.0,
        "swap_out_bytes": 0,
        "swap_pool_peak_bytes": 0,
        "num_copies": 0,
        "copy_bytes": 0,
    }
    return {**summary, **changes}


def test_a_row_of_times_switches_to_seconds_where_a_value_reaches_ten_seconds():
    short = dict(headline_rows(_summary(ttft_p50_s=0.1234, ttft_p99_s=9.9994)))
    assert short["TTFT p50 / p99 (ms)"] == "123.4 / 9,999.4"
    long = dict(headline_rows(_summary(ttft_p50_s=3673.012, ttft_p99_s=6998.357)))
    assert long["TTFT p50 / p99 (s)"] == "3,673.0 / 6,998.4"
    assert long["TPOT p50 / p99 (ms)"] == "41.6 / 64.1", "each row picks its own unit"


def test_what_sharing_saved_is_said_only_where_blocks_were_shared():
    none = dict(headline_rows(_summary(peak_shared_blocks=0, peak_allocated_bytes=1e9, peak_unshared_bytes=1e9)))
    assert not [label for label in none if "shar" in label]
    fan_out = dict(
        headline_rows(
            _summary(
                peak_shared_blocks=256,
                peak_allocated_bytes=6144 * 524288,
                peak_unshared_bytes=34816 * 524288,
                sharing_saving=34816 / 6144,
            )
        )
    )
    assert fan_out["blocks shared by 2+ sequences (peak)"] == "256"
    assert fan_out["KV held / without sharing (peak)"] == "3.22 GB / 18.3 GB (5.67x less)"


def test_the_headline_pairs_related_numbers_in_the_summarys_units():
    rows = dict(headline_rows(_summary()))
    assert rows["requests finished / sent"] == "998 / 1,000"
    # times of 10 s and more read in seconds, shorter ones in milliseconds, a unit per row
    assert rows["TTFT p50 / p99 (s)"] == "13.6 / 26.9"
    assert rows["TPOT p50 / p99 (ms)"] == "41.6 / 64.1"
    assert rows["  mean = step wait + queueing + prefill (s)"] == "13.4 = 0.0 + 13.2 + 0.2"
    assert rows["peak concurrency / floor (sat.) (seqs)"] == "223 / 184"
    assert rows["KV budget"] == "62.5 GB (119,209 tokens)"
    assert rows["memory (sat.) (% of KV budget)"] == "token 98.1, reserved future 1.3, free 0.6"
    assert len(rows) <= 24


def test_rows_that_say_nothing_are_left_out_and_appear_when_they_do():
    quiet = dict(headline_rows(_summary(), slo_given=False))
    for absent in (
        "recompute tax (% of tokens computed)",
        "preemption cost: swaps + recompute (s)",
        "swapped out / host pool peak",
        "copy-on-write / fork copies",
    ):
        assert absent not in quiet
    assert not any("goodput" in label for label in quiet)
    busy = dict(
        headline_rows(
            _summary(
                num_preemptions=76,
                num_recompute_preemptions=70,
                num_swap_preemptions=6,
                recompute_tax=0.063,
                preemption_cost_s=1.19,
                swap_out_bytes=2.5e9,
                swap_pool_peak_bytes=1e9,
                num_copies=12,
                copy_bytes=6e6,
            ),
            slo_given=True,
        )
    )
    assert busy["preemptions"] == "76 (70 recompute, 6 swap)"
    assert busy["recompute tax (% of tokens computed)"] == "6.3"
    assert busy["swapped out / host pool peak"] == "2.50 GB / 1.00 GB"
    assert busy["copy-on-write / fork copies"] == "12 (6.00 MB)"
    assert busy["goodput, vLLM's (req/s meeting every SLO)"] == "30.00 (90.0 % of finished)"


def test_goodput_shows_when_unknown_slos_were_missed():
    assert any("goodput" in label for label, _ in headline_rows(_summary()))  # 90 % attainment: some SLO given
    assert not any("goodput" in label for label, _ in headline_rows(_summary(slo_attainment=1.0)))


def test_missing_or_nan_numbers_read_as_na():
    rows = dict(headline_rows({"num_requests": 3, "num_finished": 0, "ttft_p50_s": math.nan}))
    assert rows["requests finished / sent"] == "0 / 3" and rows["TTFT p50 / p99 (ms)"] == "n/a / n/a"


def test_every_key_still_has_a_row_for_the_files_view():
    summary = _summary(kv_read_bytes_per_s=1.3e12, weight_bytes=13476831232, extra_count=6.25e10)
    rows = dict(format_summary(summary))
    assert rows["kv_read_bytes_per_s"] == "1.30 TB/s" and rows["weight_bytes"] == "13.5 GB"
    assert rows["extra_count"] == "62,500,000,000"
    assert not any("e+" in value for value in rows.values())


def test_the_definitions_fit_two_lines_of_a_100_column_terminal():
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(METRIC_DEFINITIONS)
    assert len(console.export_text().splitlines()) <= 2


def test_token_slots_and_allocated_blocks_sit_side_by_side():
    rows = dict(headline_rows(_summary(block_utilization_mean=0.9234, block_utilization_saturated=0.99)))
    assert rows["KV utilization: run / (sat.) (% of KV budget)"] == "87.9 / 98.1"
    assert rows["  in allocated blocks, a server's gauge (%)"] == "92.3 / 99.0"


def test_prefix_rows_show_hits_bounds_and_why_zero():
    assert not any("prefix" in label for label, _ in headline_rows(_summary()))
    rows = dict(headline_rows(_summary(**{**ZERO_PREFIX_HITS, "prefix_recompute_cached_tokens": 1234})))
    assert rows["prefix cache hits (% of prompt tokens)"] == "0.0"
    assert rows["  offline: ceiling / Belady / LRU (%)"] == "0.0 / 0.0 / 0.0"
    assert rows["  re-admitted from cache (tokens, not hits)"] == "1,234"
    assert rows["  note"] == ZERO_HIT_NOTE
    hit = dict(
        headline_rows(
            _summary(
                prefix_hit_rate=0.3125,
                prefix_recompute_cached_tokens=0,
                prefix_hit_rate_infinite=0.5,
                prefix_hit_rate_belady=0.4375,
                prefix_hit_rate_lru_offline=0.375,
            )
        )
    )
    assert hit["prefix cache hits (% of prompt tokens)"] == "31.2"
    assert hit["  offline: ceiling / Belady / LRU (%)"] == "50.0 / 43.8 / 37.5"
    assert "  note" not in hit and "  re-admitted from cache (tokens, not hits)" not in hit
    # the bounds alone (caching off): what caching could reach, no hit row
    off = dict(headline_rows(_summary(prefix_hit_rate_infinite=0.5, prefix_hit_rate_belady=0.4375)))
    assert off["  offline: ceiling / Belady / LRU (%)"] == "50.0 / 43.8 / n/a"
    assert "prefix cache hits (% of prompt tokens)" not in off
    assert (
        dict(format_summary(_summary(prefix_hit_rate=0.3125)))["prefix cache hit rate (% of admitted prompt tokens)"]
        == "31.2"
    )


def test_a_trace_s_dropped_and_clipped_requests_are_said_only_when_there_are_some():
    base = {"num_trace_rows_read": 300, "num_trace_requests_clipped": 0}
    shown = dict(headline_rows({**base, "num_trace_requests_dropped": 49}))
    assert shown["trace rows read / dropped / clipped (too long)"] == "300 / 49 / 0"
    assert "trace rows read / dropped / clipped (too long)" not in dict(
        headline_rows({**base, "num_trace_requests_dropped": 0})
    )


def test_a_real_run_shows_the_sim_s_step_time_error():
    shown = dict(headline_rows({"sim_step_error_median": 0.125, "sim_step_error_p90": 0.5}))
    assert shown["sim's step-time error p50 / p90 (% of measured)"] == "12.5 / 50.0"
    assert not any("step-time error" in label for label, _ in headline_rows({"num_requests": 3}))
