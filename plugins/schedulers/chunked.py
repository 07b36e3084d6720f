"""``chunked``: chunked prefill (Sarathi, vLLM v1), one token budget per step for everything."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.sched.scheduler import Scheduler


class ChunkedScheduler(Scheduler):
    """Every step spends at most ``max_num_batched_tokens`` tokens: running requests first, in
    admission order (a decode costs one token, an unfinished prefill takes the next chunk that
    fits); then, unless someone was preempted, swapped requests come back and waiting prompts are
    admitted with a first chunk of whatever budget is left (vLLM v1's order). A chunk's attention is priced over the context before it, so a
    long prompt no longer stalls the batch's decodes for its whole prefill."""

    name = "chunked"
    chunks_prompts = True

    def __init__(self, config=None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.config.require_decodes_fit("chunked prefill")  # decodes and chunks share one budget

    def schedule_step(self, plan) -> None:
        budget = self.config.max_num_batched_tokens
        budget -= self.run_running(plan, budget)
        if budget > 0 and not plan.preemptions and self.resume_swapped(plan):
            self.admit(plan, budget, chunked=True)


@hookimpl
def kvbench_register_schedulers():
    return [ChunkedScheduler]
