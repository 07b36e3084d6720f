"""A disaggregated run end to end (``deployment=disagg``): the lecture's workload on 1P1D against
bounds computed by hand from the lecture's constants, the summary's own arithmetic (the TTFT's four
parts, goodput per GPU), each role's layout, and the command's report, files and sweeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kvbench_cli import kvbench

from kvbench.api import build, compose, run

#: the lecture's workload (conf/workload/lecture_chat.yaml): 1,000 requests at once, 512 + 128 tokens
NUM_REQUESTS, PROMPT, OUTPUT = 1000, 512, 128
#: kernel=torch: the lecture's roofline, whose constants the bounds below are computed from (the
#: default kernel, triton, is priced on H100 by the transfer's measured tables)
ZERO_COST_LINK = (
    "deployment=disagg",
    "deployment.link_bytes_per_s=1e30",
    "deployment.link_latency_s=0",
    "kernel=torch",
)


@pytest.fixture(scope="module")
def lecture_1p1d():
    return run(["progress=false", *ZERO_COST_LINK])


def test_the_lecture_on_1p1d_stays_within_hand_computed_bounds(lecture_1p1d):
    """One H100 computes every prompt, another decodes; the KV moves for free. From the lecture's
    constants (Llama-2-7B: N parameters, L layers of width H*d, W weight bytes; an H100: F FLOP/s at
    the fraction eta on prefill, B bytes/s of HBM):

    - the prefill worker computes 1,000 prompts of 512 tokens, one chunk each at most: its busy
      time lies between 1,000 x 2*N*512 / (F*eta) (the linear part alone) and 1,000 x
      (2*N*512 + 4*L*H*d*512^2) / (F*eta) plus one step overhead per step (each prompt whole);
    - every decode step reads all the weights and at most the whole KV budget: TPOT lies between
      W / B and (W + budget) / B plus one step overhead;
    - the run lasts at least the prefills and the last prompt's 127 further decode steps;
    - every request's TTFT holds its own prefill and one decode step."""
    s = lecture_1p1d.summary
    cfg, _ = compose(list(ZERO_COST_LINK))
    setup = build(cfg)
    m, hw = setup.model, setup.hardware
    n, layers, width = m.num_params, m.num_layers, m.num_heads * m.head_dim
    flops_per_s = hw.dense_flops_per_s * hw.prefill_flops_efficiency
    overhead_s = setup.cost.step_overhead_s
    linear_s = 2 * n * PROMPT / flops_per_s
    whole_s = (2 * n * PROMPT + 4 * layers * width * PROMPT**2) / flops_per_s
    weights_s = m.weight_bytes / hw.hbm_bandwidth_bytes_per_s
    budget_s = setup.budget_bytes / hw.hbm_bandwidth_bytes_per_s

    assert s["num_finished"] == NUM_REQUESTS and s["num_output_tokens"] == NUM_REQUESTS * OUTPUT
    steps = lecture_1p1d.steps
    prefill = steps[steps["worker"] == "prefill0"]
    busy_s = prefill["duration_s"].sum()
    assert NUM_REQUESTS * linear_s <= busy_s <= NUM_REQUESTS * whole_s + prefill["num_steps"].sum() * overhead_s
    assert weights_s <= s["tpot_p50_s"] <= s["tpot_p99_s"] <= weights_s + budget_s + overhead_s
    assert s["duration_s"] >= NUM_REQUESTS * linear_s + (OUTPUT - 1) * weights_s
    r = lecture_1p1d.requests
    assert ((r["first_token_s"] - r["arrival_s"]) >= linear_s + weights_s).all()
    # a free link: the KV lands the moment it leaves, and nothing is ever on the wire for long
    assert np.allclose(r["transfer_end_s"], r["transfer_start_s"], rtol=0, atol=1e-15)
    assert s["kv_in_flight_mean_bytes"] < 1e-6


def test_the_summary_adds_up(lecture_1p1d):
    s, r = lecture_1p1d.summary, lecture_1p1d.requests
    parts = ("ttft_prefill_queue_mean_s", "ttft_prefill_mean_s", "ttft_transfer_mean_s", "ttft_first_decode_mean_s")
    assert math.isclose(sum(s[p] for p in parts), s["ttft_mean_s"], rel_tol=1e-9)
    assert s["num_gpus"] == 2 and s["prefill_engines"] == s["decode_engines"] == 1
    assert math.isclose(s["goodput_requests_per_s_per_gpu"], s["goodput_requests_per_s"] / 2, rel_tol=1e-12)
    assert (r["num_generated"] == OUTPUT).all() and sorted(r["request_id"]) == list(range(NUM_REQUESTS))
    for name in ("prefill0", "decode0"):
        assert 0 < s[f"{name}_busy_fraction"] <= 1 and s[f"{name}_peak_allocated_bytes"] > 0
    # the decode side holds every request's whole KV, the prefill side only what it computes and holds
    assert s["decode0_mean_concurrency"] > s["prefill0_mean_concurrency"]


def test_each_role_runs_its_own_layout():
    result = run(
        [
            "model=llama3.1-8b",
            "workload=closed_loop",
            "workload.num_requests=8",
            "deployment=disagg",
            "deployment.prefill_workers=2",
            "deployment.decode.tp=2",
            "router=least_loaded",
            "progress=false",
        ]
    )
    s = result.summary
    assert (s["prefill_engines"], s["decode_engines"], s["prefill_gpus_per_engine"], s["decode_gpus_per_engine"]) == (
        2,
        1,
        1,
        2,
    )
    assert s["num_gpus"] == 4
    assert set(result.requests["prefill_worker"]) == {0, 1}


def test_the_command_prints_per_worker_memory_and_the_ttft_split_and_writes_its_figure(tmp_path):
    proc = kvbench(
        "deployment=disagg",
        "deployment.decode_workers=2",
        "workload.num_requests=40",
        "progress=false",
        "hydra.run.dir=out",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    for words in ("TTFT mean = prefill queue + prefill + KV", "prefill0:", "decode1:", "1P2D, 3 GPUs"):
        assert words in proc.stdout, words
    for name in ("deployment.png", "requests.parquet", "steps.parquet", "summary.json", "COMPLETE"):
        assert (tmp_path / "out" / name).is_file(), name
    assert not (tmp_path / "out" / "memory.png").exists()


def test_a_sweep_over_layouts_runs_like_any_other(tmp_path):
    proc = kvbench(
        "-m",
        "deployment=disagg",
        "deployment.prefill_workers=1,2",
        "workload.num_requests=20",
        "progress=false",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "swept: deployment.prefill_workers" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir() and p.name.isdigit()) == ["0", "1"]


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["deployment.decode_workers=0"], "decode worker"),
        (["deployment.link_bytes_per_s=0"], "zero bandwidth"),
        (["mode=real"], "mode=sim only"),
    ],
)
def test_bad_deployments_are_one_line(tmp_path, overrides, words):
    proc = kvbench("deployment=disagg", *overrides, "workload.num_requests=4", "progress=false", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
