"""``mixed``: Orca-style iteration-level batching, each step decodes and admits together."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.sched.scheduler import Scheduler


class MixedScheduler(Scheduler):
    """Every step: every running sequence decodes (preempting when one cannot grow); then, unless
    someone was preempted (as vLLM, so a victim is not taken straight back), swapped requests
    come back and, if none is left swapped, waiting prompts are admitted first come first served
    within the sequence cap and ``max_num_batched_tokens`` prompt tokens (a longer prompt alone
    still runs). The step's prefills and decodes run together, so a long prompt stalls the
    batch's decodes for its whole prefill (no chunking)."""

    name = "mixed"

    def _schedule(self, plan) -> None:
        self._run_running(plan)
        if not plan.preemptions and self._resume_swapped(plan):
            self._admit(plan, self.config.max_num_batched_tokens)


@hookimpl
def kvbench_register_schedulers():
    return [MixedScheduler]
