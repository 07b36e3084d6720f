"""Shared fixtures: ``toy_run`` runs the toy machine of :mod:`toy` and keeps every step plan."""

from __future__ import annotations

import pytest

from kvbench.core.step import StepPlan
from kvbench.testing import build_engine
from toy import TOY_KV_BYTES, TOY_MODEL, ToyRun, toy_hardware


@pytest.fixture
def toy_run():
    """``toy_run(scheduler_class, policy_class, allocator, requests, **options)`` runs the toy
    machine (the allocator's budget, ``host_swap_bytes`` of host pool, or ``hardware``) and keeps
    every plan; other options go to the scheduler's config (the watermark defaults to 0)."""

    def run(scheduler_class, policy_class, allocator, requests: list, *, host_swap_bytes: int = 10**6,
            hardware=None, victim: str = "newest", event_driven: bool = False, **scheduler_options) -> ToyRun:  # fmt: skip
        hardware = hardware or toy_hardware(allocator.budget_bytes // TOY_KV_BYTES, host_swap_bytes)
        options = {"watermark_fraction": 0.0, **scheduler_options}
        engine = build_engine(scheduler_class, policy_class, allocator, hardware=hardware,
                              scheduler_config=scheduler_class.Config(**options), victim=victim,
                              event_driven=event_driven, model=TOY_MODEL)  # fmt: skip
        plans: list[StepPlan] = []
        schedule = engine.scheduler.schedule

        def recording(clock_s):
            plan = schedule(clock_s)
            plans.append(plan)
            return plan

        engine.scheduler.schedule = recording
        return ToyRun(engine.run(requests), plans, engine)

    return run
