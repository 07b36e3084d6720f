"""The scheduler's options (``scheduler.*``), every scheduling policy has them, and their checks.

A policy plugin's ``Config`` may subclass :class:`SchedulerConfig` to add its own. Each option
names the vLLM or nano-vllm rule it reproduces, so a run can decide as either engine does.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import require


@dataclass
@dataclass
class SchedulerConfig:
    #: most sequences computing at once (vLLM's max_num_seqs); a fan-out counts each branch
    max_num_seqs: int = 1024
    #: tokens computed per step: prompt tokens admitted (a longer prompt alone still runs), or for
    #: chunked prefill the whole step's budget, decodes included (vLLM's max_num_batched_tokens)
    max_num_batched_tokens: int = 8192
    #: fraction of the KV budget kept free when admitting, so running sequences can grow (vLLM's
    #: watermark; 0 allowed); allocators that reserve a sequence's whole future ignore it
    watermark_fraction: float = 0.01
    #: the admission queue, by name (kvbench.sched.queue): fcfs, priority, shortest_prompt, or a plugin's
    queue: str = "fcfs"
    #: the watermark is int(watermark_fraction x blocks) whole blocks, counting every block the budget
    #: holds (vLLM's rule); false: watermark_fraction of the budget's bytes
    watermark_in_blocks: bool = False
    #: admit a waiting request only when blocks for all its known tokens (its whole prompt, and its
    #: output so far after a preemption) fit now, less any cache hit, even when only a first chunk
    #: is computed (vLLM V1's scheduler_reserve_full_isl); false: the first chunk must fit
    full_prompt_admission: bool = False
    #: most tokens one request computes in a step when more than one request is running or waiting
    #: (vLLM's long_prefill_token_threshold); 0: no cap
    long_prefill_token_threshold: int = 0
    #: a strict, shared token budget without chunking: decodes are charged to max_num_batched_tokens
    #: too (mixed) and a prompt is admitted only if it fits what is left, whole, even the step's
    #: first (vLLM V1 with chunked prefill off; nano-vllm); false: the budget counts prompt tokens
    #: only and a longer prompt alone still runs
    decodes_in_budget: bool = False
    #: max_num_seqs caps the sequences one step computes, not the running set: running requests
    #: beyond the cap wait (in order) for a later step (nano-vllm's rule); false: the running set
    step_seq_cap: bool = False
    #: prefill_first admits at most one chunked prompt per step: the head prompt, if it needs more
    #: than the budget left, takes what is left and continues over the next steps, and only a step's
    #: first prompt may be chunked (nano-vllm's rule); false: whole prompts only
    head_only_chunking: bool = False

    def validate(self) -> None:
        require(self.max_num_seqs >= 1, "scheduler.max_num_seqs", self.max_num_seqs, "use an integer >= 1")
        require(
            self.max_num_batched_tokens >= 1,
            "scheduler.max_num_batched_tokens",
            self.max_num_batched_tokens,
            "use an integer >= 1",
        )
        require(
            0.0 <= self.watermark_fraction < 1.0,
            "scheduler.watermark_fraction",
            self.watermark_fraction,
            "use a fraction in [0, 1)",
        )
        require(
            isinstance(self.queue, str) and bool(self.queue), "scheduler.queue", self.queue, "name a queue, e.g. fcfs"
        )
        for key in ("watermark_in_blocks", "full_prompt_admission", "decodes_in_budget", "step_seq_cap"):
            require(isinstance(getattr(self, key), bool), f"scheduler.{key}", getattr(self, key), "use true or false")
        require(
            isinstance(self.head_only_chunking, bool),
            "scheduler.head_only_chunking",
            self.head_only_chunking,
            "use true or false",
        )
        require(
            self.long_prefill_token_threshold >= 0,
            "scheduler.long_prefill_token_threshold",
            self.long_prefill_token_threshold,
            "use 0 (no cap) or a token count >= 1",
        )

    def require_decodes_fit(self, what: str) -> None:
        """As vLLM requires where decodes share the step's token budget (``what``: the option that
        makes them share it): every running sequence's decode must fit that budget."""
        require(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "scheduler.max_num_batched_tokens",
            self.max_num_batched_tokens,
            f"{what} needs at least scheduler.max_num_seqs={self.max_num_seqs}",
        )
