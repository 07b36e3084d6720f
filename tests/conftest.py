"""Shared fixtures: ``toy_run`` runs the toy machine of :mod:`toy` and keeps every step plan;
``fresh_paper`` builds ``kvbench paper`` once for every test that reads it."""

from __future__ import annotations

import subprocess

import pytest
from hang import hang_message
from hypothesis import HealthCheck, settings
from toy import TOY_KV_BYTES, TOY_MODEL, ToyRun, toy_hardware

from kvbench.core.step import StepPlan
from kvbench.testing import build_engine

# Property tests are judged by what they find, never by how fast this machine generates examples:
# no per-example deadline and no "too slow" health check, either of which fails a correct test on a
# busy machine. Examples stay random (a failure found is a real bug, printed with its seed).
settings.register_profile("kvbench", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvbench")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A child process or a thread that outlived the hang guard fails its test in words that say
    so (tests/support/hang.py), not as a bare TimeoutExpired a reader could take for slowness."""
    try:
        return (yield)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(hang_message(f"the command {exc.cmd[0] if isinstance(exc.cmd, list) else exc.cmd}"), pytrace=False)


@pytest.fixture
def toy_run():
    """``toy_run(scheduler_class, policy_class, allocator, requests, **options)`` runs the toy
    machine (the allocator's budget, ``host_swap_bytes`` of host pool, or ``hardware``) and keeps
    every plan; ``queue``: an admission queue (FCFS when None); other options go to the scheduler's
    config (the watermark defaults to 0)."""

    def run(
        scheduler_class,
        policy_class,
        allocator,
        requests: list,
        *,
        host_swap_bytes: int = 10**6,
        hardware=None,
        victim: str = "newest",
        event_driven: bool = False,
        queue=None,
        **scheduler_options,
    ) -> ToyRun:
        hardware = hardware or toy_hardware(allocator.budget_bytes // TOY_KV_BYTES, host_swap_bytes)
        options = {"watermark_fraction": 0.0, **scheduler_options}
        engine = build_engine(
            scheduler_class,
            policy_class,
            allocator,
            hardware=hardware,
            scheduler_config=scheduler_class.Config(**options),
            victim=victim,
            event_driven=event_driven,
            model=TOY_MODEL,
            queue=queue,
        )
        plans: list[StepPlan] = []
        schedule = engine.scheduler.schedule

        def recording(clock_s):
            plan = schedule(clock_s)
            plans.append(plan)
            return plan

        engine.scheduler.schedule = recording
        return ToyRun(engine.run(requests), plans, engine)

    return run


@pytest.fixture(scope="session")
def fresh_paper(tmp_path_factory):
    """What ``kvbench paper`` writes, built once per session (about a minute, ~150 runs) and shared
    by the paper check (tests/test_paper.py) and the sources' own tests: (folder, sources by name)."""
    from kvbench.commands.paper import generate

    folder = tmp_path_factory.mktemp("fresh-paper") / "paper"
    return folder, {source.name: source for source in generate(folder)}
