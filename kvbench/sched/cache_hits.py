"""Prefix-cache hits, and their undo (allocators that ``caches_prefixes``).

Before a request's first allocation the scheduler asks how many leading tokens the cache holds
(:meth:`CacheHitsMixin._cache_hit`); the sequence starts with that many computed, the allocation
covers them plus the chunk computed now, and the step (and the prompt-token budget) is charged
only for the uncached tokens. The positions served are counted when the allocation is made
(:meth:`CacheHitsMixin._count_hit`): those a recompute preemption lost come back without being
computed again, the rest are prompt positions never computed. An admission that is then refused
(a fan-out whose branches did not fit) takes its count back (:meth:`CacheHitsMixin._undo_hit`).
"""

from __future__ import annotations

from kvbench.core.sequence import SequenceGroup


class CacheHitsMixin:
    """The :class:`~kvbench.sched.scheduler.Scheduler`'s prefix-cache hits (``_admission_hit`` is
    the hit counted by the admission in progress)."""

    def _cache_hit(self, group: SequenceGroup, num_tokens: int) -> int:
        """Leading tokens of a sequence of ``num_tokens`` the prefix cache would serve if it were
        allocated now (never all of them: one is computed, for its logits)."""
        if not group.request.prefix_hashes and not self.allocator.capabilities.caches_own_blocks:
            return 0
        return self.allocator.num_cached_tokens(group.shape(num_tokens))

    def _count_hit(self, group: SequenceGroup, cached: int) -> None:
        """Positions served from the cache: those a recompute preemption lost come back without
        being computed again (not hits), the rest are prompt positions never computed (hits)."""
        restored = min(cached, group.num_lost_tokens)
        group.num_lost_tokens -= restored
        group.num_recomputed_tokens -= restored
        group.recompute_cached_tokens += restored
        group.cached_prompt_tokens += cached - restored
        self._admission_hit = (group, restored, cached - restored)

    def _undo_hit(self, group: SequenceGroup, restored: int, new: int) -> None:
        group.num_lost_tokens += restored
        group.num_recomputed_tokens += restored
        group.recompute_cached_tokens -= restored
        group.cached_prompt_tokens -= new
        self._admission_hit = None
