"""Fan-out and beams: a request of several branches (parallel sampling, beam search).

A fan-out's first live branch computes the shared prompt; when the prompt is complete the other
branches fork off it (sharing its blocks, or copying into the ranges reserved at admission), and
each branch then computes its own tokens. A fan-out's share of a step is gathered in a
:class:`GroupWork` and committed to the plan only once all of it fits: when a branch cannot grow,
the request is preempted or its admission refused, and the growth and forks it had taken this step
are taken back (:meth:`FanOutMixin._take_back`), so it leaves with what it had.

Beam search keeps the best continuations: after a decode step each beam may be replaced by a copy
of another (:meth:`FanOutMixin._reshuffle_beams`). A fan-out re-admitted after a preemption under a
prefix cache is started only when it cannot fail (:meth:`FanOutMixin._forked_fits`).
"""

from __future__ import annotations

import numpy as np

from kvbench.core.sequence import Sequence, SequenceGroup, Status
from kvbench.core.step import PrefillChunk, StepPlan
from kvbench.memory.allocator import Refusal


class GroupWork:
    """One fan-out's share of a step, committed to the plan only once all of it fits."""

    __slots__ = ("group", "decodes", "chunks", "samples", "forks", "kv_read_tokens", "grown")

    def __init__(self, group: SequenceGroup) -> None:
        self.group = group
        #: (sequence, tokens computed before this step) for every growth, to take it back
        self.grown: list[tuple[Sequence, int]] = []
        self.decodes: list[Sequence] = []
        self.chunks: list[PrefillChunk] = []
        self.samples: list[Sequence] = []
        self.forks: list[tuple[Sequence, Sequence]] = []
        self.kv_read_tokens = 0


class FanOutMixin:
    """The :class:`~kvbench.sched.scheduler.Scheduler`'s fan-outs and beams (``_work`` is the
    fan-out whose tokens are being scheduled)."""

    def _compute_branches(
        self, plan: StepPlan, group: SequenceGroup, budget: int | None, index: int | None
    ) -> int | None:
        """:meth:`_compute` for a request of several branches: the shared prompt on the first live
        branch, the forks once it is complete, then each branch's own tokens, all gathered in a
        :class:`GroupWork` that is committed only once all of it fits."""
        plan.copies.extend(self.allocator.drain_copies())
        work = self._work = GroupWork(group)
        remaining = budget
        if group.needs_fork():  # the shared prompt first, on the first live branch
            root = group.root()
            if root.status is Status.WAITING and self._caches_prefixes:
                root.num_computed_tokens = self._cache_hit(group, group.request.prompt_tokens)
            n = group.request.prompt_tokens - root.num_computed_tokens
            if remaining is not None:
                n = min(n, remaining)
            if n > 0:
                if not self._grow(plan, work, group, root, n, index):
                    return self._drop(index is None)
                remaining = None if remaining is None else remaining - n
            if root.num_computed_tokens < group.request.prompt_tokens:
                return self._commit(plan, group, work)
            self._fork(work, group, root)
        for seq in group.seqs:
            if seq.status is Status.FINISHED or seq.status is Status.SWAPPED:
                continue
            if seq.status is Status.WAITING and self._caches_prefixes and not group.needs_fork():
                seq.num_computed_tokens = self._cache_hit(group, seq.num_tokens)  # a readmitted last branch
            n = seq.num_pending_tokens
            if remaining is not None:
                n = min(n, remaining)
            if n <= 0 or (seq.status is Status.WAITING and group.needs_fork()):
                continue
            if not self._grow(plan, work, group, seq, n, index):
                return self._drop(index is None)
            remaining = None if remaining is None else remaining - n
        if group.request.beam_fork_probability and group.is_forked:
            plan.has_beam_search = True
            if work.decodes and not work.chunks:
                self._reshuffle_beams(work, group)
        return self._commit(plan, group, work)

    def _grow(
        self, plan: StepPlan, work: GroupWork, group: SequenceGroup, seq: Sequence, n: int, index: int | None
    ) -> bool:
        """Room for ``n`` more tokens of ``seq`` (preempting when it does not fit), recorded in ``work``."""
        if not self._room(plan, group, seq, n, index):
            return False
        context = seq.num_computed_tokens
        work.grown.append((seq, context))
        seq.num_computed_tokens = context + n
        if n == 1 and seq.num_tokens == context + 1 and seq.num_tokens > seq.prompt_tokens:
            work.decodes.append(seq)
            work.kv_read_tokens += context + 1
            return True
        recomputed = min(n, group.num_lost_tokens - sum(c.num_recomputed_tokens for c in work.chunks))
        work.chunks.append(PrefillChunk(seq, n, context, recomputed))
        if seq.num_computed_tokens == seq.num_tokens:
            work.samples.append(seq)
        return True

    def _fork(self, work: GroupWork, group: SequenceGroup, root: Sequence) -> None:
        """The prompt is computed: every other live branch shares (or copies) it."""
        prompt = group.request.prompt_tokens
        for seq in group.seqs:
            if seq is root or seq.status is not Status.WAITING:
                continue
            self.allocator.fork(root.seq_id, seq.seq_id, prompt + seq.output_tokens - 1)
            seq.status = Status.RUNNING
            seq.num_computed_tokens = prompt
            work.forks.append((root, seq))
            if seq.num_tokens == prompt:  # a new branch samples its first token with the root
                work.samples.append(seq)
        group.is_forked = True

    def _reshuffle_beams(self, work: GroupWork, group: SequenceGroup) -> None:
        """Beam search keeps the best continuations: after the step, each beam is replaced with
        probability ``beam_fork_probability`` by a copy of another beam (drawn uniformly), which
        shares (paged) or copies (contiguous) that beam's whole cache."""
        if group.beam_rng is None:
            group.beam_rng = np.random.default_rng([group.request.seed, group.request_id])
        beams = group.held_seqs()
        if len(beams) < 2:
            return
        if len({beam.num_computed_tokens for beam in beams}) > 1:
            # a step's token budget can leave the beams at different lengths (chunked steps schedule
            # a group's branches in turn): a beam replaced by a copy of a shorter or longer one would
            # hold a cache that is not its length, so beams out of step are not reshuffled
            return
        rng = group.beam_rng
        replaced = rng.random(len(beams)) < group.request.beam_fork_probability
        others = rng.integers(0, len(beams) - 1, size=len(beams))
        for j, beam in enumerate(beams):
            if replaced[j]:
                parent = beams[others[j] + (others[j] >= j)]  # any beam but itself
                self.allocator.fork(parent.seq_id, beam.seq_id, beam.end_tokens - 1)
                work.forks.append((parent, beam))

    def _commit(self, plan: StepPlan, group: SequenceGroup, work: GroupWork) -> int:
        """All of the fan-out's share fit: into the plan. Returns the tokens scheduled."""
        self._work = None
        plan.decodes.extend(work.decodes)
        plan.kv_read_tokens += work.kv_read_tokens
        plan.prefills.extend(work.chunks)
        plan.samples.extend(work.samples)
        plan.forks.extend(work.forks)
        group.num_lost_tokens -= sum(c.num_recomputed_tokens for c in work.chunks)
        return len(work.decodes) + sum(c.num_new_tokens for c in work.chunks)

    def _drop(self, refused_admission: bool = False) -> None:
        """The request could not run: preempted (its growth was taken back by then) or refused at
        admission (the caller releases it). A refused admission's growth is taken back first, so
        that blocks it filled are not left keyed in a prefix cache: their KV was never computed."""
        if refused_admission and self._work is not None:
            self._take_back(self._work)
        self._work = None

    def _take_back(self, work: GroupWork) -> None:
        """Undo the step's growth of the request being preempted: it leaves with what it had."""
        for _, child in work.forks:
            self.allocator.free(child.seq_id)
            child.status = Status.WAITING
            child.num_computed_tokens = 0
        if work.forks:
            work.group.is_forked = False
        for seq, before in reversed(work.grown):
            if seq.status is Status.RUNNING:
                self.allocator.truncate(seq.seq_id, before)
            seq.num_computed_tokens = before

    # --- a fan-out re-admitted after a preemption ----------------------------------------------------

    @staticmethod
    def _is_readmission(group: SequenceGroup) -> bool:
        """A fan-out preempted after its branches had emitted tokens: re-admitting it allocates
        the prompt, then grows every branch (a first admission only allocates the prompt)."""
        prompt = group.request.prompt_tokens
        return any(seq.num_tokens > prompt for seq in group.live_seqs())

    def _forked_fits(self, group: SequenceGroup) -> bool:
        """Whether a re-admitted fan-out (its branches past the prompt, preempted since) surely
        fits, as the allocator counts it (:meth:`Allocator.can_readmit_branches`), the watermark
        kept. Re-admitting it allocates the shared prompt first, then each branch; when a branch
        does not fit, the admission is taken back. Under a prefix cache taking back is not
        neutral: the prompt's allocation has reused and evicted cached blocks. An admission that is
        refused must change nothing (the event-driven loop skips the steps where it is retried), so
        a prefix cache only starts a re-admission that cannot fail. With nothing running it is not
        applied (nothing would free memory, and no decode run is skipped meanwhile)."""
        if not self.num_running_seqs:  # nothing runs: nothing to skip, and waiting would wait forever
            return True
        branch_tokens = [seq.num_tokens for seq in group.live_seqs()]
        if self.allocator.can_readmit_branches(group.request.prompt_tokens, branch_tokens, self._headroom_bytes):
            return True
        shape = group.shape(self._first_allocation_tokens(group))
        self._refused = shape, Refusal.NO_MEMORY
        return False
