"""What every allocator built on a :class:`~kvbench.memory.block_pool.BlockPool` answers the same
way: its views of the pool (reference counts, sharing, the prefix cache's eviction queue and keys,
available blocks) and of its host tier. ``paged`` and ``hybrid_paged`` inherit them; an allocator
plugin that sets ``self.pool`` (and ``self.host_cache``, None without a host tier) can too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from kvbench.core.kv import Footprint, Transfer
from kvbench.core.ledger import MemoryLedger
from kvbench.memory.allocator import Allocator
from kvbench.memory.block_pool import BlockPool
from kvbench.memory.host_cache import HostBlockCache


class PooledAllocator(Allocator):
    """An allocator whose blocks are ``self.pool``'s, with ``self.host_cache`` as its host tier."""

    pool: BlockPool
    host_cache: HostBlockCache | None = None

    @property
    def num_evicted_blocks(self) -> int:
        """Blocks evicted from the prefix cache so far (their keys dropped)."""
        return self.pool.num_evicted_blocks

    def refcount(self, block_id: int) -> int:
        """How many live sequences hold ``block_id`` (:meth:`BlockPool.refcount`: a view for checks)."""
        return self.pool.refcount(block_id)

    def num_shared_blocks(self) -> int:
        return self.pool.num_shared_blocks()

    def shared_bytes_saved(self) -> int:
        """O(1): a running count of the holders beyond the first of every shared block."""
        return self.pool.num_extra_refs * self.pool.block_bytes

    def cached_block_ids(self) -> list[int]:
        """The evictable cached blocks, evicted next first: a view for checks."""
        return self.pool.cached_block_ids()

    def block_key(self, block_id: int) -> Hashable | None:
        """The prefix-cache key ``block_id`` holds, or None: a view for checks."""
        return self.pool.key_of.get(block_id)

    def largest_hole_bytes(self) -> int:
        """Any available block serves anyone: truly free and evictable cached ones."""
        return self.pool.num_available() * self.pool.block_bytes

    def footprint(self, seq_ids: Sequence[int]) -> Footprint:
        """Every distinct block of the set is moved by a swap; evicting the set frees those no
        sequence outside it holds."""
        holders = Counter(block_id for seq_id in seq_ids for block_id in self.block_table(seq_id))
        num_held = sum(1 for block_id, n in holders.items() if self.pool.shared_refs.get(block_id, 1) == n)
        block_bytes, num_blocks = self.pool.block_bytes, len(holders)
        return Footprint(num_held * block_bytes, Transfer(num_blocks * block_bytes, num_blocks))

    def host_ledger(self) -> MemoryLedger | None:
        """The host tier's budget at this instant (:meth:`HostBlockCache.ledger`); None without one."""
        return None if self.host_cache is None else self.host_cache.ledger(int(self.config.host_cache_bytes))
