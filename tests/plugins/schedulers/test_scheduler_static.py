"""``static``: request-level batching; a batch runs until its longest member finishes."""

from __future__ import annotations

import pytest
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.preemption.swap import SwapPolicy
from kvbench_plugins.schedulers.mixed import MixedScheduler
from kvbench_plugins.schedulers.static import StaticScheduler
from toy import TOY_KV_BYTES, decode_s, naive, paged, prefill_s, request

from kvbench.core.request import Request

REQUESTS = [request(0, 4, 2), request(1, 4, 4), request(2, 4, 1)]


def test_a_batch_holds_its_memory_and_returns_together(toy_run):
    # two S_max slots: A and B form batch 1; A finishes at step 1 but keeps its slot, so C waits
    # for the batch to end at step 3 (B's last token), and both A and B are returned then
    run = toy_run(StaticScheduler, RecomputePolicy, naive(32, 16), REQUESTS)
    plans = run.plans
    assert [len(p.prefills) for p in plans] == [2, 0, 0, 0, 1]
    assert [len(p.decodes) for p in plans] == [0, 2, 1, 1, 0]
    batch_end = 2 * prefill_s(4) + decode_s(5 + 5) + decode_s(6) + decode_s(7)
    assert run.request(0)["finish_s"] == run.request(1)["finish_s"] == pytest.approx(batch_end)
    assert run.request(2)["admitted_s"] == pytest.approx(batch_end)
    # steps 2 and 3 are one row (B decodes alone) in which A's finished cache (5 slots) is still held
    row = run.row(2)
    assert row["num_steps"] == 2 and row["token_bytes_max"] == (5 + 7) * 16
    assert (5 + 6) * 16 < row["token_bytes"] < (5 + 7) * 16


def test_iteration_level_batching_admits_into_the_freed_slot_at_once(toy_run):
    run = toy_run(MixedScheduler, RecomputePolicy, naive(32, 16), REQUESTS)
    assert run.request(2)["admitted_s"] == pytest.approx(2 * prefill_s(4) + decode_s(5 + 5))
    assert run.request(0)["finish_s"] < run.request(1)["finish_s"]


@pytest.mark.parametrize("policy", [SwapPolicy, RecomputePolicy])
def test_a_preempted_fan_out_gives_back_its_finished_branch_s_memory(toy_run, policy):
    """Request-level batching keeps a finished branch's memory for its batch. A fan-out preempted
    after one branch finished leaves the batch: the finished branch's blocks (its prompt block is
    shared with the running branch) go too, or a swap would leave a block shared with a sequence
    outside the family it moves (a RuntimeError before this was fixed)."""
    # 10 blocks of 8 tokens. B (prompt 40, output 20) and A (prompt 8, branches of 2, 2 and 20
    # tokens) fill them at step 1; A's two short branches finish at step 2 and keep their blocks,
    # the prompt block among them; B's 7th block (step 9) preempts the newest request, A
    b = Request(0, 0.0, 40, 60, (20,))
    a = Request(1, 0.0, 8, 28, (2, 2, 20))
    run = toy_run(StaticScheduler, policy, paged(80), [b, a], max_num_seqs=8)
    assert sum(len(p.preemptions) for p in run.plans) >= 1, "the case must preempt A"
    assert run.request(1)["num_generated"] == 24 and run.request(0)["num_generated"] == 20
    assert run.engine.scheduler.allocator.ledger().free_bytes == 80 * TOY_KV_BYTES  # every block given back
