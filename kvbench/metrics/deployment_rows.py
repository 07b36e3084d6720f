"""A disaggregated run's own rows of the one-screen report: the layout, the TTFT's four parts, the
KV in flight, goodput per GPU, and each worker's memory and busy time."""

from __future__ import annotations

import math

from kvbench.metrics.summary import Summary


def _num(s: Summary, key: str) -> float | None:
    value = s.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e3:,.1f}"


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e6:,.1f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}"


def _gb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e9:,.2f}"


def worker_names(s: Summary) -> list[str]:
    """The engines the summary reports, prefill ones first (``prefill0``, ..., ``decode0``, ...)."""
    names = []
    for role in ("prefill", "decode"):
        count = int(s.get(f"{role}_engines", 0) or 0)
        names += [f"{role}{k}" for k in range(count)]
    return names


def deployment_rows(s: Summary) -> list[tuple[str, str]]:
    """The rows a disaggregated run adds (empty for an aggregated one)."""
    if s.get("deployment") != "disagg":
        return []
    layout = (
        f"{s.get('prefill_workers')}P{s.get('decode_workers')}D, {s.get('num_gpus')} GPUs "
        f"(prefill {s.get('prefill_engines')}x{s.get('prefill_gpus_per_engine')}, "
        f"decode {s.get('decode_engines')}x{s.get('decode_gpus_per_engine')})"
    )
    parts = ("ttft_prefill_queue_mean_s", "ttft_prefill_mean_s", "ttft_transfer_mean_s", "ttft_first_decode_mean_s")
    split = " + ".join(_ms(_num(s, key)) for key in parts)
    rows = [
        (
            "TTFT mean = prefill queue + prefill + KV + 1st decode (ms)",
            f"{_ms(_num(s, 'ttft_mean_s'))} = {split}",
        ),
        ("deployment (engines x GPUs each)", layout),
        ("router / KV transfer", f"{s.get('router')} / {s.get('transfer')}"),
        (
            "KV link: per GPU one way (GB/s), latency (us)",
            f"{s.get('link')} {_gb(_num(s, 'link_bytes_per_s'))}, {_us(_num(s, 'link_latency_s'))}",
        ),
        (
            "KV in flight: peak / mean (GB)",
            f"{_gb(_num(s, 'kv_in_flight_peak_bytes'))} / {_gb(_num(s, 'kv_in_flight_mean_bytes'))}",
        ),
        (
            "per GPU: output tok/s, goodput req/s",
            f"{_num(s, 'throughput_tokens_per_s_per_gpu') or 0:,.1f}, "
            f"{_num(s, 'goodput_requests_per_s_per_gpu') or 0:,.3f}",
        ),
    ]
    for name in worker_names(s):
        busy, util = _num(s, f"{name}_busy_fraction"), _num(s, f"{name}_utilization_mean")
        peak, running = _num(s, f"{name}_peak_allocated_bytes"), _num(s, f"{name}_mean_concurrency")
        rows.append(
            (
                f"{name}: busy, KV used (%), peak (GB), seqs",
                f"{_pct(busy)}, {_pct(util)}, {_gb(peak)}, {'n/a' if running is None else f'{running:,.1f}'}",
            )
        )
    return rows
