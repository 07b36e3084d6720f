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
    batch's decodes for its whole prefill (no chunking).

    With ``decodes_in_budget`` (vLLM V1 with chunked prefill off) the decodes are charged to the
    same budget first and a prompt is admitted only if it fits what they leave, whole."""

    name = "mixed"

    def __init__(self, config=None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        if self.config.decodes_in_budget:
            self.config.require_decodes_fit("decodes_in_budget")

    def schedule_step(self, plan) -> None:
        budget = self.config.max_num_batched_tokens
        used = self.run_running(plan)
        if self.config.decodes_in_budget:
            budget -= used
        if not plan.preemptions and self.resume_swapped(plan) and budget > 0:
            self.admit(plan, budget)


@hookimpl
def kvbench_register_schedulers():
    return [MixedScheduler]
