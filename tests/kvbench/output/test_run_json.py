"""``summary.json``: one JSON per run beside the Parquet tables, with ``vllm bench serve``'s names."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from kvbench.api import run
from kvbench.output.results import RESULT_FILES, SUMMARY_JSON, write_run
from kvbench.output.run_json import run_json


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A small run with one-token requests among others, an SLO, and a budget that preempts."""
    result = run(
        [
            "workload.num_requests=60",
            "workload.lengths=lognormal",
            "workload.output_tokens=8",
            "hardware.kv_budget_bytes=5e9",
            "slo.ttft_s=2",
            "wandb.mode=disabled",
        ]
    )
    out_dir = write_run(result, tmp_path_factory.mktemp("run"), figures=False)
    return result, json.loads((out_dir / SUMMARY_JSON).read_text()), out_dir


def test_it_is_written_atomically_with_the_run_and_vouched_for(written):
    _, _, out_dir = written
    assert SUMMARY_JSON in RESULT_FILES
    assert SUMMARY_JSON in json.loads((out_dir / "COMPLETE").read_text())["files"]


def test_it_holds_every_summary_key_as_it_is_and_the_provenance(written):
    result, data, _ = written
    for key, value in result.summary.items():
        assert data[key] == (None if isinstance(value, float) and math.isnan(value) else value), key
    assert data["kvbench_version"] and "kvbench_commit" in data


def test_vllm_names_carry_the_summary_numbers_in_vllm_units(written):
    result, data, _ = written
    s = result.summary
    assert data["duration"] == s["duration_s"]
    assert data["completed"] == s["num_finished"] and data["num_prompts"] == s["num_requests"]
    assert data["request_throughput"] == s["throughput_requests_per_s"]
    assert data["output_throughput"] == s["throughput_tokens_per_s"]
    assert data["request_goodput"] == s["goodput_requests_per_s"]  # an SLO was given
    for vllm, ours in (("ttft", "ttft"), ("tpot", "tpot"), ("e2el", "e2e")):
        assert data[f"median_{vllm}_ms"] == pytest.approx(s[f"{ours}_p50_s"] * 1e3)
        assert data[f"mean_{vllm}_ms"] == pytest.approx(s[f"{ours}_mean_s"] * 1e3)
        for p in (50, 90, 99):
            assert data[f"p{p}_{vllm}_ms"] == pytest.approx(s[f"{ours}_p{p}_s"] * 1e3)


def test_what_the_summary_lacks_comes_from_the_requests_by_its_definitions(written):
    result, data, _ = written
    requests = result.requests
    done = requests[requests["finish_s"] >= 0]
    ttft_s = done["first_token_s"] - done["arrival_s"]
    e2e_s = done["finish_s"] - done["arrival_s"]
    longest = done["max_branch_output_tokens"]
    assert (longest == 1).any() and (longest > 1).any()  # the TPOT rule is exercised
    tpot_s = ((e2e_s - ttft_s) / (longest - 1))[longest > 1]
    assert data["mean_tpot_ms"] == pytest.approx(tpot_s.mean() * 1e3)
    assert data["std_tpot_ms"] == pytest.approx(np.std(tpot_s.to_numpy()) * 1e3)  # numpy's, ddof 0, as vLLM
    assert data["std_ttft_ms"] == pytest.approx(np.std(ttft_s.to_numpy()) * 1e3)
    assert data["std_e2el_ms"] == pytest.approx(np.std(e2e_s.to_numpy()) * 1e3)
    assert data["total_input_tokens"] == done["prompt_tokens"].sum()
    assert data["total_output_tokens"] == done["output_tokens"].sum()
    assert data["total_token_throughput"] == pytest.approx(
        (data["total_input_tokens"] + data["total_output_tokens"]) / data["duration"]
    )


def test_no_slo_means_no_goodput_as_in_vllm_and_nan_is_null():
    summary = {
        "num_requests": 2,
        "num_finished": 0,
        "duration_s": math.nan,
        "goodput_requests_per_s": math.nan,
        "ttft_p50_s": math.nan,
        "kvbench_version": "9.9",
        "kvbench_commit": None,
    }
    requests = pd.DataFrame(
        {
            "arrival_s": [0.0, 1.0],
            "first_token_s": [-1.0, -1.0],
            "finish_s": [-1.0, -1.0],
            "max_branch_output_tokens": [4, 4],
            "prompt_tokens": [8, 8],
            "output_tokens": [0, 0],
        }
    )
    data = run_json(summary, requests, {"slo": {"ttft_s": None, "tpot_s": None, "e2e_s": None}})
    assert data["request_goodput"] is None and data["failed"] == 2
    assert data["median_ttft_ms"] is None and data["duration"] is None
    assert data["kvbench_version"] == "9.9" and data["kvbench_commit"] is None  # the row's own record wins
    json.loads(json.dumps(data, allow_nan=False))  # strict JSON


def test_a_summary_without_request_columns_still_writes(tmp_path):
    from kvbench.output.results import RunResult

    result = RunResult(
        config={},
        summary={"peak_concurrency": 3},
        requests=pd.DataFrame({"request_id": [0]}),
        steps=pd.DataFrame(),
        refusals=pd.DataFrame(),
    )
    write_run(result, tmp_path, figures=False)
    data = json.loads((tmp_path / SUMMARY_JSON).read_text())
    assert data["peak_concurrency"] == 3 and data["request_goodput"] is None and "std_ttft_ms" not in data
