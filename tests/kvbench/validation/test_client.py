"""The replay's client shape and its per-request step counts: the post-hoc step overhead equals a
replay run with the overhead set (closed loop, first wave at t=0), through chunked prefill and
preemption; a desynchronised first wave is where it stops being exact."""

from __future__ import annotations

import pytest

from kvbench.api import run
from kvbench.errors import ConfigError
from kvbench.validation.client import ClientShape, request_stats
from kvbench.validation.silicon import admitted, read_silicon, replay, select
from kvbench.validation.validate import client_overrides, replay_stats

BASE = [
    "model=llama3.1-8b",
    "hardware=h100-sxm",
    "kernel=vllm_fa3",
    "scheduler=chunked",
    "workload=closed_loop",
    "workload.max_concurrency=16",
    "workload.num_requests=48",
    "workload.prompt_tokens=1024",
    "workload.s_max_tokens=1536",
    "progress=false",
    "output.write=false",
]
H_S = 4e-4


def _stats(overrides, skip=0):
    result = run(overrides)
    return result, request_stats(result.request_columns, result.step_columns, skip)


@pytest.mark.parametrize(
    "extra",
    [
        ["workload.output_tokens=64"],
        # chunked prefill: a prompt takes two steps' budgets
        ["workload.output_tokens=64", "scheduler.max_num_batched_tokens=700", "scheduler.max_num_seqs=16"],
        # the KV budget preempts running requests (recompute, then swap)
        ["workload.output_tokens=512", "hardware.kv_budget_bytes=2500000000"],
        ["workload.output_tokens=512", "hardware.kv_budget_bytes=2500000000", "preemption=swap"],
    ],
)
def test_a_step_overhead_adds_exactly_h_per_counted_step(extra):
    base, s0 = _stats([*BASE, *extra])
    with_h, s1 = _stats([*BASE, *extra, f"engine.step_overhead_s={H_S}"])
    assert with_h.summary["step_overhead_s"] == H_S
    assert s0.ttft_ms == pytest.approx(base.summary["ttft_mean_s"] * 1e3, rel=1e-12)  # the summary's means
    assert s0.tpot_ms == pytest.approx(base.summary["tpot_mean_s"] * 1e3, rel=1e-12)
    assert s0.ttft_steps >= 1 and s0.tpot_steps >= 1
    assert s1.ttft_ms == pytest.approx(s0.ttft_ms + H_S * 1e3 * s0.ttft_steps, rel=1e-9)
    assert s1.tpot_ms == pytest.approx(s0.tpot_ms + H_S * 1e3 * s0.tpot_steps, rel=1e-9)
    assert (s1.ttft_steps, s1.tpot_steps) == (s0.ttft_steps, s0.tpot_steps)  # no event changed step
    if "hardware.kv_budget_bytes=2500000000" in extra:
        assert base.summary["num_preemptions"] > 0 and s0.tpot_steps > 1  # a preempted request waits steps


def test_a_desynchronised_first_wave_is_where_the_formula_is_only_approximate():
    extra = ["workload.output_tokens=64", "workload.first_wave_window_s=0.05"]
    _, s0 = _stats([*BASE, *extra])
    _, s1 = _stats([*BASE, *extra, f"engine.step_overhead_s={H_S}"])
    assert s1.ttft_ms != pytest.approx(s0.ttft_ms + H_S * 1e3 * s0.ttft_steps, rel=1e-3)


def test_a_silicon_row_replayed_with_the_overhead_set_matches_the_formula():
    rows, _ = admitted(read_silicon()[0])
    row = select(rows, ["meta-llama/Llama-3.1-8B-Instruct"], ["h100_sxm"], ["trtllm"], 1, ["agg"], [1]).iloc[0]
    job = replay(row, "profiled", waves=2)
    s0, _ = replay_stats(job.overrides, ClientShape(waves=2))
    s1, _ = replay_stats([*job.overrides, f"engine.step_overhead_s={H_S}"], ClientShape(waves=2))
    assert s1.ttft_ms == pytest.approx(s0.ttft_ms + H_S * 1e3 * s0.ttft_steps, rel=1e-9)
    assert s1.tpot_ms == pytest.approx(s0.tpot_ms + H_S * 1e3 * s0.tpot_steps, rel=1e-9)


def test_warm_up_waves_leave_the_first_requests_out():
    overrides = [*BASE, "workload.output_tokens=64"]
    _, every = _stats(overrides)
    _, later = _stats(overrides, skip=16)
    assert every.counted == 48 and later.counted == 32
    assert later.ttft_ms != pytest.approx(every.ttft_ms)


def test_desync_spreads_the_first_wave_over_the_unloaded_latency():
    overrides = [*BASE, "workload.output_tokens=64"]
    spread = client_overrides(overrides, ClientShape(desync=0.5))
    window = [o for o in spread if o.startswith("workload.first_wave_window_s=")]
    alone = run([*overrides, "workload.max_concurrency=1", "workload.num_requests=1"]).summary["e2e_mean_s"]
    assert len(window) == 1 and float(window[0].split("=")[1]) == pytest.approx(0.5 * alone)
    arrivals = sorted(run(spread).requests.sort_values("request_id")["arrival_s"].head(16))
    assert arrivals[0] == 0 and arrivals[-1] == pytest.approx(15 / 16 * 0.5 * alone)
    assert client_overrides(overrides, ClientShape()) == overrides


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        (ClientShape(waves=0), "--waves 0 is invalid"),
        (ClientShape(waves=2, warmup_waves=2), "--warmup-waves 2 is invalid"),
        (ClientShape(warmup_waves=-1), "--warmup-waves -1 is invalid"),
        (ClientShape(desync=1.5), "--desync 1.5 is invalid"),
        (ClientShape(desync=float("nan")), "--desync nan is invalid"),
    ],
)
def test_a_bad_client_shape_is_one_line(shape, words):
    with pytest.raises(ConfigError, match=words) as info:
        shape.validate()
    assert "\n" not in str(info.value)
