"""The block pool every block-based allocator builds on: which blocks are free, who holds them,
which hold a prefix-cache key, and which cached block is evicted next.

A pool owns ``num_blocks`` blocks of ``block_bytes`` each, named ``0 .. num_blocks - 1``. It knows
nothing of sequences, tokens or block tables: the allocator keeps those, and asks the pool for
blocks, gives them back, shares them and keys them. ``paged``, ``hybrid_paged`` (one pool shared
by all its KV-cache groups) and the host tier (:mod:`kvbench.memory.host_cache`, a pool of host
slots) are built on it.

A block is in exactly one of four states:

- *never used*: counted, not listed (``num_fresh``); handed out 0, 1, 2, ... in order, so memory
  grows with the blocks ever used, not with the budget (a list of every block id of a huge
  budget would cost GBs before the first step);
- *free*: given back with no key, on a stack (``free_block_ids``: last in, first out);
- *held* by one or more holders (block-table entries); only blocks with two or more holders are
  counted (``shared_refs``), so that unshared blocks, the common case, cost no bookkeeping;
- *cached*: held by nobody but keeping its prefix-cache key, on the eviction queue
  (``evictable``), least recently freed first.

:meth:`BlockPool.take` hands out, in this order (what vLLM's pools give, and what every table
and ledger of kvbench depends on): free blocks (last given back first), then never-used ones,
then cached ones from the front of the eviction queue (their key dropped, offloaded to the host
tier when the pool has one and this was the key's last holder).

How cached blocks are kept is the :class:`CachePolicy`: :data:`LRU` (kvbench's default, and
nano-vllm's) keeps one block per key; :data:`VLLM` (vLLM v1's BlockPool, the ``vllm_v1`` engine
preset) keeps duplicates, as vLLM never changes a block id once it is in a block table. Both
evict the least recently freed cached block first; a pool with another eviction order overrides
:meth:`BlockPool._evict_one`.

Using it from an allocator plugin::

    pool = BlockPool(budget_bytes // block_bytes, block_bytes)
    if pool.can_take(num_blocks, keep_free_bytes):      # the watermark kept
        table = pool.take(num_blocks)
    pool.share(table)                                    # a fork: one more holder each
    released = pool.drop_holders(table)                  # a free: one holder fewer each ...
    pool.release(reversed(released))                     # ... and those nobody holds back, tail first

With prefix caching, key a block once its tokens are computed (:meth:`add_key`), look keys up in
:attr:`block_of`, take a hit with :meth:`reference` (an evictable one leaves the queue), and give
keyed blocks back with :meth:`release`: they wait on the eviction queue until taken again.

Attributes named without a leading underscore (``free_block_ids``, ``shared_refs``, ``evictable``,
``block_of``, ``key_of``) are there to be *read* on an allocator's hot paths without a call; they
are changed only through the methods.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CachePolicy:
    """Which blocks hold a key and which cached block goes first."""

    name: str
    #: a block computed with a key another block already holds takes it too, beside it (vLLM's
    #: BlockPool does not de-duplicate); false: it stays private and is freed as an ordinary block
    keep_duplicates: bool = False


#: kvbench's default and nano-vllm's: one block per key, least recently freed evicted first
LRU = CachePolicy("lru")
#: vLLM v1's BlockPool (engine=vllm_v1, ``cache_duplicate_blocks``): duplicate cached blocks are
#: kept; a lookup finds the key's earliest holder still cached, and the key goes with its last
#: holder. Its free queue prepends blocks freed without a hash: here the free stack, taken first.
VLLM = CachePolicy("vllm", keep_duplicates=True)


class EvictionSink(Protocol):
    """Where a pool's evicted keys go (the host tier), and who hears of a key computed again."""

    def offload(self, key: Hashable) -> object: ...

    def discard(self, key: Hashable) -> bool: ...


class BlockPool:
    """``num_blocks`` blocks of ``block_bytes``: free, held (reference counted) or cached (keyed,
    evictable). See the module docstring for how an allocator uses it."""

    def __init__(
        self,
        num_blocks: int,
        block_bytes: int,
        *,
        policy: CachePolicy = LRU,
        host: EvictionSink | None = None,
    ) -> None:
        """``host``: the tier that keeps the keys this pool evicts (None: evicted keys vanish)."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = int(num_blocks)
        self.block_bytes = int(block_bytes)
        self.policy = policy
        self.host = host
        #: blocks given back without a key, taken last in first out
        self.free_block_ids: list[int] = []
        #: blocks never used: ``num_blocks - num_fresh`` is the next one handed out
        self.num_fresh = self.num_blocks
        #: held blocks with two or more holders -> their holders (one holder: not in here)
        self.shared_refs: dict[int, int] = {}
        #: holders beyond the first, summed over the shared blocks: what sharing saves, in blocks
        self.num_extra_refs = 0
        #: cached blocks nobody holds, least recently freed (evicted next) first
        self.evictable: OrderedDict[int, None] = OrderedDict()
        #: key -> the block a lookup finds (with duplicates, the earliest holder still cached)
        self.block_of: dict[Hashable, int] = {}
        #: block -> its key, for every keyed block, held or evictable
        self.key_of: dict[int, Hashable] = {}
        # keep_duplicates: key -> its other holders, in the order they took it (only keys held by
        # two blocks or more, so that a key with one holder costs nothing here)
        self._later_holders: dict[Hashable, dict[int, None]] = {}
        #: cached blocks evicted so far (their keys dropped)
        self.num_evicted_blocks = 0

    # --- counts ------------------------------------------------------------------------------------

    def num_available(self) -> int:
        """Blocks :meth:`take` can hand out: free, never used, and evictable cached ones."""
        return len(self.free_block_ids) + self.num_fresh + len(self.evictable)

    def num_free(self) -> int:
        """Truly free blocks (never used or given back without a key): the ledger's free part."""
        return len(self.free_block_ids) + self.num_fresh

    def num_cached(self) -> int:
        """Evictable blocks keeping a key: the ledger's cached part."""
        return len(self.evictable)

    def num_held(self) -> int:
        """Blocks some holder has: the ledger's allocated part."""
        return self.num_blocks - len(self.free_block_ids) - self.num_fresh - len(self.evictable)

    def can_take(self, num_blocks: int, keep_free_bytes: int = 0) -> bool:
        """Whether ``num_blocks`` can be taken with ``keep_free_bytes`` (a watermark) left available."""
        left = len(self.free_block_ids) + self.num_fresh + len(self.evictable) - num_blocks
        return left >= 0 and left * self.block_bytes >= keep_free_bytes

    def refcount(self, block_id: int) -> int:
        """How many holders ``block_id`` has (0: free, never used or cached). A view for checks,
        not a hot path: a block with one holder is found by elimination."""
        if block_id in self.shared_refs:
            return self.shared_refs[block_id]
        never_used = block_id >= self.num_blocks - self.num_fresh
        return 0 if never_used or block_id in self.evictable or block_id in self.free_block_ids else 1

    def count_evictable(self, block_ids: Iterable[int]) -> int:
        """How many of ``block_ids`` are cached and evictable (a hit on one takes it off the queue)."""
        evictable = self.evictable
        return sum(1 for block_id in block_ids if block_id in evictable)

    def num_shared_blocks(self) -> int:
        """Held blocks with two or more holders."""
        return len(self.shared_refs)

    def cached_block_ids(self) -> list[int]:
        """The evictable cached blocks, evicted next first: a view for checks."""
        return list(self.evictable)

    # --- taking and giving back ----------------------------------------------------------------------

    def take(self, num_blocks: int) -> list[int]:
        """``num_blocks`` blocks (:meth:`can_take` said they exist), each with one holder: blocks
        given back first (last in, first out), then never-used ones, then cached ones evicted."""
        free = self.free_block_ids
        if num_blocks <= len(free):  # the common case once the pool has been used
            if not num_blocks:
                return []
            taken = free[-num_blocks:]
            del free[-num_blocks:]
            taken.reverse()  # pop order: the same blocks one-by-one pops would give
            return taken
        taken = free[::-1]
        free.clear()
        num_new = min(num_blocks - len(taken), self.num_fresh)
        first_fresh = self.num_blocks - self.num_fresh
        taken.extend(range(first_fresh, first_fresh + num_new))
        self.num_fresh -= num_new
        for _ in range(num_blocks - len(taken)):
            taken.append(self._evict_one())
        return taken

    def take_one(self) -> int | None:
        """One block, as :meth:`take` would hand it out, or None when none is available (the
        one-block path, without a list: an allocator of single slots takes one per sequence)."""
        if self.free_block_ids:
            return self.free_block_ids.pop()
        if self.num_fresh:
            self.num_fresh -= 1
            return self.num_blocks - self.num_fresh - 1
        return self._evict_one() if self.evictable else None

    def _evict_one(self) -> int:
        """Evict the cached block the policy gives up first (the least recently freed) and return
        it, keyless; its key goes to the host tier when this was the key's last holder."""
        block_id, _ = self.evictable.popitem(last=False)
        if self.host is not None and self.key_of[block_id] not in self._later_holders:
            self.host.offload(self.key_of[block_id])
        self.drop_key(block_id)
        self.num_evicted_blocks += 1
        return block_id

    def release(self, block_ids: Iterable[int]) -> None:
        """Blocks whose last holder left, in the order given: keyed ones to the back of the
        eviction queue, the others onto the free stack."""
        keyed, evictable, free = self.key_of, self.evictable, self.free_block_ids
        if not keyed:
            free.extend(block_ids)
            return
        for block_id in block_ids:
            if block_id in keyed:
                evictable[block_id] = None
            else:
                free.append(block_id)

    def share(self, block_ids: Iterable[int]) -> None:
        """One more holder for each held block (a block listed twice gains two)."""
        shared = self.shared_refs
        num_added = 0
        for block_id in block_ids:
            shared[block_id] = shared.get(block_id, 1) + 1
            num_added += 1
        self.num_extra_refs += num_added

    def reference(self, block_ids: Iterable[int]) -> int:
        """One more holder for each hit block: an evictable one leaves the queue (held again by
        one). Returns how many were evictable (revived)."""
        shared, evictable = self.shared_refs, self.evictable
        num_revived = 0
        for block_id in block_ids:
            if block_id in evictable:
                del evictable[block_id]
                num_revived += 1
            else:
                shared[block_id] = shared.get(block_id, 1) + 1
                self.num_extra_refs += 1
        return num_revived

    def drop_holders(self, block_ids: Iterable[int]) -> list[int]:
        """One holder fewer for each held block; returns those nobody holds now, in the order
        given, for the caller to :meth:`release` in the order its eviction rule wants."""
        shared = self.shared_refs
        released = []
        for block_id in block_ids:
            holders = shared.get(block_id, 1) - 1
            if holders == 0:
                released.append(block_id)
            else:
                if holders == 1:
                    del shared[block_id]
                else:
                    shared[block_id] = holders
                self.num_extra_refs -= 1
        return released

    def unref(self, block_id: int) -> bool:
        """One holder fewer for one block, released at once when nobody holds it (True then)."""
        holders = self.shared_refs.get(block_id)
        if holders is None:
            if block_id in self.key_of:
                self.evictable[block_id] = None
            else:
                self.free_block_ids.append(block_id)
            return True
        if holders == 2:
            del self.shared_refs[block_id]
        else:
            self.shared_refs[block_id] = holders - 1
        self.num_extra_refs -= 1
        return False

    def discard_cached(self, block_id: int) -> None:
        """Take an evictable block out of the cache: its key is dropped and it is free again."""
        del self.evictable[block_id]
        self.drop_key(block_id)
        self.free_block_ids.append(block_id)

    # --- keys --------------------------------------------------------------------------------------

    def add_key(self, block_id: int, key: Hashable) -> bool:
        """``block_id`` (holding no key) takes ``key`` if no block holds it (the host tier's copy,
        if any, is dropped: the block was computed again), or beside its holders when the policy
        keeps duplicates; otherwise it stays private. True when it took the key."""
        cached = self.block_of
        if key not in cached:
            cached[key] = block_id
            if self.host is not None:
                self.host.discard(key)
        elif self.policy.keep_duplicates:
            self._later_holders.setdefault(key, {})[block_id] = None
        else:
            return False
        self.key_of[block_id] = key
        return True

    def drop_key(self, block_id: int) -> None:
        """``block_id`` forgets its key (if any); with duplicates the next holder in line then
        serves lookups, and the key is gone with its last holder."""
        key = self.key_of.pop(block_id, None)
        if key is None:
            return
        later = self._later_holders.get(key) if self._later_holders else None
        if later is None:
            del self.block_of[key]
            return
        if self.block_of[key] == block_id:
            next_id = next(iter(later))
            del later[next_id]
            self.block_of[key] = next_id
        else:
            del later[block_id]
        if not later:
            del self._later_holders[key]
