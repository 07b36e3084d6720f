"""Summarize one run's per-request and per-step tables into the numbers a results table prints.

Definitions follow the field (see ``DESIGN.md``, "Metric definitions") and are spelled out in
:func:`summarize`; :data:`METRIC_DEFINITIONS` is the one-line version printed under every table.
The function is pure: same tables in, same dict out, nothing read from the environment.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvbench.app.config import SloConfig

METRIC_DEFINITIONS = (
    "TTFT = first token - intended arrival (queueing included); "
    "TPOT = (e2e - TTFT) / (output tokens - 1), each request weighted equally, one-token requests excluded; "
    "goodput = vLLM's: finished requests/s meeting every SLO given (inclusive); "
    "percentiles by linear interpolation; utilization and memory fractions time-weighted over saturated steps "
    "(memory-bound: a refusal or a preemption)."
)

PERCENTILES = (50, 90, 99)
_LEDGERS = ("token", "reserved_future", "internal", "external", "free")  # <name>_bytes step columns
Summary = dict[str, float | int | str]


def summarize(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    budget_bytes: int,
    kv_bytes_per_token: int,
    slo: SloConfig,
) -> Summary:
    """The run's summary row: counts, throughput, latency percentiles, goodput and memory ledgers.

    Requests (latency statistics use finished requests only, ``finish_s >= 0``):

    - ``duration_s`` = last finish - first arrival (over all requests); rates divide by it.
    - TTFT = ``first_token_s - arrival_s``, so queueing is included. It splits exactly into
      ``sched_delay`` (``boundary_s - arrival_s``: waiting for the next step boundary), ``queue``
      (``admitted_s - boundary_s``: waiting for memory or a batch slot) and ``prefill``
      (``first_token_s - admitted_s``: the step that prefilled it); their means add up to
      ``ttft_mean_s``. ``prefill_compute_mean_s`` is the prefill's own compute (``prefill_s``).
    - TPOT = ``(e2e - TTFT) / (output_tokens - 1)`` per request, every request weighted equally;
      one-token requests have no TPOT and are left out of its statistics (vLLM, SGLang).
    - e2e = ``finish_s - arrival_s``. Percentiles are numpy's linear interpolation.
    - ``throughput_tokens_per_s`` = output tokens of finished requests / ``duration_s``.
    - ``goodput_requests_per_s`` is vLLM's: finished requests meeting every SLO given in ``slo``
      (``metric <= threshold``, inclusive) / ``duration_s``. As in vLLM, a one-token request
      meets any TPOT SLO. With no SLO given it equals ``throughput_requests_per_s``.
      ``slo_attainment`` is the same count over ``num_finished``.
    - ``recompute_tax`` = recomputed tokens / all token positions computed, where positions
      computed = prompt tokens of every admitted request (its first prefill)
      + ``max(num_generated - 1, 0)`` per request (one position per decode step; the last token
      generated is never fed back) + ``num_recomputed_tokens`` (positions whose KV was computed
      before, discarded by a preemption and computed again). Swapping recomputes nothing.

    Steps (time-weighted by ``duration_s``): concurrency is ``num_running``; utilization is
    ``token_bytes / budget_bytes``. "Saturated" steps are those where memory binds: the allocator
    refused the head of the waiting queue, or a running sequence had to be preempted (the
    engine's ``saturated`` column); that is where allocators differ, so the
    memory breakdown (``frac_*`` of the budget) and ``mean_tail_waste_tokens_per_seq``
    (``allocated_tail_tokens / num_running``) are averaged over them, or over all steps if the
    run never saturated, as ``breakdown_period`` ("saturated" / "all") records.

    Empty inputs give zero counts and NaN statistics, never an exception.

    :param requests: one row per request, the engine's request table.
    :param steps: one row per engine step, the engine's step table.
    :param budget_bytes: the KV-cache budget the ledgers are fractions of.
    :param kv_bytes_per_token: KV bytes of one token, to express tail waste in bytes.
    :param slo: latency objectives; ``None`` fields are not applied.
    :return: a flat dict of plain Python numbers (and the ``breakdown_period`` string).
    """
    summary: Summary = {}
    summary.update(_request_summary(requests, slo))
    summary.update(_step_summary(steps, budget_bytes, kv_bytes_per_token))
    return summary


def _col(df: pd.DataFrame, name: str, dtype: type = np.float64) -> np.ndarray:
    return df[name].to_numpy(dtype=dtype)


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    total = float(weights.sum())
    return float(np.dot(values, weights) / total) if total > 0 else math.nan


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else math.nan


def _percentiles(values: np.ndarray, prefix: str) -> Summary:
    out: Summary = {f"{prefix}_mean_s": _mean(values)}
    for p in PERCENTILES:
        out[f"{prefix}_p{p}_s"] = float(np.percentile(values, p)) if len(values) else math.nan
    return out


def _rate(count: float, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else math.nan


def _request_summary(requests: pd.DataFrame, slo: SloConfig) -> Summary:
    finish_s = _col(requests, "finish_s")
    is_finished = finish_s >= 0
    done = requests[is_finished]
    num_finished = int(is_finished.sum())

    arrival_s = _col(done, "arrival_s")
    boundary_s, admitted_s = _col(done, "boundary_s"), _col(done, "admitted_s")
    first_token_s = _col(done, "first_token_s")
    output_tokens = _col(done, "output_tokens", np.int64)
    ttft_s = first_token_s - arrival_s
    e2e_s = finish_s[is_finished] - arrival_s
    has_tpot = output_tokens > 1
    tpot_s = np.zeros(num_finished)  # 0 for one-token requests: they meet any TPOT SLO (vLLM)
    tpot_s[has_tpot] = (e2e_s - ttft_s)[has_tpot] / (output_tokens[has_tpot] - 1)

    if num_finished and len(requests):
        duration_s = float(finish_s[is_finished].max() - _col(requests, "arrival_s").min())
    else:
        duration_s = math.nan

    is_good = np.ones(num_finished, dtype=bool)
    for threshold, metric in ((slo.ttft_s, ttft_s), (slo.tpot_s, tpot_s), (slo.e2e_s, e2e_s)):
        if threshold is not None:
            is_good &= metric <= threshold
    num_good = int(is_good.sum())

    # Recompute tax: see the docstring for the exact definition of "positions computed".
    was_admitted = _col(requests, "admitted_s") >= 0
    num_generated = _col(requests, "num_generated", np.int64)
    num_recomputed = int(_col(requests, "num_recomputed_tokens", np.int64).sum())
    num_computed = (
        int(_col(requests, "prompt_tokens", np.int64)[was_admitted].sum())
        + int(np.maximum(num_generated - 1, 0).sum())
        + num_recomputed
    )

    out: Summary = {
        "num_requests": int(len(requests)),
        "num_finished": num_finished,
        "num_never_admitted": int((~was_admitted).sum()),
        "duration_s": duration_s,
        "num_output_tokens": int(output_tokens.sum()),
        "throughput_tokens_per_s": _rate(float(output_tokens.sum()), duration_s),
        "throughput_requests_per_s": _rate(num_finished, duration_s),
        "goodput_requests_per_s": _rate(num_good, duration_s),
        "slo_attainment": num_good / num_finished if num_finished else math.nan,
    }
    out.update(_percentiles(ttft_s, "ttft"))
    out.update(_percentiles(tpot_s[has_tpot], "tpot"))
    out.update(_percentiles(e2e_s, "e2e"))
    out.update(
        {
            "sched_delay_mean_s": _mean(boundary_s - arrival_s),
            "queue_mean_s": _mean(admitted_s - boundary_s),
            "prefill_mean_s": _mean(first_token_s - admitted_s),
            "prefill_compute_mean_s": _mean(_col(done, "prefill_s")),
            "num_preemptions": int(_col(requests, "num_preemptions", np.int64).sum()),
            "num_recomputed_tokens": num_recomputed,
            "recompute_tax": num_recomputed / num_computed if num_computed else math.nan,
        }
    )
    return out


def _step_summary(steps: pd.DataFrame, budget_bytes: int, kv_bytes_per_token: int) -> Summary:
    duration_s = _col(steps, "duration_s")
    num_running = _col(steps, "num_running")
    is_saturated = steps["saturated"].to_numpy(dtype=bool)
    saturated_s = float(duration_s[is_saturated].sum())
    total_s = float(duration_s.sum())
    utilization = _col(steps, "token_bytes") / budget_bytes

    # The breakdown is meant for the saturated regime; a run that never got there still gets one.
    period = is_saturated if saturated_s > 0 else np.ones(len(steps), dtype=bool)
    weights = duration_s[period]
    out: Summary = {
        "num_steps": int(len(steps)),
        "peak_concurrency": int(num_running.max()) if len(steps) else 0,
        "mean_concurrency": _weighted_mean(num_running, duration_s),
        "mean_concurrency_saturated": _weighted_mean(num_running[is_saturated], duration_s[is_saturated]),
        "utilization_mean": _weighted_mean(utilization, duration_s),
        "utilization_saturated": _weighted_mean(utilization[is_saturated], duration_s[is_saturated]),
        "saturated_s": saturated_s,
        "saturated_fraction": saturated_s / total_s if total_s > 0 else math.nan,
        "breakdown_period": "saturated" if saturated_s > 0 else "all",
    }
    for ledger in _LEDGERS:
        out[f"frac_{ledger}"] = _weighted_mean(_col(steps, f"{ledger}_bytes")[period] / budget_bytes, weights)

    # Steps with nothing running have no per-sequence tail; leave them out rather than divide by 0.
    has_seqs = num_running[period] > 0
    tail_per_seq = _col(steps, "allocated_tail_tokens")[period][has_seqs] / num_running[period][has_seqs]
    tail_tokens = _weighted_mean(tail_per_seq, weights[has_seqs])
    out["mean_tail_waste_tokens_per_seq"] = tail_tokens
    out["mean_tail_waste_bytes_per_seq"] = tail_tokens * kv_bytes_per_token
    # Achieved KV read bandwidth over the time steps took (the kernel's share of the roofline).
    out["kv_read_bytes_per_s"] = _rate(float(_col(steps, "kv_read_bytes").sum()), total_s)
    return out


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
    ("mean_concurrency_saturated", "mean concurrency when saturated (sequences)", "{:.1f}"),
    ("utilization_saturated", "KV utilization when saturated (% of budget)", _PCT),
    ("utilization_mean", "KV utilization mean (% of budget)", _PCT),
    ("saturated_s", "time saturated (s)", "{:.3f}"),
    ("breakdown_period", "memory breakdown over steps", "str"),
    *[(f"frac_{name}", f"  {name.replace('_', ' ')} (% of budget)", _PCT) for name in _LEDGERS],
    ("mean_tail_waste_tokens_per_seq", "mean tail waste (tokens/sequence)", "{:.1f}"),
    ("num_preemptions", "preemptions", "int"),
    ("recompute_tax", "recompute tax (% of tokens computed)", _PCT),
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
