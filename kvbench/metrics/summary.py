"""Summarize one run's per-request and per-step tables into the numbers a results table prints.

Definitions follow the field (vLLM's serving benchmark: TTFT from the intended arrival, TPOT over
the tokens after the first, goodput as finished requests per second meeting every SLO) and are
spelled out in :func:`summarize`; :data:`kvbench.metrics.display.METRIC_DEFINITIONS` is the one-line version printed
under every table.
The function is pure: same tables in, same dict out, nothing read from the environment.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.metrics.slo_config import SloConfig  # re-exported: it lived here

PERCENTILES = (50, 90, 99)
#: the ledger parts held by sequences, block-granular: what a serving engine's usage gauge counts
#: as used (vLLM: 1 - free blocks / all blocks, where cached-but-evictable blocks count as free).
#: The other parts (external, free, and cached when the allocator caches prefixes) are not held.
ALLOCATED_FIELDS = ("token_bytes", "reserved_future_bytes", "internal_bytes")


Summary = dict[str, float | int | str]


def summarize(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    budget_bytes: int,
    kv_bytes_per_token: int,
    slo: SloConfig,
    max_concurrency: int | None = None,
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
    the same over the blocks allocated to sequences (the :data:`ALLOCATED_FIELDS`: tokens,
    reserved future and internal fragmentation), the figure a serving engine's usage gauge shows;
    the difference is slots booked but not (yet) holding a token. ``min_concurrency_saturated`` is the fewest
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

    :param requests: one row per request, the engine's request table.
    :param steps: one row per span of steps, the recorder's step table.
    :param budget_bytes: the KV-cache budget the ledgers are fractions of.
    :param kv_bytes_per_token: KV bytes of one token, to express tail waste in bytes.
    :param slo: latency objectives; ``None`` fields are not applied.
    :param max_concurrency: a closed-loop client's requests in flight; None: an open loop.
    :return: a flat dict of plain Python numbers (and the ``breakdown_period`` string).
    """
    summary: Summary = {}
    summary.update(_request_summary(requests, slo))
    summary.update(_step_summary(steps, budget_bytes, kv_bytes_per_token))
    if max_concurrency is not None:
        # only a closed loop has a concurrency to hold (and open-loop summaries keep their keys)
        done = requests[_col(requests, "finish_s") >= 0]
        in_flight_s = _fsum(_col(done, "finish_s") - _col(done, "arrival_s"))
        summary["max_concurrency"] = int(max_concurrency)
        summary["mean_requests_in_flight"] = _rate(in_flight_s, summary["duration_s"])
    return summary


def _col(df: pd.DataFrame, name: str, dtype: type = np.float64) -> np.ndarray:
    return df[name].to_numpy(dtype=dtype)


def _fsum(values: np.ndarray) -> float:
    """The exactly rounded sum of a float array. numpy's sums and BLAS's dot products add in an
    order that depends on the CPU's SIMD width and the BLAS kernel chosen at run time, which moves
    the last bits from one machine to another; an exactly rounded sum is the same everywhere."""
    return math.fsum(values.tolist())


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    # each product is exactly rounded by IEEE 754 and the sums by fsum: machine-independent
    total = _fsum(weights)
    return _fsum(values * weights) / total if total > 0 else math.nan


def _mean(values: np.ndarray) -> float:
    return _fsum(values) / len(values) if len(values) else math.nan


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
    for key in (
        "num_preemptions",
        "num_recompute_preemptions",
        "num_swap_preemptions",
        "num_swap_fallbacks",
        "swap_out_bytes",
        "swap_in_bytes",
    ):
        out[key] = int(_col(requests, key, np.int64).sum())
    out.update(_prefix_summary(requests, was_admitted))
    return out


def _prefix_summary(requests: pd.DataFrame, was_admitted: np.ndarray) -> Summary:
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


def _step_summary(steps: pd.DataFrame, budget_bytes: int, kv_bytes_per_token: int) -> Summary:
    duration_s = _col(steps, "duration_s")
    num_running = _col(steps, "num_running")
    is_saturated = steps["saturated"].to_numpy(dtype=bool)
    saturated_s = _fsum(duration_s[is_saturated])
    total_s = _fsum(duration_s)
    utilization = _col(steps, "token_bytes") / budget_bytes
    block_utilization = sum(_col(steps, field) for field in ALLOCATED_FIELDS) / budget_bytes

    # The breakdown is meant for the saturated regime; a run that never got there still gets one.
    period = is_saturated if saturated_s > 0 else np.ones(len(steps), dtype=bool)
    weights = duration_s[period]
    out: Summary = {
        "num_steps": int(_col(steps, "num_steps", np.int64).sum()),
        "peak_concurrency": int(num_running.max()) if len(steps) else 0,
        "mean_concurrency": _weighted_mean(num_running, duration_s),
        "mean_concurrency_saturated": _weighted_mean(num_running[is_saturated], duration_s[is_saturated]),
        # the sustained floor: what memory holds while it binds (the peak can be an over-admission
        # transient that preemption then cuts back); NaN, like the other "(sat.)" figures, when
        # memory never binds
        "min_concurrency_saturated": int(num_running[is_saturated].min()) if is_saturated.any() else math.nan,
        "utilization_mean": _weighted_mean(utilization, duration_s),
        "utilization_saturated": _weighted_mean(utilization[is_saturated], duration_s[is_saturated]),
        "block_utilization_mean": _weighted_mean(block_utilization, duration_s),
        "block_utilization_saturated": _weighted_mean(block_utilization[is_saturated], duration_s[is_saturated]),
        "saturated_s": saturated_s,
        "saturated_fraction": saturated_s / total_s if total_s > 0 else math.nan,
        "breakdown_period": "saturated" if saturated_s > 0 else "all",
    }
    for field in LEDGER_FIELDS:
        out[f"frac_{field.removesuffix('_bytes')}"] = _weighted_mean(_col(steps, field)[period] / budget_bytes, weights)

    # Steps with nothing running have no per-sequence tail; leave them out rather than divide by 0.
    has_seqs = num_running[period] > 0
    tail_tokens_all = (_col(steps, "reserved_future_bytes") + _col(steps, "internal_bytes")) / kv_bytes_per_token
    tail_per_seq = tail_tokens_all[period][has_seqs] / num_running[period][has_seqs]
    tail_tokens = _weighted_mean(tail_per_seq, weights[has_seqs])
    out["mean_tail_waste_tokens_per_seq"] = tail_tokens
    out["mean_tail_waste_bytes_per_seq"] = tail_tokens * kv_bytes_per_token
    # Achieved KV read bandwidth over the time steps took (the kernel's share of the roofline).
    out["kv_read_bytes_per_s"] = _rate(_fsum(_col(steps, "kv_read_bytes")), total_s)
    for key in ("swap_s", "recompute_s", "copy_s", "prefill_s", "decode_s"):
        out[key] = _fsum(_col(steps, key))
    out["preemption_cost_s"] = out["swap_s"] + out["recompute_s"]
    out["num_copies"] = int(_col(steps, "num_copies", np.int64).sum())
    out["copy_bytes"] = int(_col(steps, "copy_bytes", np.int64).sum())
    for kind in ("full", "window"):  # a model with several KV-cache groups: the held bytes by kind
        if f"{kind}_group_bytes" in steps:
            out[f"frac_{kind}_group"] = _weighted_mean(
                _col(steps, f"{kind}_group_bytes")[period] / budget_bytes, weights
            )
    if "pages_mapped" in steps:  # an allocator that maps pages on demand (vAttention)
        out["pages_mapped"] = int(_col(steps, "pages_mapped", np.int64).sum())
        out["page_map_s"] = _fsum(_col(steps, "page_map_s"))
        out["page_map_added_s"] = _fsum(_col(steps, "page_map_added_s"))
        out["page_map_added_share"] = out["page_map_added_s"] / total_s if total_s else math.nan
    # the most KV held at any step: token states, and everything allocated to sequences
    out["peak_token_bytes"] = int(_col(steps, "token_bytes_max", np.int64).max()) if len(steps) else 0
    out["peak_allocated_bytes"] = int(_col(steps, "allocated_bytes_max", np.int64).max()) if len(steps) else 0
    # sharing (copy-on-write fan-out, prefix-cache hits): what the same sequences would hold with
    # no block shared, at its peak, and how many times the allocated peak that is
    out["peak_shared_blocks"] = int(_col(steps, "num_shared_blocks", np.int64).max()) if len(steps) else 0
    out["peak_unshared_bytes"] = int(_col(steps, "unshared_bytes_max", np.int64).max()) if len(steps) else 0
    peak_allocated_bytes = out["peak_allocated_bytes"]
    out["sharing_saving"] = out["peak_unshared_bytes"] / peak_allocated_bytes if peak_allocated_bytes else math.nan
    return out
