"""Summarize one run's per-request and per-step tables into the numbers a results table prints.

Definitions follow the field (vLLM's serving benchmark: TTFT from the intended arrival, TPOT over
the tokens after the first, goodput as finished requests per second meeting every SLO) and are
spelled out in :func:`summarize`; :data:`kvbench.metrics.display.METRIC_DEFINITIONS` is the one-line version printed
under every table.
The function is pure: same tables in, same dict out, nothing read from the environment.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from kvbench.core.sequence import EVENT_COLUMNS
from kvbench.metrics.slo_config import SloConfig  # re-exported: it lived here
from kvbench.metrics.step_totals import StepTotals

if TYPE_CHECKING:
    import pandas as pd

    from kvbench.io.table import ColumnTable

    Table = pd.DataFrame | ColumnTable

PERCENTILES = (50, 90, 99)


Summary = dict[str, float | int | str]


def summarize(
    requests: Table,
    steps: Table | StepTotals | None,
    *,
    budget_bytes: int,
    kv_bytes_per_token: int,
    slo: SloConfig,
    max_concurrency: int | None = None,
    kv_kinds: dict[str, int] | None = None,
) -> Summary:
    """The run's summary row: counts, throughput, latency percentiles, goodput and memory ledgers.

    Requests (latency statistics use finished requests only, ``finish_s >= 0``):

    - ``duration_s`` = last finish - first arrival (over all requests); rates divide by it.
    - TTFT = ``first_token_s - arrival_s``, so queueing is included. It splits exactly into
      ``sched_delay`` (``boundary_s - arrival_s``: waiting for the next step boundary), ``queue``
      (``admitted_s - boundary_s``: waiting for memory or a batch slot) and ``prefill``
      (``first_token_s - admitted_s``: the step that prefilled it); their means add up to
      ``ttft_mean_s``. ``prefill_compute_mean_s`` is the prefill's own compute (``prefill_compute_s``).
    - TPOT = ``(e2e - TTFT) / (output tokens - 1)`` per request, every request weighted equally,
      with the output tokens of its longest branch (a fan-out's branches decode together);
      one-token requests have no TPOT and are left out of its statistics (vLLM, SGLang).
    - e2e = ``finish_s - arrival_s``. Percentiles are numpy's linear interpolation.
    - ``throughput_tokens_per_s`` = output tokens of finished requests (every branch's) / ``duration_s``.
    - ``goodput_requests_per_s`` is vLLM's: finished requests meeting every SLO given in ``slo``
      (``metric <= threshold``, inclusive) / ``duration_s``. As in vLLM, a one-token request
      meets any TPOT SLO. With no SLO given it equals ``throughput_requests_per_s``.
      ``slo_attainment`` is the same count over ``num_finished``.
    - ``recompute_tax`` = ``num_recomputed_tokens`` (positions whose KV had been computed, was
      discarded by a recompute preemption and was computed again) / ``num_computed_tokens`` (every
      position any step computed, recomputations included). Swapping recomputes nothing.
    - Preemptions are counted by mechanism; ``num_swap_fallbacks`` are swaps that could not be
      done (host pool full) and were recomputed instead.

    Prefix caching (when the request table has the columns; 0 without a prefix cache):
    ``prefix_hit_rate`` = prompt tokens served from cache that the request had never computed
    itself (``cached_prompt_tokens``) / prompt tokens, both over admitted requests; tokens a
    preempted request lost and got back from the cache when re-admitted are not hits (they were
    its own work) and are reported on their own as ``prefix_recompute_cached_tokens``.

    Steps (rows are spans of steps; time-weighted by ``duration_s``, which is exact because a
    span's ledger columns are its time-weighted means): concurrency is ``num_running``;
    utilization is ``token_bytes / budget_bytes``, KV slots holding a token (``utilization_mean``
    over the whole run, ``utilization_saturated`` while memory binds); ``block_utilization_*`` is
    the same over the blocks allocated to sequences
    (:data:`~kvbench.metrics.step_totals.ALLOCATED_FIELDS`: tokens, reserved future and internal
    fragmentation), the figure a serving engine's usage gauge shows; the difference is slots booked
    but not (yet) holding a token. ``min_concurrency_saturated`` is the fewest
    sequences running while memory binds (the sustained floor beside the peak). "Saturated" steps
    are those where memory binds:
    the allocator refused the head of the waiting queue, or a running request had to be preempted
    (the ``saturated`` column); that is where allocators differ, so the memory breakdown
    (``frac_*`` of the budget) and ``mean_tail_waste_tokens_per_seq`` (reserved-future plus
    internal slots per running sequence) are averaged over them, or over all steps if the run
    never saturated, as ``breakdown_period`` ("saturated" / "all") records. ``preemption_cost_s``
    is the step time spent on swap transfers plus recomputing lost KV.

    Closed loop (``max_concurrency`` given: a client that keeps that many requests in flight):
    ``max_concurrency`` is the setting and ``mean_requests_in_flight`` what the run held, the
    time-weighted mean over ``duration_s`` of finished requests between arrival and finish, i.e.
    their summed e2e / ``duration_s``. It stays below the setting by the ramp-down at the end,
    when fewer requests than that are left. Open-loop runs have neither key.

    Empty inputs give zero counts and NaN statistics, never an exception.

    :param requests: one row per request, the engine's request table (a
        :class:`~kvbench.io.table.ColumnTable` or a DataFrame).
    :param steps: one row per span of steps, the recorder's step table (either kind), or its
        :class:`~kvbench.metrics.step_totals.StepTotals` (a run that streamed the table to its
        files): the same numbers, to the last bit. None: the requests' keys only (a disaggregated
        deployment, whose workers' memories are summarized one by one).
    :param budget_bytes: the KV-cache budget the ledgers are fractions of.
    :param kv_bytes_per_token: KV bytes of one token, to express tail waste in bytes.
    :param slo: latency objectives; ``None`` fields are not applied.
    :param max_concurrency: a closed-loop client's requests in flight; None: an open loop.
    :param kv_kinds: the model's per-token bytes by layer kind (:func:`kvbench.metrics.kv_kinds.kv_kinds`):
        given, ``peak_<kind>_bytes`` says what the budget held of each (latent, indexer, full,
        window, state) at its peak; ``frac_state`` (the linear-attention state's share) is there
        only where the run held a state.
    :return: a flat dict of plain Python numbers (and the ``breakdown_period`` string).
    """
    summary: Summary = {}
    summary.update(_request_summary(requests, slo))
    # (None: a deployment's several memories, each worker's ledger summarized on its own)
    if steps is not None and not isinstance(steps, StepTotals):  # a held table: added up in one batch
        totals = StepTotals(budget_bytes, kv_bytes_per_token, kv_kinds)
        totals.add({name: np.asarray(steps[name]) for name in steps.columns})
        steps = totals
    if steps is not None:
        summary.update(steps.summary())
    if max_concurrency is not None:
        # only a closed loop has a concurrency to hold (and open-loop summaries keep their keys)
        done = requests[_col(requests, "finish_s") >= 0]
        in_flight_s = _fsum(_col(done, "finish_s") - _col(done, "arrival_s"))
        summary["max_concurrency"] = int(max_concurrency)
        summary["mean_requests_in_flight"] = _rate(in_flight_s, summary["duration_s"])
    return summary


def _col(table: Table, name: str, dtype: type = np.float64) -> np.ndarray:
    """A column as a numpy array of ``dtype`` (a DataFrame's or a ColumnTable's alike)."""
    return np.asarray(table[name], dtype=dtype)


def _fsum(values: np.ndarray) -> float:
    """The exactly rounded sum of a float array. numpy's sums and BLAS's dot products add in an
    order that depends on the CPU's SIMD width and the BLAS kernel chosen at run time, which moves
    the last bits from one machine to another; an exactly rounded sum is the same everywhere."""
    return math.fsum(values.tolist())


def _mean(values: np.ndarray) -> float:
    return _fsum(values) / len(values) if len(values) else math.nan


def _percentiles(values: np.ndarray, prefix: str) -> Summary:
    out: Summary = {f"{prefix}_mean_s": _mean(values)}
    for p in PERCENTILES:
        out[f"{prefix}_p{p}_s"] = float(np.percentile(values, p)) if len(values) else math.nan
    return out


def _rate(count: float, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else math.nan


def _request_summary(requests: Table, slo: SloConfig) -> Summary:
    finish_s = _col(requests, "finish_s")
    is_finished = finish_s >= 0
    done = requests[is_finished]
    num_finished = int(is_finished.sum())

    arrival_s = _col(done, "arrival_s")
    boundary_s, admitted_s = _col(done, "boundary_s"), _col(done, "admitted_s")
    first_token_s = _col(done, "first_token_s")
    output_tokens = _col(done, "output_tokens", np.int64)
    longest_tokens = _col(done, "max_branch_output_tokens", np.int64)
    ttft_s = first_token_s - arrival_s
    e2e_s = finish_s[is_finished] - arrival_s
    has_tpot = longest_tokens > 1
    tpot_s = np.zeros(num_finished)  # 0 for one-token requests: they meet any TPOT SLO (vLLM)
    tpot_s[has_tpot] = (e2e_s - ttft_s)[has_tpot] / (longest_tokens[has_tpot] - 1)

    if num_finished and len(requests):
        duration_s = float(finish_s[is_finished].max() - _col(requests, "arrival_s").min())
    else:
        duration_s = math.nan

    is_good = np.ones(num_finished, dtype=bool)
    for threshold, metric in ((slo.ttft_s, ttft_s), (slo.tpot_s, tpot_s), (slo.e2e_s, e2e_s)):
        if threshold is not None:
            is_good &= metric <= threshold
    num_good = int(is_good.sum())

    was_admitted = _col(requests, "admitted_s") >= 0
    num_recomputed = int(_col(requests, "num_recomputed_tokens", np.int64).sum())
    num_computed = int(_col(requests, "num_computed_tokens", np.int64).sum())
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
            "prefill_compute_mean_s": _mean(_col(done, "prefill_compute_s")),
            "num_computed_tokens": num_computed,
            "num_recomputed_tokens": num_recomputed,
            "recompute_tax": num_recomputed / num_computed if num_computed else math.nan,
        }
    )
    for key in EVENT_COLUMNS:  # the preemption and swap counts, totalled over the requests
        out[key] = int(_col(requests, key, np.int64).sum())
    out.update(_prefix_summary(requests, was_admitted))
    return out


def _prefix_summary(requests: Table, was_admitted: np.ndarray) -> Summary:
    """Prefix-cache hits, from the request table's columns when it has them (a caching allocator)."""
    out: Summary = {}
    if "cached_prompt_tokens" in requests:
        cached_tokens = int(_col(requests, "cached_prompt_tokens", np.int64)[was_admitted].sum())
        prompt_tokens = int(_col(requests, "prompt_tokens", np.int64)[was_admitted].sum())
        out["prefix_cached_prompt_tokens"] = cached_tokens
        out["prefix_hit_rate"] = cached_tokens / prompt_tokens if prompt_tokens else math.nan
    if "recompute_cached_tokens" in requests:
        out["prefix_recompute_cached_tokens"] = int(_col(requests, "recompute_cached_tokens", np.int64).sum())
    return out
