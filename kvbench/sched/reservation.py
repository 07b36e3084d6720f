"""Admission against the KV that the running requests will still need (``scheduler.admission_reserve``).

vLLM admits a prompt when its blocks fit now; two other engines also hold back room for the
output the running requests have yet to write:

- ``new_token_ratio`` (SGLang's ``PrefillAdder``, ``python/sglang/srt/managers/schedule_policy.py``;
  its ratio in ``scheduler.py`` and ``environ.py``): a running request reserves
  ``new_token_ratio x min(output left, clip_max_new_tokens)`` tokens; a request admitted in the
  same step reserves all of its clipped output. A waiting request is admitted only when its
  prompt still to compute plus its clipped output is *less than* what is unallocated (free and
  evictable) after those reservations. The ratio starts at ``new_token_ratio_init``, falls by
  ``(init - min) / new_token_ratio_decay_steps`` after every decode step to
  ``min = init x new_token_ratio_min_factor``, and after a decode step that preempts (SGLang's
  retraction) becomes ``min(1, (tokens decoded + retract_decode_steps x n) / (output budget + 1))``
  over the n requests left running;
- ``full_output`` (TRT-LLM's ``GuaranteedNoEvictScheduler``,
  ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``): every running sequence reserves the
  blocks it still needs to reach its last token; a waiting request is admitted only when the
  blocks for its whole prompt and output fit in what is left. Growth then never runs out of
  memory, so nobody is ever preempted.

Both are checked before a request's first allocation (:meth:`ReservationMixin._reservation_refuses`),
on top of the allocator's own answer; a refusal is recorded as ``watermark`` (it would fit, but
not with the room kept for others). ``none`` (the default) changes nothing.
"""

from __future__ import annotations

import math

from kvbench.core.kv import Refusal
from kvbench.core.sequence import SequenceGroup
from kvbench.core.step import StepPlan
from kvbench.errors import ConfigError

#: scheduler.admission_reserve values
RESERVES = ("none", "new_token_ratio", "full_output")


def _still_prefilling(seq) -> bool:
    """Whether ``seq``'s prompt (or recomputation) has tokens left after what this step computes:
    more than its next token to compute, or that one token still inside the prompt."""
    computed = seq.num_computed_tokens
    return computed < seq.num_tokens - 1 or (computed == seq.num_tokens - 1 and computed < seq.prompt_tokens)


class ReservationMixin:
    """The :class:`~kvbench.sched.scheduler.Scheduler`'s output reservations at admission (state
    set by :meth:`_init_reservation`)."""

    def _init_reservation(self) -> None:
        cfg = self.config
        self._reserve = cfg.admission_reserve
        self._ratio_active = self._reserve == "new_token_ratio"
        init = min(cfg.new_token_ratio_init, 1.0)
        #: SGLang's new_token_ratio now, its floor and its fall per decode step
        self.new_token_ratio = init
        self._min_ratio = min(init * cfg.new_token_ratio_min_factor, 1.0)
        self._ratio_decay = (init - self._min_ratio) / cfg.new_token_ratio_decay_steps
        #: tokens reserved for others during the admission in progress (set when it starts)
        self._reserved_tokens = 0.0

    # --- an admission pass ---------------------------------------------------------------------

    def _start_reservation(self, plan: StepPlan) -> None:
        """What the running requests hold back, counted once when a step starts admitting."""
        if self._reserve == "full_output":
            self._reserved_tokens = float(sum(self._tokens_to_completion(g) for g in self.running))
            return
        clip = self.config.clip_max_new_tokens
        chunked = {id(chunk.seq) for chunk in plan.prefills}
        reserved = 0.0
        for group in self.running:
            for seq in group.live_seqs():
                left = min(seq.end_tokens - seq.num_tokens, clip)
                if _still_prefilling(seq):
                    continue  # a prompt still being chunked holds no output yet (not in SGLang's running batch)
                if id(seq) in chunked:
                    reserved += left  # its last chunk runs now: reserved whole, as one admitted this step
                else:
                    reserved += self.new_token_ratio * left
        self._reserved_tokens = reserved

    def _reservation_refuses(self, group: SequenceGroup) -> bool:
        """Whether the rule keeps ``group`` waiting (recording why in ``_refused``)."""
        alloc = self.allocator
        if self._reserve == "full_output":
            shape = group.shape(self._final_tokens(group))
            need = alloc.reservation_tokens(shape)
        else:
            shape = group.shape(self._first_allocation_tokens(group))
            need = self._uncached_admission_tokens(group) + self._output_tokens(group)
        room = (alloc.unallocated_bytes() - self._headroom_bytes) / alloc.kv_bytes_per_token - self._reserved_tokens
        # SGLang refuses at total >= room; TRT-LLM admits while needed <= available
        refused = need >= room if self._ratio_active else need > room
        if refused:
            self._refused = shape, Refusal.WATERMARK
        return refused

    def _reserve_admitted(self, group: SequenceGroup) -> None:
        """A request just admitted: its future is reserved for the rest of the pass."""
        if self._reserve == "full_output":
            self._reserved_tokens += self._tokens_to_completion(group)
        else:
            self._reserved_tokens += self._output_tokens(group)

    def _check_reservation_fits(self, what: str, prompt_tokens: int, max_output_tokens: int) -> None:
        """new_token_ratio: a request whose prompt and clipped output reach the whole KV budget
        would wait for ever, even alone (SGLang's PrefillAdder refuses it at ``>=``)."""
        if not self._ratio_active:
            return
        alloc = self.allocator
        # the whole budget, not what is unallocated now: the engine checks arrivals mid-run too
        room = (alloc.budget_bytes - self.watermark_bytes) // alloc.kv_bytes_per_token
        need = prompt_tokens + min(max_output_tokens, self.config.clip_max_new_tokens)
        if need >= room:
            raise ConfigError(
                f"{what} can never be admitted under scheduler.admission_reserve=new_token_ratio: its prompt "
                f"and output ({need} tokens) must be fewer than the {room} tokens of the empty KV budget; "
                "shorten it or raise hardware.kv_budget_bytes"
            )

    # --- the ratio over decode steps (new_token_ratio) -------------------------------------------

    def _after_decode(self, plan: StepPlan) -> None:
        """SGLang's ratio after a step that decoded: reset from the survivors on a retraction
        (a preemption), else one decay step."""
        if plan.preemptions:
            seqs = [s for g in self.running for s in g.live_seqs()]
            decoded = sum(s.num_tokens - s.prompt_tokens for s in seqs)
            budget = sum(s.end_tokens - s.prompt_tokens for s in seqs)
            steps = self.config.retract_decode_steps
            self.new_token_ratio = min(1.0, (decoded + steps * len(seqs)) / (budget + 1))
        elif plan.decodes:
            self.decay_new_token_ratio(1)

    def decay_new_token_ratio(self, num_steps: int) -> None:
        """``num_steps`` decode steps without a retraction."""
        self.new_token_ratio = max(self.new_token_ratio - num_steps * self._ratio_decay, self._min_ratio)

    # --- sizes -----------------------------------------------------------------------------------

    def _output_tokens(self, group: SequenceGroup) -> int:
        """The clipped output ``group`` has yet to write, over its live branches."""
        clip = self.config.clip_max_new_tokens
        return sum(min(s.end_tokens - s.num_tokens, clip) for s in group.live_seqs())

    @staticmethod
    def _final_tokens(group: SequenceGroup) -> int:
        """The KV a request's longest branch holds at its end (its last sampled token needs none)."""
        return max(s.end_tokens for s in group.live_seqs()) - 1

    def _tokens_to_completion(self, group: SequenceGroup) -> int:
        """Slots a request's sequences still take to reach their ends, in whole blocks beyond the
        blocks they hold (TRT-LLM's getRemainingBlocksToCompletion)."""
        block = self.allocator.block_size_tokens
        return sum(
            (math.ceil((s.end_tokens - 1) / block) - math.ceil(s.num_computed_tokens / block)) * block
            for s in group.live_seqs()
        )
