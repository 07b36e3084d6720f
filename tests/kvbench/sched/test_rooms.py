"""The scheduler's rooms: ``Scheduler`` mixes in one module per concern (kvbench/sched/). A name
defined in two rooms would be resolved by the order of its bases, silently, so each is defined once;
and the names plugins and the conformance suite import stay where they were."""

from __future__ import annotations

from kvbench.sched.scheduler import Scheduler


def test_each_mechanism_is_defined_in_one_room():
    defined_in: dict[str, str] = {}
    twice = []
    for room in Scheduler.__mro__[:-1]:  # Scheduler, then its rooms; object aside
        for name in vars(room):
            if name.startswith("__"):
                continue
            if name in defined_in:
                twice.append(f"{name}: {defined_in[name]} and {room.__module__}.{room.__name__}")
            defined_in[name] = f"{room.__module__}.{room.__name__}"
    assert not twice, twice


def test_the_scheduler_module_still_exports_what_is_imported_from_it():
    from kvbench.sched.options import SchedulerConfig
    from kvbench.sched.scheduler import SchedulerConfig as from_scheduler
    from kvbench.sched.scheduler import StepOutcome

    assert from_scheduler is SchedulerConfig and Scheduler.Config is SchedulerConfig
    assert StepOutcome._fields == ("num_finished_requests", "any_seq_finished")


def test_the_mechanisms_a_policy_calls_and_overrides_are_on_the_scheduler():
    for name in ("schedule_step", "run_running", "continue_prefills", "admit", "resume_swapped", "check_fits"):
        assert callable(getattr(Scheduler, name)), name
    # the names the built-in policies used before the contract was public
    assert Scheduler._run_running is Scheduler.run_running
    assert Scheduler._admit is Scheduler.admit
    assert Scheduler._resume_swapped is Scheduler.resume_swapped
