"""Computing the running requests' next tokens: decodes and prefill chunks, and growth that preempts.

Tokens are counted as vLLM v1 does: every sequence has ``num_tokens`` and ``num_computed_tokens``;
a step computes some of the difference (a decode, or the next chunk of a prefill or of a
recomputation), and a sequence whose tokens are all computed samples one more.

- :meth:`ComputeMixin.run_running` walks ``running`` in admission order. Its hot path is the run
  of one-sequence requests decoding (a token each), appended in one allocator call; any other
  request, and the first that finds no room, goes through :meth:`ComputeMixin._compute`;
- :meth:`ComputeMixin._compute` schedules one request's tokens: a one-sequence request's straight
  into the plan (:meth:`ComputeMixin._compute_one`), a fan-out's through
  :mod:`kvbench.sched.fan_out`;
- :meth:`ComputeMixin._room` grows a sequence's allocation: when the allocator cannot make room,
  the preemption policy picks a victim among the requests not yet run this step, possibly the one
  growing (:mod:`kvbench.sched.victims`). A first allocation is an admission instead: refused
  rather than preempting anyone.
"""

from __future__ import annotations

from kvbench.core.sequence import Sequence, SequenceGroup, Status
from kvbench.core.step import PrefillChunk, StepPlan
from kvbench.memory.allocator import Refusal


def _decoding_run(running: list[SequenceGroup], start: int, end: int) -> tuple[list[Sequence], list[int]]:
    """The sequences of ``running[start:end]`` up to the first group that is not a one-sequence
    request decoding (its next token is its only one to compute), and their ids: a decode step's
    common case."""
    run, seq_ids = [], []
    for group in running[start:end]:
        seqs = group.seqs
        if len(seqs) != 1:
            break
        seq = seqs[0]
        context = seq.num_computed_tokens
        if seq.num_tokens != context + 1 or context < seq.prompt_tokens:
            break
        run.append(seq)
        seq_ids.append(seq.seq_id)
    return run, seq_ids


class ComputeMixin:
    """The :class:`~kvbench.sched.scheduler.Scheduler`'s computing of running requests (its state
    is set by ``Scheduler.__init__``)."""

    def run_running(self, plan: StepPlan, token_budget: int | None = None) -> int:
        """Compute the running requests' next tokens in admission order (decodes, or prefill
        chunks within ``token_budget``), preempting when memory runs out. Returns tokens used.
        With ``step_seq_cap`` at most ``max_num_seqs`` sequences compute; the rest wait their turn
        in order."""
        used, index = 0, 0
        running, append, decodes = self.running, self.allocator.append, plan.decodes
        cap = self.config.max_num_seqs if self.config.step_seq_cap else None
        while index < len(running):
            if token_budget is not None and used >= token_budget:
                break
            if cap is not None and self._seqs_counted(plan) >= cap:
                break
            if cap is None:
                # NOTE: the hot path: the run of one-sequence requests decoding from here on (a token
                # each, within the budget), appended in one call. The first that finds no room, and
                # any other request, goes through _compute
                end = len(running) if token_budget is None else min(len(running), index + token_budget - used)
                batch, seq_ids = _decoding_run(running, index, end)
                if batch:
                    num_fitted = self.allocator.append_each(seq_ids, 1)
                    all_fitted = num_fitted == len(batch)
                    if not all_fitted:
                        del batch[num_fitted:]
                    read_tokens = 0
                    for seq in batch:
                        context = seq.num_computed_tokens + 1
                        seq.num_computed_tokens = context
                        read_tokens += context
                    decodes.extend(batch)
                    plan.kv_read_tokens += read_tokens
                    used += num_fitted
                    index += num_fitted
                    if all_fitted:
                        continue
            group = running[index]
            seqs = group.seqs
            if cap is not None and len(seqs) == 1:
                # NOTE: the hot path with the step's sequences capped (step_seq_cap), one at a time
                seq = seqs[0]
                context = seq.num_computed_tokens
                if seq.num_tokens == context + 1 and context >= seq.prompt_tokens and append(seq.seq_id, 1):
                    seq.num_computed_tokens = context + 1
                    decodes.append(seq)
                    plan.kv_read_tokens += context + 1
                    used += 1
                    index += 1
                    continue
            budget = None if token_budget is None else token_budget - used
            budget = self._chunk_cap(budget)
            tokens = self._compute(plan, group, budget, index)
            index, used = self._after_earlier_victims(index, used)
            if tokens is None:
                continue  # the group itself was preempted: the next one is now at `index`
            used += tokens
            index += 1
        return used

    def _compute(self, plan: StepPlan, group: SequenceGroup, budget: int | None, index: int | None) -> int | None:
        """Schedule up to ``budget`` (None: all) new tokens of ``group``. ``index`` is its place in
        ``running`` (growth may preempt ``running[index:]``); None while admitting it (nothing is
        preempted then). Returns the tokens scheduled, or None if the group could not run."""
        if len(group.seqs) == 1:
            return self._compute_one(plan, group, group.seqs[0], budget, index)
        return self._compute_branches(plan, group, budget, index)

    def _compute_one(
        self, plan: StepPlan, group: SequenceGroup, seq: Sequence, budget: int | None, index: int | None
    ) -> int | None:
        """:meth:`_compute` for the common request of one sequence: its work goes straight into
        the plan (nothing to fork, and a refused growth took nothing, so nothing to take back)."""
        if seq.status is Status.WAITING and self._caches_prefixes:
            seq.num_computed_tokens = self._cache_hit(group, seq.num_tokens)  # 0 until now: it held nothing
        context = seq.num_computed_tokens
        n = seq.num_tokens - context
        if budget is not None and n > budget:
            n = budget
        if n <= 0:
            return 0
        if seq.status is Status.WAITING:
            if not self._allocate(group, seq, n):
                return None
        elif not self.allocator.append(seq.seq_id, n) and not self._room(plan, group, seq, n, index):
            return None
        seq.num_computed_tokens = context + n
        if n == 1 and seq.num_tokens == context + 1 and seq.num_tokens > seq.prompt_tokens:
            plan.decodes.append(seq)
            plan.kv_read_tokens += context + 1
            return 1
        recomputed = group.num_lost_tokens
        if recomputed:
            recomputed = n if n < recomputed else recomputed
            group.num_lost_tokens -= recomputed
        plan.prefills.append(PrefillChunk(seq, n, context, recomputed))
        if seq.num_computed_tokens == seq.num_tokens:
            plan.samples.append(seq)
        return n

    def _room(self, plan: StepPlan, group: SequenceGroup, seq: Sequence, n: int, index: int | None) -> bool:
        """Room in the allocator for ``n`` more tokens of ``seq``: its first allocation (admission,
        refused rather than preempting) or growth (preempting ``running[index:]`` until it fits,
        which may be the group itself)."""
        if seq.status is Status.WAITING:  # the request's first allocation: admission
            return self._allocate(group, seq, n)
        while not self.allocator.append(seq.seq_id, n):
            if index is None:  # a readmitted fan-out whose branches do not fit after its prompt
                self._refused = group.shape(self._admission_tokens(group)), Refusal.NO_MEMORY
                return False
            if self.policy.considers_scheduled:  # an earlier victim (lowest_priority) may have moved it up
                index = self.running.index(group)
            if self._preempt(plan, index) is group:
                return False
        return True
