"""``static``: request-level batching, the FasterTransformer baseline that Orca replaced."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.sched.scheduler import Scheduler


class StaticScheduler(Scheduler):
    """A batch is formed only when the previous one has completely finished: swapped requests
    first, then waiting ones first come first served while they fit (within the sequence cap; the
    whole batch is prefilled in its first step). The batch then decodes until its longest member
    finishes. A member that finishes early stops computing but keeps its memory, and every request
    of the batch is returned when the batch completes. A preempted member leaves the batch and
    waits for a later one."""

    name = "static"
    holds_finished = True

    def schedule_step(self, plan) -> None:
        if self.running:
            self.run_running(plan)
            return
        if self.resume_swapped(plan):
            self.admit(plan, None)


@hookimpl
def kvbench_register_schedulers():
    return [StaticScheduler]
