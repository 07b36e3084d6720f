"""Victim choice, one axis for every policy: newest, least progress, cost-aware or lowest priority."""

from __future__ import annotations

import pandas as pd
import pytest
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.preemption.swap import SwapPolicy
from toy import PLAIN_SCHEDULER_OPTIONS, TOY_MODEL, paged, prefill_s, request, swap_s, toy_hardware

from kvbench.core.sequence import SequenceGroup, Status
from kvbench.core.step import Mechanism
from kvbench.errors import ConfigError
from kvbench.exec.costmodel import CostModel
from kvbench.memory.host_pool import HostSwapPool
from kvbench.plugins import lookup
from kvbench.sched.preemption import PreemptionConfig, PreemptionContext
from kvbench.sched.queue import PriorityQueue
from kvbench.testing.schedulers import allocators, build_engine, check_run, limit_steps, make_requests


def running_groups(*computed_tokens: int, budget_tokens: int = 256, requests=None):
    """Groups that have computed these many tokens each, admitted in this order (of ``requests``
    when given, else of requests 0, 1, ...)."""
    allocator = paged(budget_tokens)
    groups = []
    for i, tokens in enumerate(computed_tokens):
        group = SequenceGroup(requests[i] if requests else request(i, tokens, 4), first_seq_id=i)
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


def test_lowest_priority_is_the_largest_priority_then_arrival_then_the_later_row():
    # 3 and 1 rank lowest (priority 2, arrival 0.5); 3 is the later row, whichever was admitted first
    rows = [(0, 0.0, 0), (1, 0.5, 2), (2, 0.0, 1), (3, 0.5, 2)]
    by_id = {i: request(i, 8, 4, arrival_s=a, priority=p) for i, a, p in rows}
    lowest_priority = RecomputePolicy(PreemptionConfig("lowest_priority"))
    for admitted, victim in (([2, 0, 1, 3], 3), ([2, 3, 0, 1], 1)):
        groups, ctx = running_groups(8, 8, 8, 8, requests=[by_id[i] for i in admitted])
        assert lowest_priority.choose(groups, ctx) == (victim, Mechanism.RECOMPUTE)


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


#: (gap, prompt, output, branches, beam-fork probability, prefix, priority): the last two are equal
EQUAL_REQUESTS = [
    (0, 39, 23, 1, 0, 0, -1),
    (0.5, 21, 3, 1, 0, 1, 0),
    (0, 7, 1, 1, 0.5, 0, 2),
    (0, 39, 30, 1, 0, 0, 2),
    (0, 39, 30, 1, 0, 0, 2),
]


def _equal_requests_engine(policy_class, event_driven: bool):
    scheduler = lookup("scheduler", "prefill_first")
    options = {**PLAIN_SCHEDULER_OPTIONS, "watermark_in_blocks": True, "step_seq_cap": True, "head_only_chunking": True}
    config = scheduler.Config(**options)
    return build_engine(
        scheduler,
        policy_class,
        allocators(96)["paged"],
        scheduler_config=config,
        victim="lowest_priority",
        event_driven=event_driven,
        queue=PriorityQueue(),
    )


def test_two_equal_requests_under_recompute_do_not_evict_each_other_for_ever():
    """Found by the conformance suite in CI: 3 and 4 have the same priority and arrival and need
    9 blocks of 8 each in a 12-block budget. When a tie went to the first admitted, the one
    decoding was the victim of the other's recomputation, which was then the victim of the first's,
    and neither finished (17.9 million steps before a CI run here was stopped). The later row is
    the victim: the earlier one keeps its blocks and finishes. Both loops write the same tables."""
    requests = make_requests(EQUAL_REQUESTS)
    tables = []
    for event_driven in (True, False):
        engine = _equal_requests_engine(RecomputePolicy, event_driven)
        record = limit_steps(engine).run(requests)  # fails, rather than hangs, if no one finishes
        check_run(engine, requests, record)  # every request finished with its output, no block leaked
        assert record.requests["num_preemptions"].sum() > 0
        tables.append(record)
    for name in ("requests", "steps"):
        pd.testing.assert_frame_equal(getattr(tables[0], name), getattr(tables[1], name), check_exact=True)


class FirstAdmittedTiePolicy(RecomputePolicy):
    """The tie rule before the fix: of equal (priority, arrival), the first admitted is the victim."""

    def choose(self, candidates, ctx):
        rank = [(group.request.priority, group.request.arrival_s) for group in candidates]
        return rank.index(max(rank)), Mechanism.RECOMPUTE


@pytest.mark.parametrize("event_driven", [True, False])
def test_a_run_whose_requests_preempt_each_other_for_ever_stops_with_an_error(event_driven):
    """The engine's own guard, for a plugin that livelocks: the example above under the old tie rule
    stops once it has preempted more times in a row than the scheduler allows without a token."""
    engine = _equal_requests_engine(FirstAdmittedTiePolicy, event_driven)
    engine.scheduler.max_preemptions_without_a_token = 500  # 1,000,000 by default: seconds, not minutes
    with pytest.raises(
        RuntimeError,
        match=r"^scheduler 'prefill_first', preemption 'recompute' \(victim 'lowest_priority'\): 501 preemptions "
        r"in a row without a token sampled, at step \d+ \(\d running, \d waiting, 0 swapped\): the requests "
        r"preempt each other for ever$",
    ):
        limit_steps(engine).run(make_requests(EQUAL_REQUESTS))
