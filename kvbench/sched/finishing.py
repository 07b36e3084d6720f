"""Finishing: a branch that emitted its last token, and a request whose branches all have.

A finished sequence's memory is freed at once, or, for a policy that ``holds_finished``
(request-level batching), kept until every request of its batch has finished, the batch's requests
then returned together (:meth:`FinishingMixin._end_batch`). Finished requests wait in ``finished``
until the engine takes them.
"""

from __future__ import annotations

from kvbench.core.sequence import Sequence, Status


class FinishingMixin:
    """The :class:`~kvbench.sched.scheduler.Scheduler`'s finishes (``held``: finished requests whose
    memory is kept until their batch ends)."""

    def _finish(self, seq: Sequence, end_s: float) -> int:
        """A branch emitted its last token; returns 1 when its request is now complete."""
        group = seq.group
        seq.status = Status.FINISHED
        group.num_live -= 1
        self.num_running_seqs -= 1
        if self.holds_finished:
            self._held_seq_ids.append(seq.seq_id)
        elif self.role != "prefill":  # a prefill worker holds the KV until it is transferred
            self.allocator.free(seq.seq_id)
        if group.num_live:
            return 0
        if self.holds_finished:
            self.held.append(group)
            return 0
        group.status = Status.FINISHED
        group.finish_s = end_s
        if self.role == "prefill":
            self._hold_for_transfer(group)
        self.finished.append(group)
        return 1

    def _release_finished_branches(self, group) -> None:
        """A preempted request leaves its batch (request-level batching): the memory its finished
        branches kept for the batch goes with it now, since a swap moves and a recompute frees only
        the branches still running, and a finished branch's blocks would otherwise stay shared
        with them, held for a batch the request is no longer in."""
        for seq in group.seqs:
            if seq.status is Status.FINISHED and seq.seq_id in self._held_seq_ids:
                self._held_seq_ids.remove(seq.seq_id)
                self.allocator.free(seq.seq_id)

    def _end_batch(self, end_s: float) -> int:
        """Request-level batching: the batch is done; release its memory and return its requests."""
        for seq_id in self._held_seq_ids:
            self.allocator.free(seq_id)
        self._held_seq_ids.clear()
        for group in self.held:
            group.status = Status.FINISHED
            group.finish_s = end_s
        self.finished.extend(self.held)
        num_finished = len(self.held)
        self.held.clear()
        return num_finished
