"""``length_aware``: per victim, the cheaper of swap and recompute; the break-even it reports."""

from __future__ import annotations

import pytest
from kvbench_plugins.preemption.length_aware import LengthAwarePolicy
from kvbench_plugins.schedulers.mixed import MixedScheduler
from toy import TOY_MODEL, paged, request, toy_hardware

from kvbench.exec.costmodel import CostModel

# A 16 B/s host link makes swapping slow enough to lose to recompute for short victims. Per KV
# token: a swap round trip costs 2 x (16 / 16 + 0.5 / 8) = 2.125 s (bytes, then one copy per
# 8-token block); recompute 2 x 500 / 2000 = 0.5 s plus 4 x 8 / 2000 = 0.016 s per token of
# context. They cross at S* = (2.125 - 0.5) / 0.016 = 101.5625 tokens.
BREAK_EVEN = (2.125 - 0.5) / 0.016


def slow_link_hardware(budget_tokens: int):
    hw = toy_hardware(budget_tokens)
    hw.host_link_bytes_per_s = 16
    return hw


def test_the_reported_break_even_is_the_closed_form():
    cost = CostModel(TOY_MODEL, slow_link_hardware(64))
    assert cost.swap_break_even_kv_tokens(8) == pytest.approx(BREAK_EVEN, rel=1e-12)


def test_it_recomputes_below_the_break_even_and_swaps_above(toy_run):
    # prompts of 8..150 tokens growing by 60 each in 40 blocks: growth preempts the newest in turn
    requests = [request(i, prompt, 60) for i, prompt in enumerate([120, 20, 150, 8, 100, 40])]
    run = toy_run(MixedScheduler, LengthAwarePolicy, paged(8 * 40), requests, hardware=slow_link_hardware(8 * 40))
    decisions = [(p.kv_tokens, p.mechanism) for plan in run.plans for p in plan.preemptions]
    assert decisions == [(10, "recompute"), (158, "swap"), (40, "recompute"), (113, "swap")]
    for kv_tokens, mechanism in decisions:
        if kv_tokens <= BREAK_EVEN - 8:
            assert mechanism == "recompute", (kv_tokens, mechanism)
        if kv_tokens >= BREAK_EVEN + 8:
            assert mechanism == "swap", (kv_tokens, mechanism)
