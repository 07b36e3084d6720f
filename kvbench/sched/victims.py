"""Preemption and victims: the mechanism that takes a running request's memory.

When a running sequence cannot grow, the preemption policy (:mod:`kvbench.sched.preemption`, a
plugin) picks a victim among the candidates offered here and a mechanism; this room carries it
out (:meth:`VictimsMixin._preempt`). Victims are whole requests (all branches of a fan-out
together), and a victim loses its cache, never its tokens:

- ``recompute``: its memory is released (:meth:`VictimsMixin._release`) and it rejoins the front
  of the waiting queue, its lost positions to be computed again;
- ``swap``: its blocks move to the host pool (:mod:`kvbench.sched.swapping`); a swap that does
  not fit the host pool falls back to recompute.

The candidates are the requests not yet run this step; a policy that ``considers_scheduled``
(vLLM's priority victim) may also take a one-sequence request that already ran this step, which
then gives its step back (:meth:`VictimsMixin._take_back_step`), and the loop that was running the
batch moves back by its place (:meth:`VictimsMixin._after_earlier_victims`). A run whose requests
only preempt each other is stopped (:meth:`VictimsMixin._stop_a_livelock`).
"""

from __future__ import annotations

from kvbench.core.sequence import SequenceGroup, Status
from kvbench.core.step import Mechanism, Preemption, StepPlan
from kvbench.errors import ConfigError


class VictimsMixin:
    """The :class:`~kvbench.sched.scheduler.Scheduler`'s preemptions (``_num_earlier_victims`` and
    ``_returned_tokens``: victims taken this step from requests that had already run, and the tokens
    they gave back)."""

    def _preempt(self, plan: StepPlan, index: int) -> SequenceGroup:
        """Evict one request as the policy decides: among ``running[index:]`` (not yet run this
        step), or, for a policy that ``considers_scheduled`` (vLLM's priority victim), among every
        running request, one that already ran this step giving its tokens back (one-sequence
        requests only: a fan-out's forks are not taken back)."""
        if self.policy.considers_scheduled:
            positions = [i for i, g in enumerate(self.running) if i >= index or len(g.seqs) == 1]
        else:
            positions = list(range(index, len(self.running)))
        candidates = [self.running[i] for i in positions]
        choice, answer = self.policy.choose(candidates, self.preemption)
        try:
            mechanism = Mechanism(answer)  # an outside policy may answer the plain string "swap"
        except ValueError:
            raise ConfigError(
                f"preemption={self.policy.name!r} answered the mechanism {answer!r}: answer "
                "Mechanism.RECOMPUTE or Mechanism.SWAP (kvbench.core.step)"
            ) from None
        victim = candidates[choice]
        if positions[choice] < index:
            self._take_back_step(plan, victim)
            self._num_earlier_victims += 1
        del self.running[positions[choice]]
        if self._work is not None and self._work.group is victim:
            self._take_back(self._work)
        if self.holds_finished:
            self._release_finished_branches(victim)
        fell_back = mechanism == Mechanism.SWAP and not self.preemption.can_swap(victim)
        if fell_back:
            mechanism = Mechanism.RECOMPUTE
        kv_tokens = victim.num_cached_positions()
        swap_out_bytes = 0
        if mechanism == Mechanism.SWAP:
            swap_out_bytes = self._swap_out(plan, victim)
        else:
            self._release(victim)
            victim.num_lost_tokens += kv_tokens
            victim.num_recomputed_tokens += kv_tokens
            victim.status = Status.WAITING
            self.waiting.add_preempted(victim)
        self.num_running_seqs -= victim.num_live
        # the plan is the record of the event: the recorder counts the request's preemptions from it
        plan.preemptions.append(Preemption(victim, kv_tokens, mechanism, fell_back, swap_out_bytes))
        return victim

    def _after_earlier_victims(self, index: int, used: int) -> tuple[int, int]:
        """The loop's place and tokens used after victims taken from the part of ``running`` that
        had already run this step (their places and tokens are given back)."""
        index, used = index - self._num_earlier_victims, used - self._returned_tokens
        self._num_earlier_victims = self._returned_tokens = 0
        return index, used

    def _take_back_step(self, plan: StepPlan, group: SequenceGroup) -> None:
        """Take a one-sequence request that already ran this step out of the plan: its decode or
        chunk, its sample and its growth (the tokens go back to the step's budget)."""
        (seq,) = group.seqs
        if seq in plan.decodes:
            plan.decodes.remove(seq)
            plan.kv_read_tokens -= seq.num_computed_tokens
            seq.num_computed_tokens -= 1
            self._returned_tokens += 1
        for chunk in [c for c in plan.prefills if c.seq is seq]:
            plan.prefills.remove(chunk)
            seq.num_computed_tokens = chunk.num_context_tokens
            group.num_lost_tokens += chunk.num_recomputed_tokens
            self._returned_tokens += chunk.num_new_tokens
        if seq in plan.samples:
            plan.samples.remove(seq)
        if seq.status is Status.RUNNING:
            self.allocator.truncate(seq.seq_id, seq.num_computed_tokens)

    def _release(self, group: SequenceGroup) -> None:
        """Free every branch the allocator holds; the group keeps its tokens, not its cache."""
        for seq in group.held_seqs():
            self.allocator.free(seq.seq_id)
            seq.status = Status.WAITING
        for seq in group.live_seqs():
            seq.num_computed_tokens = 0
        group.is_forked = False

    def _stop_a_livelock(self, plan: StepPlan) -> None:
        """Count a step's preemptions when it sampled no token, and stop the run once there are
        more than ``max_preemptions_without_a_token`` in a row: the requests preempt each other for ever."""
        self._preemptions_without_a_token += len(plan.preemptions)
        if self._preemptions_without_a_token > self.max_preemptions_without_a_token:
            victim = getattr(self.policy.config, "victim", None)
            raise RuntimeError(
                f"scheduler {self.name!r}, preemption {self.policy.name!r}"
                f"{f' (victim {victim!r})' if victim else ''}: {self._preemptions_without_a_token:,} "
                f"preemptions in a row without a token sampled, at step {self._step} ({len(self.running)} "
                f"running, {len(self.waiting)} waiting, {len(self.swapped)} swapped): the requests "
                "preempt each other for ever"
            )
