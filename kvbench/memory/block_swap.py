"""Swapping a family's blocks out of a :class:`~kvbench.memory.block_pool.BlockPool` and back in,
with the same sharing.

A swap moves every distinct block of the family once, keyed or not (its host copy must be complete
whatever happens on the device meanwhile), as vLLM's swap does. On the device a keyed block is
released as by a free: kept for its other holders, or cached and evictable, so other requests
keep hitting it. Swapped back in, the family gets fresh private blocks; one re-takes its key only
if no other block holds that key by then (a block shared across requests is thus never moved for
another family: each family's swap is its own copy).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from kvbench.memory.block_pool import BlockPool


@dataclass
class SwappedFamily:
    """A family's blocks while it is swapped out: each distinct block is a position."""

    #: per sequence: its block lists (one per table it keeps) as positions
    positions: dict[int, list[list[int]]]
    num_blocks: int
    #: position -> the prefix-cache key its block held
    keys: dict[int, Hashable]
    #: what the allocator keeps beside the blocks (token counts, prompt keys, ...)
    extra: object


def swap_out_blocks(
    pool: BlockPool, block_lists: dict[int, Sequence[list[int]]], free: Callable[[int], None], extra: object = None
) -> SwappedFamily:
    """Number the family's distinct blocks (first seen first), remember their keys, then ``free``
    each sequence of ``block_lists``. Only prefix-cache hits share a block across requests: an
    unkeyed block still held afterwards is a bug, raised as such."""
    numbered: dict[int, int] = {}
    positions = {
        seq_id: [[numbered.setdefault(b, len(numbered)) for b in blocks] for blocks in lists]
        for seq_id, lists in block_lists.items()
    }
    keyed = pool.key_of
    keys = {p: keyed[b] for b, p in numbered.items() if b in keyed}
    for seq_id in block_lists:
        free(seq_id)
    if any(b in pool.shared_refs and b not in keyed for b in numbered):
        raise RuntimeError(f"swap_out of {tuple(block_lists)}: a block is shared with a sequence outside the set")
    return SwappedFamily(positions, len(numbered), keys, extra)


def swap_in_blocks(pool: BlockPool, swapped: SwappedFamily) -> list[int]:
    """Fresh blocks for the family's positions (:meth:`BlockPool.can_take` said they exist), each
    held as often as the family's tables list it; a key nobody took meanwhile serves hits again
    (beside its holders when the pool keeps duplicates)."""
    blocks = pool.take(swapped.num_blocks)
    holders = Counter(p for lists in swapped.positions.values() for positions in lists for p in positions)
    pool.share(blocks[p] for p, n in holders.items() for _ in range(n - 1))
    for p, key in swapped.keys.items():
        pool.add_key(blocks[p], key)
    return blocks
