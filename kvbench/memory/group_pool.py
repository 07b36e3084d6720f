"""A block pool shared by a model's KV-cache groups (``hybrid_paged``): one
:class:`~kvbench.memory.block_pool.BlockPool`, which also knows which group holds each block and
how many each group holds, the ledger's split of held bytes by group kind."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from kvbench.memory.block_pool import BlockPool, EvictionSink
from kvbench.memory.host_cache import HostBlockCache
from kvbench.specs.kv_groups import FULL, WINDOW, KVGroup


class GroupBlockPool(BlockPool):
    """Blocks of one size for every group: :meth:`take_for` a group, :meth:`unref` and
    :meth:`reference` (a hit, a revival) keep each group's held count; blocks taken for several
    groups at once (a swap, a reload) are given theirs with :meth:`assign`."""

    def __init__(
        self, num_blocks: int, block_bytes: int, groups: Sequence[KVGroup], *, host: EvictionSink | None = None
    ) -> None:
        super().__init__(num_blocks, block_bytes, host=host)
        #: every block a group took -> that group (kept while the block is cached, for a revival)
        self.group_of: dict[int, int] = {}
        #: per group, the blocks it holds (a block shared by several sequences once)
        self.held_per_group = [0] * len(groups)
        #: the ledger's per-group parts: (column name, the groups it sums), full then window groups
        self.group_columns = tuple(
            (f"{kind}_group_bytes", tuple(g for g, group in enumerate(groups) if group.kind == kind))
            for kind in (FULL, WINDOW)
            if any(group.kind == kind for group in groups)
        )

    def take_for(self, group: int, num_blocks: int) -> list[int]:
        """:meth:`BlockPool.take`, the blocks held by ``group``."""
        taken = self.take(num_blocks)
        self.assign(taken, [group] * num_blocks)
        return taken

    def assign(self, block_ids: Sequence[int], groups: Iterable[int]) -> None:
        """Newly taken blocks are held by these groups."""
        for block_id, group in zip(block_ids, groups):
            self.group_of[block_id] = group
            self.held_per_group[group] += 1

    def reload(self, host: HostBlockCache, walk: Sequence[tuple[tuple[int, Hashable], int | None]]) -> list[int]:
        """:meth:`HostBlockCache.reload_into` for a walk of ``((group, key), block)``: the reloaded
        blocks are held by their keys' groups (revived ones by theirs again)."""
        blocks = host.reload_into(self, walk)
        new = [(block_id, group) for ((group, _), was), block_id in zip(walk, blocks) if was is None]
        self.assign([block_id for block_id, _ in new], [group for _, group in new])
        return blocks

    def unref(self, block_id: int) -> bool:
        if super().unref(block_id):
            self.held_per_group[self.group_of[block_id]] -= 1
            return True
        return False

    def reference(self, block_ids: Iterable[int]) -> int:
        block_ids = list(block_ids)
        for block_id in block_ids:
            if block_id in self.evictable:  # revived: its group holds it again
                self.held_per_group[self.group_of[block_id]] += 1
        return super().reference(block_ids)

    def group_bytes(self, held_per_group: Sequence[int] | None = None) -> tuple[tuple[str, int], ...]:
        """The ledger's per-group parts: the bytes held by the full groups and by the window groups
        (together, the ledger's allocated bytes), now or for ``held_per_group``."""
        held = self.held_per_group if held_per_group is None else held_per_group
        return tuple((name, sum(held[g] for g in members) * self.block_bytes) for name, members in self.group_columns)
