"""``swap``: the victim's KV goes to host memory and back, priced per byte and per copy."""

from __future__ import annotations

import pytest
from kvbench_plugins.preemption.swap import SwapPolicy
from kvbench_plugins.schedulers.mixed import MixedScheduler
from toy import decode_s, paged, request, swap_s

# A: 8 + 4 tokens, B: 8 + 12, three blocks of 8 (as in the mixed scheduler's recompute scenario).
# A watermark of 0.3 x 384 = 115 bytes (under one 128-byte block) lets B be admitted next to A but
# keeps it from swapping back in while A runs (it would need a block to be left free).
REQUESTS = [request(0, 8, 4), request(1, 8, 12)]


def test_a_swapped_request_comes_back_with_its_cache_and_recomputes_nothing(toy_run):
    run = toy_run(MixedScheduler, SwapPolicy, paged(24), REQUESTS, watermark_fraction=0.3)
    plans = run.plans
    [(victim, kv_tokens, mechanism, fell_back, swap_out_bytes)] = plans[1].preemptions
    assert (victim.request_id, kv_tokens, mechanism, fell_back, swap_out_bytes) == (1, 8, "swap", False, 128)
    # step 1: B's one block goes out (8 x 16 bytes, one copy) while A decodes
    assert run.row(1)["duration_s"] == pytest.approx(swap_s(128, 1) + decode_s(9))
    assert run.row(1)["swap_out_bytes"] == 128 and run.row(1)["num_swapped"] == 1
    # A finishes at step 3; step 4 brings B back (nothing runs, so no headroom is kept)
    assert [len(p.swap_in) for p in plans[:5]] == [0, 0, 0, 0, 1] and not plans[4].decodes
    assert run.row(4)["duration_s"] == swap_s(128, 1)
    # from step 5 B decodes again: its 9th token needs a new block
    assert plans[5].decodes[0].group.request_id == 1 and plans[5].kv_read_tokens == 9
    b = run.request(1)
    assert (b["num_swap_preemptions"], b["swap_out_bytes"], b["swap_in_bytes"], b["num_recomputed_tokens"]) == (
        1,
        128,
        128,
        0,
    )
    assert run.record.steps["recompute_s"].sum() == 0.0
    assert run.engine.scheduler.host_pool.peak_bytes == 128


def test_a_full_host_pool_falls_back_to_recompute_and_says_so(toy_run):
    run = toy_run(MixedScheduler, SwapPolicy, paged(24), REQUESTS, host_swap_bytes=127)
    [(victim, kv_tokens, mechanism, fell_back, swap_out_bytes)] = run.plans[1].preemptions
    assert (mechanism, fell_back, swap_out_bytes) == ("recompute", True, 0)
    b = run.request(1)
    assert (b["num_swap_fallbacks"], b["num_recompute_preemptions"], b["num_swap_preemptions"]) == (1, 1, 0)
    assert run.row(1)["num_swap_fallbacks"] == 1 and run.row(1)["swap_s"] == 0.0
    assert b["num_generated"] == 12


def test_swap_time_grows_with_the_number_of_blocks_moved(toy_run):
    # the same 24-token victim moved as three 8-token blocks or one 32-token block: same bytes
    # of tokens, but per-copy overheads (0.5 s each) and whole-block bytes differ
    small = toy_run(MixedScheduler, SwapPolicy, paged(48, 8), [request(0, 24, 9), request(1, 24, 9)])
    large = toy_run(MixedScheduler, SwapPolicy, paged(64, 32), [request(0, 32, 33), request(1, 32, 33)])
    small_out = [t for p in small.plans for t in p.swap_out]
    large_out = [t for p in large.plans for t in p.swap_out]
    assert small_out and large_out
    assert small_out[0].num_runs == small_out[0].num_bytes // (8 * 16)
    assert large_out[0].num_runs == large_out[0].num_bytes // (32 * 16)
