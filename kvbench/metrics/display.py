"""How a run's summary reads to a person: labelled rows with units, numbers formatted for people.

Two views of one summary dict: :func:`headline_rows`, the one-screen table printed at the end of a
run (the numbers a user acts on), and :func:`format_summary`, every key with its unit (the files,
``summary.json`` and the Parquet/CSV tables, hold all of them unformatted).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.metrics.catalogue import METRICS
from kvbench.metrics.summary import Summary

#: printed under every table; the full definitions are in :func:`kvbench.metrics.summary.summarize`
METRIC_DEFINITIONS = (
    "TTFT: from intended arrival (queueing included); TPOT = (e2e - TTFT) / (tokens - 1), one-token requests "
    "excluded; goodput: vLLM's, finished req/s meeting every SLO; (sat.): while memory binds"
)

# every key of the full list: its words and how its value is shown come from the catalogue
_ROWS: list[tuple[str, str, str]] = [(m.key, m.label, m.show) for m in METRICS]
_MS, _PCT = "ms", "pct"


def format_bytes(num_bytes: float) -> str:
    """``62.5 GB``: decimal units (kB, MB, GB, TB), as budgets are typed (``kv_budget_bytes=10e9``)."""
    if not _is_number(num_bytes):
        return "n/a"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.{1 if abs(num_bytes) >= 10 * scale else 2}f} {unit}"
    return f"{int(num_bytes):,d} B"


def format_number(value) -> str:
    """A number without a known unit, for people: thousands separators, four significant digits
    below 1,000, never an exponent (``6.25e+10`` reads as ``62,500,000,000``)."""
    if not _is_number(value):
        return "n/a" if isinstance(value, float) else str(value)
    if isinstance(value, (int, np.integer)) or (abs(value) >= 1e3 and float(value).is_integer()):
        return f"{int(value):,d}"
    if abs(value) >= 1e3:
        return f"{value:,.1f}"
    return np.format_float_positional(value, precision=4, fractional=False, trim="-")


def _is_number(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return not math.isnan(value)


def show_value(value: float | int | str, how: str) -> str:
    """A value as the catalogue's ``show`` says (:mod:`kvbench.metrics.catalogue`); NaN is ``n/a``."""
    if isinstance(value, str) or how == "text":
        return str(value)
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if how == "int":
        return f"{int(value):,d}"
    if how == _MS:
        return f"{value * 1e3:,.1f}"
    if how == _PCT:
        return f"{value * 100:.1f}"
    if how == "bytes":
        return format_bytes(value)
    return how.format(value)


def format_summary(summary: Summary) -> list[tuple[str, str]]:
    """Every key as a ``(label with unit, value)`` row, in reading order; NaN shows as ``n/a``.

    Keys of the summary not in the standard table follow it under their own names, formatted by
    their unit suffix (``_bytes`` in kB/MB/GB, counts with thousands separators, never ``6.25e+10``).
    """
    rows = [(label, show_value(summary[key], how)) for key, label, how in _ROWS if key in summary]
    known = {key for key, _, _ in _ROWS}
    rows += [(key, _show_by_name(key, value)) for key, value in summary.items() if key not in known]
    return rows


def _show_by_name(key: str, value) -> str:
    """A value by its key's unit suffix: ``*_bytes`` in kB/MB/GB, ``*_bytes_per_<x>`` as kB/MB/GB per x."""
    if _is_number(value) and key.endswith("_bytes"):
        return format_bytes(value)
    if _is_number(value) and "_bytes_per_" in key:
        return f"{format_bytes(value)}/{key.rsplit('_bytes_per_', 1)[1]}"
    return format_number(value)


def _get(summary: Summary, key: str):
    """The summary's number for ``key``, or None when it is missing or NaN (shown as ``n/a``)."""
    value = summary.get(key)
    return value if _is_number(value) else None


def _fixed(decimals: int):
    return lambda value: "n/a" if value is None else f"{value:,.{decimals}f}"


def _ms(value) -> str:
    return "n/a" if value is None else f"{value * 1e3:,.1f}"


def _pct(value) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}"


def _count(value) -> str:
    return "n/a" if value is None else f"{int(value):,d}"


def _joined(summary: Summary, keys: tuple[str, ...], show, sep: str = " / ") -> str:
    return sep.join(show(_get(summary, key)) for key in keys)


def headline_rows(summary: Summary, *, slo_given: bool | None = None) -> list[tuple[str, str]]:
    """The numbers a user reads first, as ``(label with unit, value)`` rows that fit one screen.

    Related numbers share a row (``p50 / p99``); rows that would say nothing are left out
    (recompute tax, preemption cost, swaps and copies when zero; goodput when no SLO was given).
    ``slo_given=None`` (not known) shows goodput when some finished request missed an SLO.
    """
    if summary.get("deployment") == "disagg":  # several workers, each its own memory: rows per worker
        from kvbench.metrics.deployment_rows import deployment_rows

        return [*_request_rows(summary, slo_given), *deployment_rows(summary), *_preemption_rows(summary)]
    return [
        *_request_rows(summary, slo_given),
        *_memory_rows(summary),
        *_prefix_rows(summary),
        *_preemption_rows(summary),
        *_sharing_rows(summary),
    ]


def _request_rows(s: Summary, slo_given: bool | None) -> list[tuple[str, str]]:
    rows = [
        ("requests finished / sent", _joined(s, ("num_finished", "num_requests"), _count)),
        ("duration (s)", _fixed(2)(_get(s, "duration_s"))),
        (
            "throughput (output tok/s, req/s)",
            f"{_fixed(1)(_get(s, 'throughput_tokens_per_s'))} / {_fixed(2)(_get(s, 'throughput_requests_per_s'))}",
        ),
    ]
    attainment = _get(s, "slo_attainment")
    if slo_given or (slo_given is None and attainment is not None and attainment < 1):
        goodput = f"{_fixed(2)(_get(s, 'goodput_requests_per_s'))} ({_pct(attainment)} % of finished)"
        rows.append(("goodput, vLLM's (req/s meeting every SLO)", goodput))
    if _get(s, "num_trace_requests_dropped") or _get(s, "num_trace_requests_clipped"):
        # a trace replay's too_long policy left requests out or shortened them: the numbers are of the rest
        rows.append(
            (
                "trace rows read / dropped / clipped (too long)",
                _joined(s, ("num_trace_rows_read", "num_trace_requests_dropped", "num_trace_requests_clipped"), _count),
            )
        )
    if isinstance(s.get("measured_on"), str):  # a real run: the machine its step times are of
        rows.append(("measured on", s["measured_on"]))
    if _get(s, "sim_step_error_median") is not None:
        # a real run: how far the cost model's price of each step was from the measured time
        rows.append(
            (
                "sim's step-time error p50 / p90 (% of measured)",
                _joined(s, ("sim_step_error_median", "sim_step_error_p90"), _pct),
            )
        )
    ttft_keys = ("ttft_mean_s", "sched_delay_mean_s", "queue_mean_s", "prefill_mean_s")
    unit, show = _time_unit(s, ttft_keys)
    ttft_parts = _joined(s, ttft_keys[1:], show, " + ")
    return rows + [
        _time_row(s, "TTFT p50 / p99", ("ttft_p50_s", "ttft_p99_s")),
        (f"  mean = step wait + queueing + prefill ({unit})", f"{show(_get(s, 'ttft_mean_s'))} = {ttft_parts}"),
        _time_row(s, "TPOT p50 / p99", ("tpot_p50_s", "tpot_p99_s")),
        _time_row(s, "end-to-end p50 / p99", ("e2e_p50_s", "e2e_p99_s")),
    ]


#: a row of times (seconds, shown in milliseconds) is shown in seconds where a value reaches this
#: many seconds: five digits of milliseconds are where a reader starts counting commas
SECONDS_FROM_S = 10.0


def _time_unit(s: Summary, keys: tuple[str, ...]) -> tuple[str, Callable[[float | None], str]]:
    """The unit a row of times reads best in, and how a value is shown in it: ms, or s where a value
    of the row reaches :data:`SECONDS_FROM_S` (``3,673.0 s``, not ``3,673,012.0 ms``)."""
    values = [abs(v) for v in (_get(s, key) for key in keys) if v is not None]
    if values and max(values) >= SECONDS_FROM_S:
        return "s", _fixed(1)
    return "ms", _ms


def _time_row(s: Summary, words: str, keys: tuple[str, ...]) -> tuple[str, str]:
    unit, show = _time_unit(s, keys)
    return f"{words} ({unit})", _joined(s, keys, show)


def _memory_rows(s: Summary) -> list[tuple[str, str]]:
    rows = [
        (
            "peak concurrency / floor (sat.) (seqs)",
            _joined(s, ("peak_concurrency", "min_concurrency_saturated"), _count),
        ),
        (
            "mean concurrency: run / (sat.) (seqs)",
            _joined(s, ("mean_concurrency", "mean_concurrency_saturated"), _fixed(1)),
        ),
        (
            "KV utilization: run / (sat.) (% of KV budget)",
            _joined(s, ("utilization_mean", "utilization_saturated"), _pct),
        ),
    ]
    if _get(s, "block_utilization_mean") is not None:
        # the block-granular figure a server's usage gauge shows, beside the token slots above
        blocks = _joined(s, ("block_utilization_mean", "block_utilization_saturated"), _pct)
        rows.append(("  in allocated blocks, a server's gauge (%)", blocks))
    if (saturated_s := _get(s, "saturated_s")) is not None:
        share = _get(s, "saturated_fraction")
        rows.append(
            ("time saturated (s)", f"{saturated_s:,.2f}" + ("" if share is None else f" ({_pct(share)} % of run)"))
        )
    period = "(sat.)" if s.get("breakdown_period") == "saturated" else "(all steps)"
    parts = {name: _get(s, f"frac_{name}") for name in (f.removesuffix("_bytes") for f in LEDGER_FIELDS)}
    if any(value is not None for value in parts.values()):
        # what the budget holds on one row, what fragmentation loses on the next
        lost = ("internal", "external")
        # a prefix cache's part is said only when it holds something (0 for allocators without one),
        # the linear-attention state's only where the model has one
        held = ", ".join(
            f"{name.replace('_', ' ')} {_pct(v)}"
            for name, v in parts.items()
            if name not in lost and (name not in ("cached", "state") or v)
        )
        rows.append((f"memory {period} (% of KV budget)", held))
        rows.append((f"fragmentation {period} (% of KV budget)", ", ".join(f"{n} {_pct(parts.get(n))}" for n in lost)))
    if (unfilled := _get(s, "mean_tail_waste_tokens_per_seq")) is not None:
        rows.append(("unfilled KV per sequence (tokens)", f"{unfilled:,.1f}"))
    if (budget := _get(s, "kv_budget_bytes")) is not None:
        per_token = _get(s, "kv_bytes_per_token")
        tokens = f" ({int(budget / per_token):,d} tokens)" if per_token else ""
        rows.append(("KV budget", format_bytes(budget) + tokens))
    return rows


def _prefix_rows(s: Summary) -> list[tuple[str, str]]:
    """The prefix cache's hits, the offline bounds beside them and, at 0 hits, why; none without a trace
    that says what requests share."""
    rows = []
    bounds = ("prefix_hit_rate_infinite", "prefix_hit_rate_belady", "prefix_hit_rate_lru_offline")
    has_bounds = any(key in s for key in bounds)  # the trace says what requests share
    # the request table may carry the hit columns for every allocator: a 0 says something only
    # where the trace shares prefixes (the bounds are there) or the cache served something
    if "prefix_hit_rate" in s and (
        has_bounds or _get(s, "prefix_hit_rate") or _get(s, "prefix_recompute_cached_tokens")
    ):
        rows.append(("prefix cache hits (% of prompt tokens)", _pct(_get(s, "prefix_hit_rate"))))
    if has_bounds:
        rows.append(("  offline: ceiling / Belady / LRU (%)", _joined(s, bounds, _pct)))
    if _get(s, "prefix_recompute_cached_tokens"):
        rows.append(("  re-admitted from cache (tokens, not hits)", _count(_get(s, "prefix_recompute_cached_tokens"))))
    if isinstance(note := s.get("prefix_note"), str) and note:
        rows.append(("  note", note))
    if "host_cache_bytes" in s:  # a host tier for evicted blocks (allocator.host_cache_bytes > 0)
        rows.extend(_host_tier_rows(s))
    return rows


def _host_tier_rows(s: Summary) -> list[tuple[str, str]]:
    """The host tier's hits beside the GPU's, its traffic, and the reloads' cost."""
    with_host = ("prefix_hit_rate_belady_with_host", "prefix_hit_rate_lru_offline_with_host")
    wait = "host_reload_step_s" if s.get("host_reload") == "blocking" else "host_reload_wait_s"
    return [
        (
            f"  hits in GPU / reloaded from a {format_bytes(_get(s, 'host_cache_bytes'))} host tier (%)",
            _joined(s, ("prefix_hit_rate_gpu", "prefix_hit_rate_host"), _pct),
        ),
        ("  offline with the host tier: Belady / LRU (%)", _joined(s, with_host, _pct)),
        ("  reloaded / offloaded", _joined(s, ("host_reload_bytes", "host_offload_bytes"), format_bytes)),
        (
            f"  {_count(_get(s, 'num_host_reloads'))} {s.get('host_reload')} reloads: link / "
            f"{'added to steps' if wait == 'host_reload_step_s' else 'waited'} (s)",
            _joined(s, ("host_reload_s", wait), _fixed(2)),
        ),
    ]


def _preemption_rows(s: Summary) -> list[tuple[str, str]]:
    rows = []
    if (num := _get(s, "num_preemptions")) is not None:
        kinds = (
            ("num_recompute_preemptions", "recompute"),
            ("num_swap_preemptions", "swap"),
            ("num_swap_fallbacks", "swap fallbacks"),
        )
        by = [f"{_count(_get(s, key))} {name}" for key, name in kinds if _get(s, key)]
        rows.append(("preemptions", _count(num) + (f" ({', '.join(by)})" if by else "")))
    if _get(s, "recompute_tax"):
        rows.append(("recompute tax (% of tokens computed)", _pct(_get(s, "recompute_tax"))))
    if _get(s, "preemption_cost_s"):
        rows.append(("preemption cost: swaps + recompute (s)", _fixed(2)(_get(s, "preemption_cost_s"))))
    if _get(s, "swap_out_bytes"):
        rows.append(
            ("swapped out / host pool peak", _joined(s, ("swap_out_bytes", "swap_pool_peak_bytes"), format_bytes))
        )
    if _get(s, "num_copies"):
        rows.append(
            ("copy-on-write / fork copies", f"{_count(_get(s, 'num_copies'))} ({format_bytes(_get(s, 'copy_bytes'))})")
        )
    return rows


def _sharing_rows(s: Summary) -> list[tuple[str, str]]:
    """What sharing blocks saved (a fan-out's prompt, prefix-cache hits); none when nothing was shared."""
    if not _get(s, "peak_shared_blocks"):
        return []
    held, unshared, saving = (_get(s, k) for k in ("peak_allocated_bytes", "peak_unshared_bytes", "sharing_saving"))
    said = "n/a" if saving is None else f"{saving:,.2f}x less"
    return [
        ("blocks shared by 2+ sequences (peak)", _count(_get(s, "peak_shared_blocks"))),
        ("KV held / without sharing (peak)", f"{format_bytes(held)} / {format_bytes(unshared)} ({said})"),
    ]
