"""A run's one JSON file, ``summary.json``: every summary number, named as kvbench names them and,
where the two overlap, as ``vllm bench serve`` names them in its result JSON.

The file is one flat object, so that a script written for vLLM's result files reads kvbench's
unchanged (``data["median_ttft_ms"]``):

- every key of the summary row, as in ``summary.parquet`` (seconds, fractions, bytes);
- ``kvbench_version`` and ``kvbench_commit`` (:mod:`kvbench.output.provenance`), unless the summary
  row already records them;
- vLLM's keys, at the top level beside them (no kvbench key has one of these names: kvbench's
  carry their unit, ``duration_s``): ``date``, ``backend`` (``"kvbench"``), ``model_id``,
  ``num_prompts``, ``duration``, ``completed``, ``failed``, ``total_input_tokens``,
  ``total_output_tokens``, ``request_throughput``, ``request_goodput`` (None when no SLO was given,
  as in vLLM), ``output_throughput``, ``total_token_throughput``, and for ``ttft``, ``tpot`` and
  ``e2el`` each: ``mean_<m>_ms``, ``median_<m>_ms``, ``std_<m>_ms`` and ``p<N>_<m>_ms`` for each
  percentile kvbench computes (50, 90, 99). vLLM's ``itl`` (inter-token latency) has no kvbench
  counterpart: a simulated step emits one token per sequence, so it is left out.

The definitions are vLLM's (``vllm/benchmarks/serve.py``, ``calculate_metrics`` and
``process_one_metric``), which are kvbench's too (:func:`kvbench.metrics.summary.summarize`):
``completed`` counts finished requests; TTFT, e2e latency and TPOT are over completed requests, TPOT
= (e2e - TTFT) / (output tokens - 1) over requests with more than one output token (vLLM regards a
one-token request's TPOT as 0 for goodput only, as kvbench does); ``median`` is numpy's median
(kvbench's p50: linear interpolation), ``std`` numpy's population standard deviation (ddof 0); the
throughputs divide by ``duration``, kvbench's ``duration_s`` (first arrival to last finish: the
simulated benchmark's length); ``request_goodput`` counts completed requests meeting every SLO given.
Where the summary holds a value (means, percentiles) it is taken from there; the rest (``std``, token
totals) is computed from the requests table with the same definitions. Differences, stated: vLLM
writes 0 for a statistic over no requests, kvbench ``null`` (no value); every NaN is written as
``null`` so the file is strict JSON.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from kvbench.io.table import ColumnTable, as_table
from kvbench.metrics.catalogue import metric
from kvbench.metrics.summary import PERCENTILES

if TYPE_CHECKING:
    import pandas as pd

#: (vLLM's metric name, kvbench's summary prefix)
LATENCY_METRICS = (("ttft", "ttft"), ("tpot", "tpot"), ("e2el", "e2e"))


def _plain(value: Any) -> Any:
    """A JSON value: numpy scalars as Python numbers, NaN (no value) as None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _finished(requests: ColumnTable | pd.DataFrame) -> ColumnTable:
    table = as_table(requests)
    finished = np.asarray(table["finish_s"]) >= 0 if "finish_s" in table else np.zeros(len(table), dtype=bool)
    return table[finished]


def request_latencies_s(requests: ColumnTable | pd.DataFrame) -> dict[str, np.ndarray]:
    """Per finished request, in seconds: ``ttft``, ``e2e`` and (requests with more than one output
    token on their longest branch) ``tpot``, as :func:`kvbench.metrics.summary.summarize` defines
    them. Metrics whose columns the table lacks are absent."""
    done = _finished(requests)
    out: dict[str, np.ndarray] = {}
    if not {"arrival_s", "finish_s"} <= set(done):
        return out
    arrival_s = np.asarray(done["arrival_s"], dtype=float)
    out["e2e"] = np.asarray(done["finish_s"], dtype=float) - arrival_s
    if "first_token_s" in done:
        out["ttft"] = np.asarray(done["first_token_s"], dtype=float) - arrival_s
        column = "max_branch_output_tokens" if "max_branch_output_tokens" in done else "output_tokens"
        if column in done:
            tokens = np.asarray(done[column], dtype=np.int64)
            has_tpot = tokens > 1
            out["tpot"] = (out["e2e"] - out["ttft"])[has_tpot] / (tokens[has_tpot] - 1)
    return out


def vllm_bench_serve_fields(
    summary: dict[str, Any], requests: ColumnTable | pd.DataFrame, *, slo_given: bool
) -> dict[str, Any]:
    """The run under ``vllm bench serve``'s result-JSON names (see the module's docstring)."""
    duration_s = summary.get("duration_s")
    rate = lambda count: count / duration_s if duration_s and duration_s > 0 else math.nan
    out: dict[str, Any] = {}
    for key in (
        "num_requests",
        "duration_s",
        "num_finished",
        "throughput_requests_per_s",
    ):  # the same number, vLLM's name
        if key in summary:
            out[metric(key).vllm] = summary[key]
    if "num_finished" in summary:
        if "num_requests" in summary:
            out["failed"] = summary["num_requests"] - summary["num_finished"]  # never finished
    done = _finished(requests)
    input_tokens = int(np.asarray(done["prompt_tokens"]).sum()) if "prompt_tokens" in done else None
    output_tokens = summary.get("num_output_tokens")
    if output_tokens is None and "output_tokens" in done:
        output_tokens = int(np.asarray(done["output_tokens"]).sum())
    if input_tokens is not None:
        out["total_input_tokens"] = input_tokens
    if output_tokens is not None:
        out["total_output_tokens"] = output_tokens
    out[metric("goodput_requests_per_s").vllm] = summary.get("goodput_requests_per_s") if slo_given else None
    if output_tokens is not None:
        out[metric("throughput_tokens_per_s").vllm] = summary.get("throughput_tokens_per_s", rate(output_tokens))
        if input_tokens is not None:
            out["total_token_throughput"] = rate(input_tokens + output_tokens)
    latencies = request_latencies_s(requests)
    for name, prefix in LATENCY_METRICS:
        values = latencies.get(prefix)
        stats = {
            "mean": summary.get(f"{prefix}_mean_s", None if values is None else _mean(values)),
            "median": summary.get(f"{prefix}_p50_s", None if values is None else _percentile(values, 50)),
            "std": None if values is None else (float(np.std(values)) if len(values) else math.nan),
        }
        stats.update(
            {
                f"p{p}": summary.get(f"{prefix}_p{p}_s", None if values is None else _percentile(values, p))
                for p in PERCENTILES
            }
        )
        out.update({f"{stat}_{name}_ms": value * 1e3 for stat, value in stats.items() if value is not None})
    return out


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else math.nan


def _percentile(values: np.ndarray, p: int) -> float:
    return float(np.percentile(values, p)) if len(values) else math.nan


def run_json(summary: dict[str, Any], requests: ColumnTable | pd.DataFrame, config: dict[str, Any]) -> dict[str, Any]:
    """The contents of a run's ``summary.json`` (see the module's docstring)."""
    from kvbench.output.provenance import provenance

    slo = config.get("slo") or {}
    slo_given = any(value is not None for value in slo.values())
    record: dict[str, Any] = dict(summary)
    for key, value in provenance().items():
        record.setdefault(key, value)  # the summary row's own record wins: it was taken at run time
    record.update(
        {
            "date": datetime.now().strftime("%Y%m%d-%H%M%S"),  # vLLM's format
            "backend": "kvbench",
            "model_id": summary.get("model"),
        }
    )
    record.update(vllm_bench_serve_fields(summary, requests, slo_given=slo_given))
    return {key: _plain(value) for key, value in record.items()}
