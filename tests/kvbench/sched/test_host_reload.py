"""Reloads from the host tier through the scheduler and the engine, priced by hand on the toy
machine (tests/support/toy.py: 8-token blocks of 128 bytes; the host link moves 160 bytes/s and
costs 0.5 s per copy, so reloading two blocks takes 256 / 160 + 0.5 = 2.1 s)."""

from __future__ import annotations

import pandas as pd
import pytest
from kvbench_plugins.allocators.paged import PagedAllocator, PagedConfig
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.schedulers.chunked import ChunkedScheduler
from kvbench_plugins.schedulers.mixed import MixedScheduler
from kvbench_plugins.schedulers.prefill_first import PrefillFirstScheduler
from kvbench_plugins.schedulers.static import StaticScheduler
from toy import TOY_KV_BYTES, decode_s, prefill_s

from kvbench.core.kv import Transfer
from kvbench.core.request import Request

B = 8
BLOCK_BYTES = B * TOY_KV_BYTES
TWO_BLOCKS_S = 2 * BLOCK_BYTES / 160 + 0.5  # 2.1 s


def cached_paged(budget_blocks: int, host_blocks: int, mode: str) -> PagedAllocator:
    config = PagedConfig(B, prefix_caching=True, host_cache_bytes=host_blocks * BLOCK_BYTES, host_reload=mode)
    return PagedAllocator(config, budget_bytes=budget_blocks * BLOCK_BYTES, kv_bytes_per_token=TOY_KV_BYTES)


def hashed(request_id: int, arrival_s: float, prompt: int, output: int, hashes: tuple[int, ...]) -> Request:
    return Request(request_id, arrival_s, prompt, prompt + output, (output,), prefix_hashes=hashes, hash_block_tokens=B)


#: request 0 computes prefix A (two full blocks); request 1's 32 tokens fill the 4-block budget and
#: evict A to host; request 2 shares A: both blocks come back from host memory
THREE = [
    hashed(0, 0.0, 17, 1, (1, 2, 30)),
    hashed(1, 20.0, 32, 1, (11, 12, 13, 14)),
    hashed(2, 60.0, 17, 1, (1, 2, 32)),
]


@pytest.mark.parametrize("mode", ["blocking", "overlapped"])
def test_three_requests_reload_the_evicted_prefix_once(toy_run, mode):
    run = toy_run(MixedScheduler, RecomputePolicy, cached_paged(4, 4, mode), THREE)
    r = run.record.requests.set_index("request_id")
    assert r.loc[2, "cached_prompt_tokens"] == 2 * B  # both prefix blocks are hits, served from host
    reloads = run.engine.scheduler.host_reloads
    assert (reloads.num_reloads, reloads.reload_bytes, reloads.host_hit_tokens) == (1, 2 * BLOCK_BYTES, 2 * B)
    assert reloads.reload_s == pytest.approx(TWO_BLOCKS_S)
    host = run.engine.scheduler.allocator.host_cache
    # offloaded: A's two blocks (request 1), then three of request 1's (two for the reload, one for
    # request 2's own third block)
    assert (host.num_offloaded_blocks, host.num_reloaded_blocks, host.num_evicted_blocks) == (5, 2, 0)
    # nothing else runs: either way request 2's first token comes 2.1 s (the copy) + its 1-token
    # prefill over 16 cached tokens after it arrives
    ttft_s = r.loc[2, "first_token_s"] - r.loc[2, "arrival_s"]
    assert ttft_s == pytest.approx(TWO_BLOCKS_S + prefill_s(1, 16))
    last = run.plans[-1]
    if mode == "blocking":
        assert last.host_reloads == [Transfer(2 * BLOCK_BYTES, 1)]
        assert r.loc[2, "admitted_s"] == pytest.approx(60.0)  # admitted in the step that pays for the copy
        assert reloads.blocking_step_s == pytest.approx(TWO_BLOCKS_S) and reloads.reload_wait_s == 0
    else:
        assert last.host_reloads == []
        assert r.loc[2, "admitted_s"] == pytest.approx(60.0 + TWO_BLOCKS_S)  # the GPU idled until the copy landed
        assert reloads.reload_wait_s == pytest.approx(TWO_BLOCKS_S) and reloads.blocking_step_s == 0
        assert last.start_s == pytest.approx(60.0 + TWO_BLOCKS_S)


def test_without_a_host_tier_the_evicted_prefix_is_computed_again(toy_run):
    alloc = PagedAllocator(
        PagedConfig(B, prefix_caching=True), budget_bytes=4 * BLOCK_BYTES, kv_bytes_per_token=TOY_KV_BYTES
    )
    run = toy_run(MixedScheduler, RecomputePolicy, alloc, THREE)
    assert run.engine.scheduler.host_reloads is None
    r = run.record.requests.set_index("request_id")
    assert r.loc[2, "cached_prompt_tokens"] == 0
    assert r.loc[2, "first_token_s"] - r.loc[2, "arrival_s"] == pytest.approx(prefill_s(17))


#: the same, with a request decoding while request 2's blocks come back: its 8-block budget holds
#: everyone; request 1's 56 tokens evict A1, request 3's first block A0, so both are on host
WITH_DECODER = [
    hashed(0, 0.0, 17, 1, (1, 2, 30)),
    hashed(1, 20.0, 56, 1, (11, 12, 13, 14, 15, 16, 17)),
    Request(3, 100.0, 8, 40, (30,)),
    hashed(2, 106.0, 17, 1, (1, 2, 32)),
]


def test_blocking_stalls_the_batch_and_overlapped_does_not(toy_run):
    runs = {mode: toy_run(MixedScheduler, RecomputePolicy, cached_paged(8, 8, mode), WITH_DECODER) for mode in
            ("blocking", "overlapped")}  # fmt: skip
    tables = {mode: run.record.requests.set_index("request_id") for mode, run in runs.items()}
    for run in runs.values():
        assert run.engine.scheduler.host_reloads.host_hit_tokens == 2 * B
    # blocking: the step that admits request 2 pays the copy, its prefill and request 3's decode
    blocking = runs["blocking"]
    (step,) = [p for p in blocking.plans if p.host_reloads]
    start_s = step.start_s
    assert tables["blocking"].loc[2, "admitted_s"] == start_s
    row = blocking.row(step.step)
    assert row["duration_s"] == pytest.approx(TWO_BLOCKS_S + prefill_s(1, 16) + decode_s(step.kv_read_tokens))
    # overlapped: the copy starts at the same boundary; request 3 decodes meanwhile, each step
    # priced as its decode alone, and request 2 is admitted at the first boundary after 2.1 s
    overlapped = runs["overlapped"]
    admitted_s = tables["overlapped"].loc[2, "admitted_s"]
    starts_s = [p.start_s for p in overlapped.plans]
    first, admitting = starts_s.index(start_s), starts_s.index(admitted_s)
    waiting = overlapped.plans[first:admitting]
    assert len(waiting) >= 2 and all(not p.prefills and len(p.decodes) == 1 for p in waiting)
    for plan, end_s in zip(waiting, starts_s[first + 1 : admitting + 1]):
        assert end_s - plan.start_s == pytest.approx(decode_s(plan.kv_read_tokens))
    assert admitted_s >= start_s + TWO_BLOCKS_S > waiting[-1].start_s
    assert overlapped.engine.scheduler.host_reloads.reload_wait_s == pytest.approx(admitted_s - start_s)
    # the decoder pays for the blocking copy: it finishes exactly 2.1 s later
    finish = {mode: table.loc[3, "finish_s"] for mode, table in tables.items()}
    assert finish["blocking"] - finish["overlapped"] == pytest.approx(TWO_BLOCKS_S)


@pytest.mark.parametrize("mode", ["blocking", "overlapped"])
@pytest.mark.parametrize("scheduler", [MixedScheduler, ChunkedScheduler, PrefillFirstScheduler, StaticScheduler])
def test_both_loops_write_the_same_tables_with_reloads(toy_run, mode, scheduler):
    def tables(event_driven: bool):
        run = toy_run(scheduler, RecomputePolicy, cached_paged(8, 8, mode), WITH_DECODER, event_driven=event_driven)
        assert run.engine.scheduler.host_reloads.num_reloads == 1
        return run.record

    event, step = tables(True), tables(False)
    for name in ("requests", "steps", "refusals"):
        pd.testing.assert_frame_equal(getattr(event, name), getattr(step, name), check_exact=True)


# --- whole runs -------------------------------------------------------------------------------

FAST = ["wandb.mode=disabled", "progress=false", "kernel=torch", "output.write=false"]
#: the Mooncake trace's first 80 requests in a 20 GB budget: evictions, reloads and preemptions
MOONCAKE = [
    "workload=mooncake_conversation",
    "model=llama2-7b-32k",
    "workload.num_requests=80",
    "hardware.kv_budget_bytes=20e9",
    "allocator.prefix_caching=true",
    "allocator.host_cache_bytes=80e9",
]


@pytest.mark.parametrize(
    "overrides",
    [
        ["scheduler=chunked", "allocator.host_reload=overlapped"],
        ["scheduler=mixed", "allocator.host_reload=blocking", "preemption=swap"],
    ],
)
def test_both_loops_agree_on_a_trace_with_the_host_tier(overrides):
    from kvbench.api import run

    event = run([*FAST, *MOONCAKE, *overrides, "event_driven=true"])
    step = run([*FAST, *MOONCAKE, *overrides, "event_driven=false"])
    for name in ("requests", "steps", "refusals"):
        pd.testing.assert_frame_equal(getattr(event, name), getattr(step, name), check_exact=True)
    s = event.summary
    assert s["num_host_reloads"] > 0 and s["num_preemptions"] > 0
    assert (event.requests["num_generated"] == event.requests["output_tokens"]).all()  # nobody lost
    assert s["prefix_hit_rate_gpu"] + s["prefix_hit_rate_host"] == pytest.approx(s["prefix_hit_rate"])
    assert s["host_reload_bytes"] > 0 and s["host_offload_bytes"] >= s["host_reload_bytes"]
    assert s["prefix_hit_rate_belady_with_host"] >= s["prefix_hit_rate_belady"]


def test_a_host_tier_that_is_never_needed_changes_no_table_and_off_adds_no_key():
    from kvbench.api import run

    shared = [*FAST, "workload.num_requests=60", "workload.shared_prefix_tokens=256", "allocator.prefix_caching=true"]
    plain, explicit_off = run(shared), run([*shared, "allocator.host_cache_bytes=0"])
    assert not [k for k in plain.summary if "host" in k and k != "swap_pool_peak_bytes"]
    with_host = run([*shared, "allocator.host_cache_bytes=1e9", "allocator.host_reload=blocking"])
    for name in ("requests", "steps", "refusals"):
        pd.testing.assert_frame_equal(getattr(plain, name), getattr(explicit_off, name), check_exact=True)
        pd.testing.assert_frame_equal(getattr(plain, name), getattr(with_host, name), check_exact=True)
    assert with_host.summary["num_host_reloads"] == 0 and with_host.summary["prefix_hit_rate_host"] == 0


@pytest.mark.parametrize("mode", ["blocking", "overlapped"])
def test_a_request_that_overtakes_a_loading_one_releases_its_pin_and_nobody_is_lost(toy_run, mode):
    from kvbench.sched.queue import PriorityQueue

    # request 4 arrives while request 2's blocks are on their way, and goes first (priority -1)
    requests = [*WITH_DECODER, Request(4, 106.5, 8, 20, (4,), priority=-1)]
    runs = [
        toy_run(
            MixedScheduler, RecomputePolicy, cached_paged(8, 8, mode), requests, queue=PriorityQueue(), event_driven=e
        )
        for e in (True, False)
    ]
    for name in ("requests", "steps", "refusals"):
        pd.testing.assert_frame_equal(getattr(runs[0].record, name), getattr(runs[1].record, name), check_exact=True)
    r = runs[1].record.requests.set_index("request_id")
    assert (r["num_generated"] == r["output_tokens"]).all()
    assert r.loc[2, "cached_prompt_tokens"] == 2 * B  # its reloaded blocks stayed cached for it
    alloc = runs[1].engine.scheduler.allocator
    assert all(seq_id >= 0 for seq_id in alloc._tables), "a pin outlived the run"
    if mode == "overlapped":
        assert r.loc[4, "admitted_s"] < r.loc[2, "admitted_s"]
