"""The run summary, checked against hand-computed values on small literal tables.

Times and byte counts are dyadic (multiples of 1/8, budgets of 1024 bytes) so that most expected
values are exact in floating point and compared with ``==``.
"""

import json
import math

import pandas as pd
import pytest

from kvbench.core.sequence import REQUEST_COLUMNS
from kvbench.metrics.display import METRIC_DEFINITIONS, format_summary
from kvbench.metrics.recorder import STEP_COLUMNS
from kvbench.metrics.summary import SloConfig, summarize

BUDGET_BYTES = 1024
KV_BYTES_PER_TOKEN = 16

# id, arrival, prompt, output, S_max, generated, boundary, admitted, prefill compute, first token,
# finish, preemptions, computed positions, recomputed
# r0: TTFT 0.25 (all prefill), e2e 1.25, TPOT (1.25 - 0.25) / 4 = 0.25; computed 8 + 4 decodes
# r1: TTFT 1.25 = sched 0.25 + queue 0.5 + prefill 0.5, e2e 2.25, TPOT (2.25 - 1.25) / 2 = 0.5;
#     preempted once, 6 tokens recomputed: computed 4 + 2 decodes + 6
# r2: one output token: TTFT 0.25, e2e 0.25, no TPOT
# r3: TTFT 0.5 = sched 0.25 + prefill 0.25, e2e 1.0, TPOT (1.0 - 0.5) / 1 = 0.5
# r4: arrived at 2.0, never admitted, unfinished
REQUEST_ROWS = [
    (0, 0.00, 8, 5, 64, 5, 0.00, 0.00, 0.125, 0.25, 1.25, 0, 12, 0),
    (1, 0.25, 4, 3, 64, 3, 0.50, 1.00, 0.250, 1.50, 2.50, 1, 12, 6),
    (2, 0.50, 2, 1, 64, 1, 0.50, 0.50, 0.125, 0.75, 0.75, 0, 2, 0),
    (3, 1.00, 4, 2, 64, 2, 1.25, 1.25, 0.125, 1.50, 2.00, 0, 5, 0),
    (4, 2.00, 16, 4, 64, 0, 2.00, -1.0, -1.0, -1.0, -1.0, 0, 0, 0),
]

# step, start, duration, running, (prefill seqs, prefill tokens, decode seqs, waiting), saturated,
# token, reserved future, internal, external, free (bytes, summing to the 1024-byte budget), kv read, preemptions
STEP_ROWS = [
    (0, 0.0, 0.5, 2, 1, 8, 1, 0, False, 128, 512, 128, 0, 256, 1000, 0),
    (1, 0.5, 1.5, 4, 0, 0, 4, 2, True, 512, 256, 128, 0, 128, 3000, 1),
    (2, 2.0, 0.5, 2, 0, 0, 2, 1, True, 256, 128, 128, 256, 256, 1000, 0),
    (3, 2.5, 1.5, 0, 0, 0, 0, 0, False, 0, 0, 0, 0, 1024, 0, 0),
]


#: the request-table column of each value of a REQUEST_ROWS row, in order
REQUEST_FIELDS = (
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "s_max_tokens",
    "num_generated",
    "boundary_s",
    "admitted_s",
    "prefill_compute_s",
    "first_token_s",
    "finish_s",
    "num_preemptions",
    "num_computed_tokens",
    "num_recomputed_tokens",
)
#: the step-table column of each value of a STEP_ROWS row, in order
STEP_FIELDS = (
    "step",
    "start_s",
    "duration_s",
    "num_running",
    "num_prefill_seqs",
    "num_prefill_tokens",
    "num_decode_seqs",
    "num_waiting",
    "saturated",
    "token_bytes",
    "reserved_future_bytes",
    "internal_bytes",
    "external_bytes",
    "free_bytes",
    "kv_read_bytes",
    "num_preemptions",
)


def _table(rows, fields: tuple[str, ...], columns: tuple[str, ...], **same) -> pd.DataFrame:
    """A table of ``columns``: a record per row (its values named by ``fields``, ``same`` in every
    record, 0 in the other columns)."""
    records = [{**dict.fromkeys(columns, 0), **same, **dict(zip(fields, row, strict=True))} for row in rows]
    return pd.DataFrame(records, columns=list(columns))


def requests(rows=REQUEST_ROWS) -> pd.DataFrame:
    """Single-branch requests: the branch's output is the request's, every preemption a recompute."""
    table = _table(rows, REQUEST_FIELDS, REQUEST_COLUMNS, num_branches=1)
    table["max_branch_output_tokens"] = table["output_tokens"]
    table["num_recompute_preemptions"] = table["num_preemptions"]
    return table


def steps(rows=STEP_ROWS) -> pd.DataFrame:
    """One step a row."""
    return _table(rows, STEP_FIELDS, STEP_COLUMNS, num_steps=1)


def run(req=None, stp=None, slo=None, max_concurrency=None):
    return summarize(
        requests() if req is None else req,
        steps() if stp is None else stp,
        budget_bytes=BUDGET_BYTES,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
        slo=slo or SloConfig(),
        max_concurrency=max_concurrency,
    )


def test_counts_duration_and_throughput_use_finished_requests():
    s = run()
    assert (s["num_requests"], s["num_finished"], s["num_never_admitted"]) == (5, 4, 1)
    assert s["duration_s"] == 2.5  # last finish 2.5 - first arrival 0.0
    assert s["num_output_tokens"] == 11  # 5 + 3 + 1 + 2; the unfinished request's 4 do not count
    assert s["throughput_tokens_per_s"] == 11 / 2.5
    assert s["throughput_requests_per_s"] == 4 / 2.5


def test_ttft_is_exactly_scheduling_delay_plus_queueing_plus_prefill():
    s = run()
    assert s["ttft_mean_s"] == (0.25 + 1.25 + 0.25 + 0.5) / 4
    assert s["sched_delay_mean_s"] == (0 + 0.25 + 0 + 0.25) / 4
    assert s["queue_mean_s"] == (0 + 0.5 + 0 + 0) / 4
    assert s["prefill_mean_s"] == (0.25 + 0.5 + 0.25 + 0.25) / 4
    assert s["sched_delay_mean_s"] + s["queue_mean_s"] + s["prefill_mean_s"] == s["ttft_mean_s"]
    assert s["prefill_compute_mean_s"] == (0.125 + 0.25 + 0.125 + 0.125) / 4


def test_percentiles_interpolate_linearly():
    s = run()
    # TTFT sorted: 0.25, 0.25, 0.5, 1.25; p50 at rank 1.5, p90 at 2.7, p99 at 2.97.
    assert s["ttft_p50_s"] == 0.375
    assert s["ttft_p90_s"] == pytest.approx(0.5 + 0.7 * 0.75, rel=1e-12)
    assert s["ttft_p99_s"] == pytest.approx(0.5 + 0.97 * 0.75, rel=1e-12)
    # e2e sorted: 0.25, 1.0, 1.25, 2.25.
    assert s["e2e_p50_s"] == 1.125
    assert s["e2e_mean_s"] == 4.75 / 4


def test_one_token_request_is_left_out_of_tpot():
    s = run()
    # TPOTs of r0, r1, r3: 0.25, 0.5, 0.5. Including r2 as 0 would give a p50 of 0.375.
    assert s["tpot_p50_s"] == 0.5
    assert s["tpot_mean_s"] == 1.25 / 3
    assert s["tpot_p90_s"] == 0.5


def test_without_slos_goodput_equals_throughput():
    s = run()
    assert s["goodput_requests_per_s"] == s["throughput_requests_per_s"]
    assert s["slo_attainment"] == 1.0


@pytest.mark.parametrize(
    ("slo", "good"),
    [
        (SloConfig(ttft_s=0.5), 3),  # r3's TTFT is exactly 0.5: thresholds are inclusive
        (SloConfig(tpot_s=0.25), 2),  # r0 exactly 0.25; r2 has one token and meets any TPOT SLO (vLLM)
        (SloConfig(ttft_s=0.5, tpot_s=0.25), 2),  # r0 and r2 meet both
        (SloConfig(e2e_s=1.0), 2),  # r2 and r3
        (SloConfig(ttft_s=0.5, tpot_s=0.25, e2e_s=1.0), 1),  # only r2 meets every one
        (SloConfig(ttft_s=0.125), 0),
    ],
)
def test_goodput_counts_finished_requests_meeting_every_slo(slo, good):
    s = run(slo=slo)
    assert s["goodput_requests_per_s"] == good / 2.5
    assert s["slo_attainment"] == good / 4


def test_recompute_tax_is_recomputed_over_all_positions_computed():
    s = run()
    # Prompts of admitted requests 8 + 4 + 2 + 4 = 18; decode steps 4 + 2 + 0 + 1 + 0 = 7; recomputed 6.
    assert s["num_recomputed_tokens"] == 6
    assert s["num_computed_tokens"] == 18 + 7 + 6
    assert s["recompute_tax"] == 6 / (18 + 7 + 6)
    assert s["num_preemptions"] == 1


def test_concurrency_and_utilization_are_time_weighted():
    s = run()
    assert s["num_steps"] == 4
    assert s["peak_concurrency"] == 4
    assert s["mean_concurrency"] == (2 * 0.5 + 4 * 1.5 + 2 * 0.5 + 0 * 1.5) / 4.0
    assert s["mean_concurrency_saturated"] == (4 * 1.5 + 2 * 0.5) / 2.0
    # the floor while memory binds, beside the peak: the two saturated steps run 4 and 2
    assert s["min_concurrency_saturated"] == 2
    assert s["utilization_mean"] == (0.125 * 0.5 + 0.5 * 1.5 + 0.25 * 0.5) / 4.0
    assert s["utilization_saturated"] == (0.5 * 1.5 + 0.25 * 0.5) / 2.0
    assert s["saturated_s"] == 2.0
    assert s["saturated_fraction"] == 0.5
    assert s["kv_read_bytes_per_s"] == 5000 / 4.0


def test_a_long_step_outweighs_a_short_one():
    rows = [
        (0, 0.0, 3.0, 1, 0, 0, 1, 0, True, 0, 0, 0, 0, 1024, 0, 0),
        (1, 3.0, 1.0, 5, 0, 0, 5, 0, True, 0, 0, 0, 0, 1024, 0, 0),
    ]
    s = run(stp=steps(rows))
    assert s["mean_concurrency"] == 2.0  # (1 * 3 + 5 * 1) / 4, not the step mean 3.0


def test_memory_breakdown_is_over_saturated_steps_and_sums_to_one():
    s = run()
    assert s["breakdown_period"] == "saturated"
    expected = {
        "frac_token": (0.5 * 1.5 + 0.25 * 0.5) / 2,
        "frac_reserved_future": (0.25 * 1.5 + 0.125 * 0.5) / 2,
        "frac_internal": (0.125 * 1.5 + 0.125 * 0.5) / 2,
        "frac_external": (0.0 * 1.5 + 0.25 * 0.5) / 2,
        "frac_free": (0.125 * 1.5 + 0.25 * 0.5) / 2,
    }
    assert {key: s[key] for key in expected} == expected
    assert sum(expected.values()) == 1.0
    # Tail (reserved future + internal slots) per sequence: (256 + 128) / 16 / 4 = 6 for 1.5 s,
    # (128 + 128) / 16 / 2 = 8 for 0.5 s.
    assert s["mean_tail_waste_tokens_per_seq"] == (6 * 1.5 + 8 * 0.5) / 2
    assert s["mean_tail_waste_bytes_per_seq"] == s["mean_tail_waste_tokens_per_seq"] * KV_BYTES_PER_TOKEN


def test_a_run_that_never_saturates_breaks_down_over_all_steps_and_says_so():
    rows = [row[:8] + (False,) + row[9:] for row in STEP_ROWS]
    s = run(stp=steps(rows))
    assert s["breakdown_period"] == "all"
    assert math.isnan(s["utilization_saturated"]) and math.isnan(s["mean_concurrency_saturated"])
    assert math.isnan(s["min_concurrency_saturated"])  # no floor where memory never binds
    assert s["saturated_s"] == 0.0
    assert s["frac_token"] == s["utilization_mean"]
    assert s["frac_free"] == (0.25 * 0.5 + 0.125 * 1.5 + 0.25 * 0.5 + 1.0 * 1.5) / 4
    # The idle step (nothing running) has no per-sequence tail and is left out of the average.
    assert s["mean_tail_waste_tokens_per_seq"] == pytest.approx((20 * 0.5 + 6 * 1.5 + 8 * 0.5) / 2.5, rel=1e-12)


def test_empty_tables_give_zero_counts_and_nan_statistics():
    s = run(req=pd.DataFrame(columns=list(REQUEST_COLUMNS)), stp=pd.DataFrame(columns=list(STEP_COLUMNS)))
    assert (s["num_requests"], s["num_finished"], s["num_steps"], s["peak_concurrency"]) == (0, 0, 0, 0)
    for key in ("duration_s", "ttft_p50_s", "tpot_mean_s", "goodput_requests_per_s", "mean_concurrency", "frac_free"):
        assert math.isnan(s[key]), key


def test_a_closed_loop_reports_its_concurrency_and_the_mean_it_held():
    assert "mean_requests_in_flight" not in run() and "max_concurrency" not in run()  # an open loop
    s = run(max_concurrency=2)
    # finished requests in flight for 1.25 + 2.25 + 0.25 + 1.0 = 4.75 s of a 2.5 s run (Little's law)
    assert s["max_concurrency"] == 2 and s["mean_requests_in_flight"] == 4.75 / 2.5
    assert type(s["max_concurrency"]) is int and type(s["mean_requests_in_flight"]) is float
    empty = run(
        pd.DataFrame(columns=list(REQUEST_COLUMNS)), pd.DataFrame(columns=list(STEP_COLUMNS)), max_concurrency=2
    )
    assert math.isnan(empty["mean_requests_in_flight"])


def test_summary_is_deterministic_plain_python_and_leaves_inputs_alone():
    req, stp = requests(), steps()
    before = (req.copy(), stp.copy())
    a, b = run(req, stp), run(req, stp)
    assert a == b
    pd.testing.assert_frame_equal(req, before[0])
    pd.testing.assert_frame_equal(stp, before[1])
    json.dumps(a)  # plain int / float / str, no numpy scalars
    assert all(type(v) in (int, float, str) for v in a.values())


def test_format_summary_rows_have_units_and_show_nan_as_na():
    s = run(slo=SloConfig(ttft_s=0.5))
    s["extra_metric"] = 1.5
    s["frac_external"] = math.nan
    rows = dict(format_summary(s))
    assert rows["TTFT p50 (ms)"] == "375.0"
    assert rows["goodput, vLLM's (requests/s meeting all SLOs)"] == "1.20"  # one format per metric: the tables'
    assert rows["throughput (output tokens/s)"] == "4"
    assert rows["SLO attainment (% of finished requests)"] == "75.0"
    assert rows["memory breakdown over steps"] == "saturated"
    assert rows["  external (% of budget)"] == "n/a"
    assert rows["peak concurrency (sequences)"] == "4"
    assert rows["extra_metric"] == "1.5"
    assert all(isinstance(label, str) and isinstance(value, str) for label, value in format_summary(s))


def test_metric_definitions_say_what_the_numbers_mean():
    assert "\n" not in METRIC_DEFINITIONS
    for phrase in ("queueing included", "one-token requests excluded", "vLLM", "every SLO"):
        assert phrase in METRIC_DEFINITIONS


# --- prefix caching and block-granular utilization -------------------------------------------------


def _with_prefix_columns(cached=(4, 2, 0, 2, 0), recompute_cached=(0, 4, 0, 0, 0)) -> pd.DataFrame:
    """The request table as a caching allocator writes it (columns added by hand here)."""
    req = requests()
    req["cached_prompt_tokens"] = list(cached)
    req["recompute_cached_tokens"] = list(recompute_cached)
    return req


def test_prefix_hit_rate_counts_first_admission_hits_over_admitted_prompts():
    s = run(req=_with_prefix_columns())
    # admitted prompts 8 + 4 + 2 + 4 = 18 (r4, 16 tokens, never admitted); hits 4 + 2 + 0 + 2
    assert s["prefix_cached_prompt_tokens"] == 8
    assert s["prefix_hit_rate"] == 8 / 18
    # r1's 4 tokens found again in cache after its preemption are its own work: not hits
    assert s["prefix_recompute_cached_tokens"] == 4


def test_without_the_prefix_columns_no_prefix_keys():
    s = run(req=requests().drop(columns=["cached_prompt_tokens", "recompute_cached_tokens"], errors="ignore"))
    assert not any(key.startswith("prefix_") for key in s)
    empty = run(req=_with_prefix_columns().iloc[:0], stp=steps().iloc[:0])
    assert math.isnan(empty["prefix_hit_rate"]) and empty["prefix_recompute_cached_tokens"] == 0


def test_block_utilization_counts_every_allocated_slot_and_token_utilization_only_filled_ones():
    s = run()
    # allocated = token + reserved future + internal: 768, 896, 512, 0 of 1024 bytes
    assert s["block_utilization_mean"] == (0.75 * 0.5 + 0.875 * 1.5 + 0.5 * 0.5 + 0 * 1.5) / 4
    assert s["block_utilization_saturated"] == (0.875 * 1.5 + 0.5 * 0.5) / 2
    assert s["block_utilization_mean"] > s["utilization_mean"]


def test_cached_evictable_blocks_are_not_allocated():
    # a ledger with a cached part: 256 token bytes held, 512 cached for later requests, 256 free
    stp = steps([(0, 0.0, 1.0, 1, 0, 0, 1, 0, False, 256, 0, 0, 0, 256, 0, 0)])
    stp["cached_bytes"] = 512.0
    s = run(stp=stp)
    assert s["block_utilization_mean"] == s["utilization_mean"] == 0.25
