"""``prefill_first``: a step prefills whenever a waiting prompt fits, and then only prefills."""

from __future__ import annotations

import pytest
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.preemption.swap import SwapPolicy
from kvbench_plugins.schedulers.prefill_first import PrefillFirstScheduler
from toy import decode_s, paged, prefill_s, request, swap_s


def test_an_arrival_pauses_every_decode_for_its_prefill(toy_run):
    # A (8 + 3) decodes; B (8 + 2) arrives at t = 1: step 1 prefills B alone, A waits a step
    run = toy_run(
        PrefillFirstScheduler, RecomputePolicy, paged(64), [request(0, 8, 3), request(1, 8, 2, arrival_s=1.0)]
    )
    plans = run.plans
    assert [(len(p.prefills), len(p.decodes)) for p in plans] == [(1, 0), (1, 0), (0, 2), (0, 1)]
    assert [row["duration_s"] for _, row in run.record.steps.iterrows()] == pytest.approx(
        [prefill_s(8), prefill_s(8), decode_s(9 + 9), decode_s(10)]
    )
    assert run.request(1)["finish_s"] == pytest.approx(2 * prefill_s(8) + decode_s(18))
    assert run.request(0)["finish_s"] == pytest.approx(2 * prefill_s(8) + decode_s(18) + decode_s(10))


def test_prompt_budget_and_sequence_cap_limit_a_prefill_step(toy_run):
    requests = [request(i, 8, 2) for i in range(5)]
    run = toy_run(
        PrefillFirstScheduler, RecomputePolicy, paged(128), requests, max_num_batched_tokens=16, max_num_seqs=3
    )
    assert [len(p.prefills) for p in run.plans[:3]] == [2, 1, 0]  # 16 prompt tokens, then the cap of 3 sequences
    assert len(run.plans[2].decodes) == 3


def test_nothing_is_admitted_while_a_request_is_swapped_out(toy_run):
    # 3 blocks: A and B take one each; at step 1 A takes the last and B (newest) swaps itself out.
    # C arrives meanwhile but waits: swapped requests come back first, and only in a decode step
    # with no preemption.
    requests = [request(0, 8, 3), request(1, 8, 3), request(2, 8, 1, arrival_s=10.1)]
    run = toy_run(PrefillFirstScheduler, SwapPolicy, paged(24), requests)
    plans = run.plans
    assert plans[1].preemptions[0].mechanism == "swap" and plans[1].swap_out[0].num_bytes == 8 * 16
    assert run.row(1)["swap_s"] == swap_s(8 * 16, 1)
    resumed = next(i for i, p in enumerate(plans) if p.swap_in)
    admitted_c = next(i for i, p in enumerate(plans) if any(c.seq.group.request_id == 2 for c in p.prefills))
    assert resumed < admitted_c
    assert all(not p.prefills for p in plans[1 : resumed + 1])
