"""``prefill_first``: vLLM v0's and nano-vllm's default, a step either prefills or decodes."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.sched.scheduler import Scheduler


class PrefillFirstScheduler(Scheduler):
    """A step prefills whenever a waiting prompt fits (first come first served, within the
    sequence cap and ``max_num_batched_tokens`` prompt tokens) and nothing is swapped out; such a
    step only prefills. Otherwise every running sequence decodes, the newest being preempted when
    one cannot grow, and swapped requests come back if nobody was preempted (vLLM v0's order)."""

    name = "prefill_first"

    def _schedule(self, plan) -> None:
        if not self.swapped:
            self._admit(plan, self.config.max_num_batched_tokens)
            if plan.prefills or plan.samples:
                return
        self._run_running(plan)
        if not plan.preemptions:
            self._resume_swapped(plan)


@hookimpl
def kvbench_register_schedulers():
    return [PrefillFirstScheduler]
