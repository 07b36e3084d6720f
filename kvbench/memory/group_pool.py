"""A block pool shared by a model's KV-cache groups (``hybrid_paged``): one
:class:`~kvbench.memory.block_pool.BlockPool` that also counts the blocks held per part of the
ledger's split by group kind (full groups, window groups).

The group of a block is the caller's to say (it is the table the block is in), so a block costs
no bookkeeping of its own: a sequence nobody shares with takes and gives back its blocks as list
slices, the counts move by the slice's length.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from kvbench.memory.block_pool import BlockPool, EvictionSink
from kvbench.memory.host_cache import HostBlockCache
from kvbench.specs.kv_groups import FULL, WINDOW, KVGroup


class GroupBlockPool(BlockPool):
    """Blocks of one size for every group: take them :meth:`take_for` a group, give them back with
    :meth:`release_for` (one) or :meth:`release_all_for` (a table's), hit them with
    :meth:`reference_for`; ``held_per_column`` follows."""

    def __init__(
        self, num_blocks: int, block_bytes: int, groups: Sequence[KVGroup], *, host: EvictionSink | None = None
    ) -> None:
        super().__init__(num_blocks, block_bytes, host=host)
        #: the ledger's per-group parts: (column name, the groups it sums), full then window groups
        self.group_columns = tuple(
            (f"{kind}_group_bytes", tuple(g for g, group in enumerate(groups) if group.kind == kind))
            for kind in (FULL, WINDOW)
            if any(group.kind == kind for group in groups)
        )
        #: per group, its part of the ledger
        self.column_of = tuple(
            next(c for c, (_, members) in enumerate(self.group_columns) if g in members) for g in range(len(groups))
        )
        #: per part, the blocks its groups hold (a block shared by several sequences once)
        self.held_per_column = [0] * len(self.group_columns)

    def take_for(self, group: int, num_blocks: int) -> list[int]:
        """:meth:`BlockPool.take` for ``group``."""
        self.held_per_column[self.column_of[group]] += num_blocks
        return self.take(num_blocks)

    def release_for(self, block_id: int, group: int) -> None:
        """One holder fewer (:meth:`BlockPool.unref`); a block nobody holds leaves ``group``."""
        if self.unref(block_id):
            self.held_per_column[self.column_of[group]] -= 1

    def release_all_for(self, block_ids: list[int], group: int) -> None:
        """:meth:`release_for` of each in the order given; with nothing shared or keyed, as one slice."""
        if self.shared_refs or self.key_of:
            for block_id in block_ids:
                self.release_for(block_id, group)
        else:
            self.free_block_ids.extend(block_ids)
            self.held_per_column[self.column_of[group]] -= len(block_ids)

    def reference_for(self, block_id: int, group: int) -> None:
        """One more holder for a hit block: an evictable one is held again, by ``group``."""
        if self.reference((block_id,)):
            self.held_per_column[self.column_of[group]] += 1

    def reload(self, host: HostBlockCache, walk: Sequence[tuple[tuple[int, Hashable], int | None]]) -> list[int]:
        """:meth:`HostBlockCache.reload_into` for a walk of ``((group, key), block)``: the walk's
        revived and reloaded blocks are held by their keys' groups."""
        column_of, held = self.column_of, self.held_per_column
        for (group, _), block_id in walk:
            if block_id is None or block_id in self.evictable:
                held[column_of[group]] += 1
        return host.reload_into(self, walk)

    def group_bytes(self, held_per_column: Sequence[int] | None = None) -> tuple[tuple[str, int], ...]:
        """The ledger's per-group parts: the bytes held by the full groups and by the window groups
        (together, the ledger's allocated bytes), now or for ``held_per_column``."""
        held = self.held_per_column if held_per_column is None else held_per_column
        return tuple((name, count * self.block_bytes) for (name, _), count in zip(self.group_columns, held))
