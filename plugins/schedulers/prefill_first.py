"""``prefill_first``: vLLM v0's and nano-vllm's default, a step either prefills or decodes."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.sched.scheduler import Scheduler


class PrefillFirstScheduler(Scheduler):
    """A step prefills whenever a waiting prompt fits (from the head of the queue, within the
    sequence cap and ``max_num_batched_tokens`` prompt tokens) and nothing is swapped out; such a
    step only prefills. Otherwise every running sequence decodes, the newest being preempted when
    one cannot grow, and swapped requests come back if nobody was preempted (vLLM v0's order).

    With ``head_only_chunking`` (nano-vllm) a prompt longer than the budget left is chunked if it
    is the step's first: the prompt still being prefilled goes on first, with the whole budget,
    and later prompts join a step only if they fit what is left, whole.

    With ``chunked_prefill`` (SGLang's ``chunked_prefill_size``, whose prefill and decode batches
    alternate this way unless ``--enable-mixed-chunk``) any prompt may be chunked: the prompt still
    being prefilled goes on first, then waiting prompts join whole, and the one that does not fit
    takes what is left of the budget and continues over the next prefill steps."""

    name = "prefill_first"

    def __init__(self, config=None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.chunks_prompts = self.config.head_only_chunking or self.config.chunked_prefill

    def schedule_step(self, plan) -> None:
        cfg = self.config
        if not self.swapped:
            budget = cfg.max_num_batched_tokens
            if cfg.head_only_chunking or cfg.chunked_prefill:
                budget -= self.continue_prefills(plan, budget)
                if budget > 0:
                    self.admit(plan, budget, chunked=cfg.chunked_prefill, chunk_head=cfg.head_only_chunking)
            else:
                self.admit(plan, budget)
            if plan.prefills or plan.samples:
                return
        self.run_running(plan)
        if not plan.preemptions:
            self.resume_swapped(plan)


@hookimpl
def kvbench_register_schedulers():
    return [PrefillFirstScheduler]
