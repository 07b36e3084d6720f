"""The scheduler's options (``scheduler.*``), every scheduling policy has them, and their checks.

A policy plugin's ``Config`` may subclass :class:`SchedulerConfig` to add its own. Each option
names the vLLM, nano-vllm, SGLang or TRT-LLM rule it reproduces, so a run can decide as that
engine does. Every default keeps kvbench's own rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import require
from kvbench.sched.reservation import RESERVES


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
    #: prefill_first chunks any prompt to the step's budget: the prompt being prefilled goes on
    #: first, then waiting prompts join whole, or as the chunk that fills what is left (SGLang's
    #: chunked_prefill_size); false: whole prompts only (or head_only_chunking's rule)
    chunked_prefill: bool = False
    #: room held back at admission for the output running requests will still write
    #: (:mod:`kvbench.sched.reservation`): none, new_token_ratio (SGLang's PrefillAdder) or
    #: full_output (TRT-LLM's GUARANTEED_NO_EVICT capacity scheduler)
    admission_reserve: str = "none"
    #: new_token_ratio: the ratio's start, its floor as a share of the start, and the decode
    #: steps it takes to fall from one to the other (SGLang: 0.7, 0.14, 600)
    new_token_ratio_init: float = 0.7
    new_token_ratio_min_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    #: new_token_ratio: decode steps credited to each survivor when a retraction resets the ratio (SGLang: 20)
    retract_decode_steps: int = 20
    #: new_token_ratio: a request's output counts at most this many tokens (SGLang: 4096)
    clip_max_new_tokens: int = 4096

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
        for key in (
            "watermark_in_blocks",
            "full_prompt_admission",
            "decodes_in_budget",
            "step_seq_cap",
            "head_only_chunking",
            "chunked_prefill",
        ):
            require(isinstance(getattr(self, key), bool), f"scheduler.{key}", getattr(self, key), "use true or false")
        require(
            not (self.chunked_prefill and self.head_only_chunking),
            "scheduler.chunked_prefill",
            self.chunked_prefill,
            "chunks every prompt; set scheduler.head_only_chunking=false with it (or use one of them)",
        )
        require(
            self.admission_reserve in RESERVES,
            "scheduler.admission_reserve",
            self.admission_reserve,
            f"choose one of {', '.join(RESERVES)}",
        )
        require(
            _number(self.new_token_ratio_init) and 0.0 < self.new_token_ratio_init <= 1.0,
            "scheduler.new_token_ratio_init",
            self.new_token_ratio_init,
            "use a ratio in (0, 1]",
        )
        require(
            _number(self.new_token_ratio_min_factor) and 0.0 <= self.new_token_ratio_min_factor <= 1.0,
            "scheduler.new_token_ratio_min_factor",
            self.new_token_ratio_min_factor,
            "use a fraction in [0, 1]",
        )
        for key in ("new_token_ratio_decay_steps", "clip_max_new_tokens"):
            value = getattr(self, key)
            require(_integer(value) and value >= 1, f"scheduler.{key}", value, "use an integer >= 1")
        require(
            _integer(self.retract_decode_steps) and self.retract_decode_steps >= 0,
            "scheduler.retract_decode_steps",
            self.retract_decode_steps,
            "use an integer >= 0",
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


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
