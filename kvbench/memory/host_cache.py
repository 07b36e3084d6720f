"""A host (CPU) tier for prefix-cache blocks evicted from GPU memory: an LRU of block keys.

LMCache, vLLM's KV offloading connector, SGLang's HiCache and Mooncake keep KV blocks that the GPU
cache evicts in host memory and copy them back over the host link (PCIe, or C2C on a Grace
machine) when a later request's prefix needs them again. kvbench keeps only what decides hits and
traffic: which block keys (:data:`kvbench.core.prefix.BlockKey`) are resident in host memory, in
least-recently-used order, within ``capacity_blocks`` host slots of one GPU block's bytes each
(a :class:`~kvbench.memory.block_pool.BlockPool` of host slots: the same pool the GPU tier is).

The tier is *exclusive* (a victim cache): a key lives in the GPU cache or here, never in both. A
block the GPU evicts is written here (a device->host copy); a block reloaded into the GPU leaves
this tier. GPU and host together then hold up to GPU blocks + host blocks distinct keys, the
capacity the offline bounds are computed with. Writes happen as evictions happen (write-back,
as SGLang HiCache's ``write_back`` policy), not when a block is first computed (write-through).

Since any use of a resident key removes it (it is reloaded), the order of insertion is also the
order of last use: evicting the front is LRU. Every operation is O(1).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

from kvbench.core.kv import Transfer
from kvbench.core.ledger import MemoryLedger
from kvbench.core.prefix import BlockKey
from kvbench.errors import ConfigError, require
from kvbench.memory.block_pool import BlockPool


class HostReload(NamedTuple):
    """A reload from the host tier: the host->device copy, and which blocks of the prompt it
    brought back (their indices in the prompt's block order)."""

    transfer: Transfer
    block_indices: tuple[int, ...]
    block_size_tokens: int

    @property
    def num_tokens(self) -> int:
        return len(self.block_indices) * self.block_size_tokens

    def tokens_past(self, position_tokens: int) -> int:
        """Reloaded token positions at or after ``position_tokens`` (a readmitted request's own lost
        positions come first; only reloaded positions past them are prefix hits)."""
        size = self.block_size_tokens
        return sum(max(0, (i + 1) * size - max(i * size, position_tokens)) for i in self.block_indices)


class HostBlockCache:
    """Block keys resident in host memory, least recently evicted from the GPU first: a
    :class:`~kvbench.memory.block_pool.BlockPool` of ``capacity_blocks`` host slots, each holding
    one GPU block's bytes, whose resident keys are its cached blocks (held by nobody, on its
    eviction queue) and whose empty slots are its free blocks. It is the GPU pool's ``host``: the
    GPU pool offloads the keys it evicts here, and discards a key here when it computes it again."""

    def __init__(self, capacity_blocks: int, block_bytes: int = 0) -> None:
        """``block_bytes``: one slot's bytes (one GPU block's), for the host ledger."""
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.capacity_blocks = int(capacity_blocks)
        self.block_bytes = int(block_bytes)
        self._slots = BlockPool(self.capacity_blocks, self.block_bytes)
        #: blocks written to host (device->host copies), over the run
        self.num_offloaded_blocks = 0
        #: blocks taken back to the GPU (host->device copies), over the run
        self.num_reloaded_blocks = 0
        #: keys that left without a copy: the GPU computed the same block again meanwhile
        self.num_discarded_blocks = 0
        #: the most host slots held at once
        self.peak_blocks = 0

    @property
    def num_evicted_blocks(self) -> int:
        """Keys dropped from host memory to make room (their KV is gone from both tiers)."""
        return self._slots.num_evicted_blocks

    def __len__(self) -> int:
        return len(self._slots.evictable)

    def __contains__(self, key: object) -> bool:
        return key in self._slots.block_of

    def keys(self) -> list[BlockKey]:
        """Resident keys, the next to be evicted first (a view for checks)."""
        key_of = self._slots.key_of
        return [key_of[slot] for slot in self._slots.evictable]

    def offload(self, key: BlockKey) -> BlockKey | None:
        """Write a block the GPU evicts: it becomes the most recent; the least recent key is
        evicted first when every slot is taken. Returns the evicted key, if any. With no slot at
        all nothing is written (and nothing counted)."""
        slots = self._slots
        if self.capacity_blocks == 0:
            return None
        if key in slots.block_of:  # exclusive tiers never offload a resident key; stay correct anyway
            slots.evictable.move_to_end(slots.block_of[key])
            return None
        evicted = None
        if not slots.num_free():  # every slot is taken: the least recent key goes
            evicted = slots.key_of[next(iter(slots.evictable))]
        (slot,) = slots.take(1)
        slots.add_key(slot, key)
        slots.release((slot,))  # resident and held by nobody: the back of the LRU queue
        self.num_offloaded_blocks += 1
        if len(slots.evictable) > self.peak_blocks:
            self.peak_blocks = len(slots.evictable)
        return evicted

    def reload(self, key: BlockKey) -> None:
        """Take a resident key back to the GPU (``KeyError`` when it is not resident)."""
        self._slots.discard_cached(self._slots.block_of[key])
        self.num_reloaded_blocks += 1

    def discard(self, key: BlockKey) -> bool:
        """Forget ``key`` if resident (the GPU holds the same block again): True when it was."""
        slot = self._slots.block_of.get(key)
        if slot is None:
            return False
        self._slots.discard_cached(slot)
        self.num_discarded_blocks += 1
        return True

    def reload_into(self, pool: BlockPool, walk: Sequence[tuple[Hashable, int | None]]) -> list[int]:
        """Bring a prefix walk's host-resident keys (block None) back into ``pool``: each leaves
        this tier first (the evictions below may fill it), the walk's GPU blocks gain a holder
        (before new blocks are taken: an eviction must not take one of them), and each host key is
        given a newly taken block. Returns the walk's blocks in order, every one held once more
        (``pool.can_take`` said the new and revived ones fit)."""
        num_reloaded = 0
        for key, block_id in walk:
            if block_id is None:
                self.reload(key)
                num_reloaded += 1
        pool.reference([block_id for _, block_id in walk if block_id is not None])
        new_blocks = iter(pool.take(num_reloaded))
        table = []
        for key, block_id in walk:
            if block_id is None:
                block_id = next(new_blocks)
                pool.add_key(block_id, key)
            table.append(block_id)
        return table

    def ledger(self, budget_bytes: int) -> MemoryLedger:
        """The host budget (``host_cache_bytes``) at this instant, every byte accounted for:
        resident blocks (cached), empty slots (free) and the bytes below one slot (external).
        Nothing on host belongs to a sequence."""
        return MemoryLedger(
            budget_bytes=budget_bytes,
            token_bytes=0,
            reserved_future_bytes=0,
            internal_bytes=0,
            external_bytes=budget_bytes - self.capacity_blocks * self.block_bytes,
            free_bytes=(self.capacity_blocks - len(self)) * self.block_bytes,
            cached_bytes=len(self) * self.block_bytes,
        )


def host_tier(
    host_cache_bytes: float, block_bytes: int, block_size_tokens: int, *, enabled: bool = True
) -> HostBlockCache | None:
    """The host tier ``allocator.host_cache_bytes`` asks for, in slots of ``block_bytes`` (one GPU
    block); None for 0. A tier that holds no block (smaller than one, or ``enabled`` false: no
    prefix cache to feed it) would do nothing: refused in one line."""
    if not host_cache_bytes:
        return None
    num_slots = int(host_cache_bytes) // block_bytes if enabled else 0
    if not num_slots:
        raise ConfigError(
            f"allocator.host_cache_bytes={host_cache_bytes:g} holds no block: one block is "
            f"{block_bytes} bytes ({block_size_tokens} tokens); use 0 (no host tier) or at least {block_bytes}"
        )
    return HostBlockCache(num_slots, block_bytes)


#: how a reload from the host tier is paid for (``allocator.host_reload``)
HOST_RELOAD_MODES = ("overlapped", "blocking")


def validate_host_tier(host_cache_bytes: float, host_reload: str, prefix_caching: bool) -> None:
    """The host tier's options, each refused in one line (:class:`kvbench.errors.ConfigError`)."""
    require(
        isinstance(host_cache_bytes, (int, float))
        and not isinstance(host_cache_bytes, bool)
        and 0 <= host_cache_bytes < 2**63,
        "allocator.host_cache_bytes",
        host_cache_bytes,
        "use a number of bytes >= 0 (0: no host tier)",
    )
    require(
        prefix_caching or not host_cache_bytes,
        "allocator.host_cache_bytes",
        host_cache_bytes,
        "a host tier keeps evicted prefix-cache blocks: use it with allocator.prefix_caching=true, or 0",
    )
    require(
        host_reload in HOST_RELOAD_MODES,
        "allocator.host_reload",
        host_reload,
        f"choose one of {', '.join(HOST_RELOAD_MODES)}",
    )
