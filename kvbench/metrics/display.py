"""How a run's summary reads to a person: labelled rows with units, in reading order."""

from __future__ import annotations

import math

from kvbench.memory.ledger import LEDGER_FIELDS
from kvbench.metrics.summary import PERCENTILES, Summary

METRIC_DEFINITIONS = (
    "TTFT = first token - intended arrival (queueing included); "
    "TPOT = (e2e - TTFT) / (output tokens - 1), each request weighted equally, one-token requests excluded; "
    "goodput = vLLM's: finished requests/s meeting every SLO given (inclusive); "
    "percentiles by linear interpolation; (sat.) = time-weighted over saturated steps (memory-bound: a refusal "
    "or a preemption), util. alone = over the whole run; floor = fewest sequences running while saturated; "
    "unfilled/seq = KV slots booked for a sequence but not yet written (reserved future plus the last block's tail)."
)

# (key, label with unit, how to show the value)
_MS, _PCT = "ms", "pct"
_ROWS: list[tuple[str, str, str]] = [
    ("num_requests", "requests", "int"),
    ("num_finished", "finished requests", "int"),
    ("duration_s", "duration (s)", "{:.3f}"),
    ("throughput_tokens_per_s", "throughput (output tokens/s)", "{:,.1f}"),
    ("throughput_requests_per_s", "throughput (requests/s)", "{:.3f}"),
    ("goodput_requests_per_s", "goodput, vLLM's (requests/s meeting all SLOs)", "{:.3f}"),
    ("slo_attainment", "SLO attainment (% of finished requests)", _PCT),
    *[(f"ttft_p{p}_s", f"TTFT p{p} (ms)", _MS) for p in PERCENTILES],
    ("ttft_mean_s", "TTFT mean (ms)", _MS),
    ("sched_delay_mean_s", "  scheduling delay mean (ms)", _MS),
    ("queue_mean_s", "  queueing mean (ms)", _MS),
    ("prefill_mean_s", "  prefill step mean (ms)", _MS),
    *[(f"tpot_p{p}_s", f"TPOT p{p} (ms)", _MS) for p in PERCENTILES],
    *[(f"e2e_p{p}_s", f"end-to-end p{p} (ms)", _MS) for p in PERCENTILES],
    ("peak_concurrency", "peak concurrency (sequences)", "int"),
    ("mean_concurrency", "mean concurrency (sequences)", "{:.1f}"),
    ("min_concurrency_saturated", "fewest sequences when saturated (sustained floor)", "int"),
    ("mean_concurrency_saturated", "mean concurrency when saturated (sequences)", "{:.1f}"),
    ("utilization_saturated", "KV utilization when saturated (% of budget)", _PCT),
    ("utilization_mean", "KV utilization mean (% of budget)", _PCT),
    ("saturated_s", "time saturated (s)", "{:.3f}"),
    ("breakdown_period", "memory breakdown over steps", "str"),
    *[(f"frac_{name}", f"  {name.replace('_', ' ')} (% of budget)", _PCT) for name in (f.removesuffix('_bytes') for f in LEDGER_FIELDS)],
    ("mean_tail_waste_tokens_per_seq", "mean tail waste (tokens/sequence)", "{:.1f}"),
    ("num_preemptions", "preemptions", "int"),
    ("num_recompute_preemptions", "  by recompute", "int"),
    ("num_swap_preemptions", "  by swap", "int"),
    ("num_swap_fallbacks", "  swaps recomputed for lack of host memory", "int"),
    ("recompute_tax", "recompute tax (% of tokens computed)", _PCT),
    ("preemption_cost_s", "preemption cost: swap transfers + recompute (s)", "{:.3f}"),
    ("swap_out_bytes", "bytes swapped out", "{:,.0f}"),
    ("swap_pool_peak_bytes", "host swap pool peak (bytes)", "{:,.0f}"),
    ("swap_break_even_kv_tokens", "swap beats recompute above (KV tokens)", "{:,.0f}"),
    ("num_copies", "copy-on-write / fork copies", "int"),
]


def _show(value: float | int | str, how: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if how == "int":
        return f"{int(value):,d}"
    if how == _MS:
        return f"{value * 1e3:.1f}"
    if how == _PCT:
        return f"{value * 100:.1f}"
    return how.format(value)


def format_summary(summary: Summary) -> list[tuple[str, str]]:
    """Human-readable ``(label with unit, value)`` rows, in reading order; NaN shows as ``n/a``.

    Keys of the summary not in the standard table follow it under their own names.
    """
    rows = [(label, _show(summary[key], how)) for key, label, how in _ROWS if key in summary]
    known = {key for key, _, _ in _ROWS}
    rows += [(key, _show(value, "{:.6g}")) for key, value in summary.items() if key not in known]
    return rows
