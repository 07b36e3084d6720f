"""The built-in admission queues: ``scheduler.queue=fcfs|priority|shortest_prompt``."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.sched.queue import BUILT_IN_QUEUES


@hookimpl
def kvbench_register_queues():
    return list(BUILT_IN_QUEUES)
