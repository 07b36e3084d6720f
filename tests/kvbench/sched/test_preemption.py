"""Victim choice, one axis for every policy: newest, least progress, or cost-aware."""

from __future__ import annotations

import pytest
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.preemption.swap import SwapPolicy
from toy import TOY_MODEL, paged, prefill_s, request, swap_s, toy_hardware

from kvbench.core.sequence import SequenceGroup, Status
from kvbench.core.step import Mechanism
from kvbench.errors import ConfigError
from kvbench.exec.costmodel import CostModel
from kvbench.memory.host_pool import HostSwapPool
from kvbench.sched.preemption import PreemptionConfig, PreemptionContext


def running_groups(*computed_tokens: int, budget_tokens: int = 256):
    """Groups that have computed these many tokens each, admitted in this order."""
    allocator = paged(budget_tokens)
    groups = []
    for i, tokens in enumerate(computed_tokens):
        group = SequenceGroup(request(i, tokens, 4), first_seq_id=i)
        seq = group.seqs[0]
        assert allocator.allocate(seq.seq_id, group.shape(tokens)) == 0
        seq.status, seq.num_computed_tokens = Status.RUNNING, tokens
        groups.append(group)
    ctx = PreemptionContext(allocator, CostModel(TOY_MODEL, toy_hardware(budget_tokens)), HostSwapPool(10**6))
    return groups, ctx


def test_newest_is_the_last_admitted():
    groups, ctx = running_groups(8, 40, 16)
    assert RecomputePolicy(PreemptionConfig("newest")).choose(groups, ctx) == (2, Mechanism.RECOMPUTE)


def test_least_progress_loses_the_fewest_tokens_and_breaks_ties_toward_the_newest():
    groups, ctx = running_groups(24, 8, 40, 8)
    assert RecomputePolicy(PreemptionConfig("least_progress")).choose(groups, ctx) == (3, Mechanism.RECOMPUTE)


def test_cost_aware_recompute_prefers_short_victims_swap_prefers_full_blocks():
    # recompute costs grow faster than the bytes they free: the shortest is cheapest per byte
    groups, ctx = running_groups(24, 8, 40)
    assert RecomputePolicy(PreemptionConfig("cost_aware")).choose(groups, ctx) == (1, Mechanism.RECOMPUTE)
    # a swap moves whole blocks, one copy each: per byte freed all cost the same, the newest goes
    groups, ctx = running_groups(24, 8, 40)
    assert SwapPolicy(PreemptionConfig("cost_aware")).choose(groups, ctx) == (2, Mechanism.SWAP)


def test_the_context_prices_a_victim_with_the_executors_cost_model():
    (group,), ctx = running_groups(20)
    assert ctx.recompute_s(group) == prefill_s(20)
    assert ctx.swap_s(group) == 2 * swap_s(3 * 8 * 16, 3)  # 3 blocks of 8, out and back
    assert ctx.freed_bytes(group) == 3 * 8 * 16


def test_an_unknown_victim_is_one_line():
    with pytest.raises(
        ConfigError, match="preemption.victim='oldest' is invalid: choose one of newest, least_progress, cost_aware"
    ):
        PreemptionConfig("oldest").validate()
