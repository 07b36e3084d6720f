"""Projection: how many quiet decode steps one plan can stand for, and taking them at once.

The event-driven loop does not decide every step: after a quiet plan (every running sequence
decodes, nothing is admitted, preempted or swapped) it asks how many identical steps follow, up to
the step before the first of its sequences finishes (:meth:`ProjectionMixin.decode_span_limit`) and
as memory allows (:meth:`ProjectionMixin.project_span`, the allocator's ``project_decode``), then
makes the plan stand for them (:meth:`ProjectionMixin.extend`). Both loops must decide alike: when
an allocator frees memory during decode (``frees_during_decode``: sliding windows), a projected
run ends before its free and cached bytes rise above what the step's decisions saw, since more
memory could admit a refused request.
"""

from __future__ import annotations

import numpy as np

from kvbench.core.step import StepPlan
from kvbench.memory.allocator import NO_PROJECTION, DecodeProjection


def _available_bytes(ledger) -> int:
    """Bytes an allocation may take: free, and cached but evictable."""
    return ledger.free_bytes + ledger.cached_bytes


def _before_memory_rises(projection: DecodeProjection, available_bytes: int) -> DecodeProjection:
    """The steps of a projected run before the first whose free and cached bytes exceed
    ``available_bytes`` (what the step's decisions saw, at its start and at its end). A scheduler
    decides at a step's start or end, and every such decision (an admission, a swap-in, a prompt
    chunk) is refused with less memory if it was refused with more, so these steps repeat the
    first one's decisions; the step that would see more memory is taken on its own."""
    if not projection.num_steps:
        return projection
    free, cached = projection.ledgers["free_bytes"], projection.ledgers["cached_bytes"]
    if isinstance(free, list):
        num_steps = next((j for j, (f, c) in enumerate(zip(free, cached)) if f + c > available_bytes), len(free))
    else:
        over = np.flatnonzero(np.asarray(free) + np.asarray(cached) > available_bytes)
        num_steps = int(over[0]) if len(over) else len(free)
    if num_steps == projection.num_steps:
        return projection
    if not num_steps:
        return NO_PROJECTION
    pages = projection.pages_mapped
    return DecodeProjection(
        num_steps,
        {name: values[:num_steps] for name, values in projection.ledgers.items()},
        None if pages is None else pages[:num_steps],
    )


class ProjectionMixin:
    """The :class:`~kvbench.sched.scheduler.Scheduler`'s projection of quiet decode steps
    (``_available_at_start_bytes``: what was free and cached when the step began)."""

    def decode_span(self, plan: StepPlan, max_steps: int) -> DecodeProjection:
        """How many more identical decode steps a quiet plan can stand for (the first finish is
        the last of them), and the ledger after each, without taking them."""
        return self.project_span(plan, self.decode_span_limit(plan, max_steps))

    def decode_span_limit(self, plan: StepPlan, max_steps: int) -> int:
        """At most how many more identical decode steps a quiet plan may stand for, memory aside:
        up to the step before the first of its sequences finishes (0: none)."""
        if not plan.is_quiet or plan.has_beam_search:
            return 0
        if self._ratio_active and self.waiting:
            return 0  # the new-token ratio falls every step: a refused head may fit at the next one
        until_finish = min([seq.end_tokens - seq.num_tokens for seq in plan.decodes]) - 1
        return max(0, min(until_finish, max_steps))

    def project_span(self, plan: StepPlan, limit: int) -> DecodeProjection:
        """The next ``limit`` (at most) decode steps of a quiet plan's sequences, as memory allows."""
        if limit <= 0:
            return NO_PROJECTION
        seq_ids = [seq.seq_id for seq in plan.decodes]
        if self._frees_during_decode and self._memory_may_change_plan(plan):
            available_bytes = _available_bytes(plan.ledger)
            if available_bytes > self._available_at_start_bytes:
                return NO_PROJECTION  # the next step's decisions already see more than this one's
            return _before_memory_rises(
                self.allocator.project_decode(seq_ids, limit, self._head_shape()), available_bytes
            )
        return self.allocator.project_decode(seq_ids, limit, self._head_shape())

    def _memory_may_change_plan(self, plan: StepPlan) -> bool:
        """Whether memory freed during a run of decode steps could change a later step: a request
        waits or is swapped out, or a running sequence did not compute this step (a prompt chunk
        that did not fit, or one past the step's sequence cap)."""
        return bool(self.waiting or self.swapped or len(plan.decodes) < self.num_running_seqs)

    def extend(self, plan: StepPlan, projection: DecodeProjection, num_extra_steps: int) -> None:
        """Make a quiet plan stand for ``num_extra_steps`` more decode steps (``decode_span`` said they fit)."""
        decodes = plan.decodes
        seq_ids = [seq.seq_id for seq in decodes]
        if self._ratio_active:
            self.decay_new_token_ratio(num_extra_steps)  # each step of the run is a decode step
        if self._frees_during_decode and self._caches_prefixes:
            # windows give cached blocks back while other sequences take blocks: which cached block
            # a take evicts depends on the order of the steps, so they are appended step by step
            fitted = all(self.allocator.append_each(seq_ids, 1) == len(seq_ids) for _ in range(num_extra_steps))
        else:
            fitted = self.allocator.append_each(seq_ids, num_extra_steps) == len(seq_ids)
        if not fitted:
            raise RuntimeError(f"allocator {self.allocator.name!r} refused a step its projection allowed")
        for seq in decodes:
            seq.num_computed_tokens += num_extra_steps
        plan.num_steps += num_extra_steps
        plan.span_ledgers = {name: values[:num_extra_steps] for name, values in projection.ledgers.items()}
        if self._in_flight_bytes:  # a decode worker's reserved slots (kvbench.sched.roles)
            plan.span_ledgers = self._span_ledgers_in_flight(plan.span_ledgers)
        if plan.page_mapping is not None:  # the steps' pages were projected; the appends mapped them at once
            plan.span_pages_mapped = projection.pages_mapped[:num_extra_steps]
            num_pages = self.allocator.drain_page_mapping().num_pages
            if num_pages != int(np.sum(plan.span_pages_mapped)):
                raise RuntimeError(f"allocator {self.allocator.name!r} mapped other pages than it projected")

    def _note_available_at_start(self) -> None:
        """A step begins: what is free and cached now bounds a projected run (``frees_during_decode``)."""
        self._available_at_start_bytes = _available_bytes(self.allocator.ledger())
