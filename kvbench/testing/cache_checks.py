"""The prefix-cache checks of :class:`kvbench.testing.CachingAllocatorConformance`: evictable blocks
are held by nobody and leave their queue in least-recently-used order, keys are held as the
allocator's policy says, and a host tier's ledger accounts for every byte."""

from __future__ import annotations

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.memory.allocator import Allocator
from kvbench.testing.invariants import block_bytes_of, is_grouped


def key_map(alloc: Allocator) -> dict:
    """Every block's prefix-cache key -> the blocks holding it (the allocator's cache as seen from
    outside): one block, unless the allocator keeps duplicate blocks."""
    num_blocks = alloc.budget_bytes // block_bytes_of(alloc)
    duplicates = alloc.capabilities.caches_duplicate_blocks
    keys: dict = {}
    for block_id in range(num_blocks):
        key = alloc.block_key(block_id)
        if key is not None:
            assert duplicates or key not in keys, f"key {key} is held by blocks {keys[key]} and {block_id}"
            keys.setdefault(key, set()).add(block_id)
    return keys


def cache_queue(alloc: Allocator) -> list[tuple[int, tuple | None]]:
    """The evictable queue with each block's key: what :func:`check_cache` compares against."""
    return [(b, alloc.block_key(b)) for b in alloc.cached_block_ids()]


def check_host_tier(alloc: Allocator) -> None:
    """An allocator with a host tier for evicted prefix blocks (``host_cache``): its ledger
    accounts for every byte of the host budget, it holds no more than its slots, and the tiers are
    exclusive (no key both on the GPU and on host)."""
    host = getattr(alloc, "host_cache", None)
    if host is None:
        return
    led = alloc.host_ledger()
    assert led.total_bytes == led.budget_bytes == int(alloc.config.host_cache_bytes), led
    assert min(getattr(led, field) for field in LEDGER_FIELDS) >= 0, led
    assert len(host) <= host.capacity_blocks
    assert led.cached_bytes == len(host) * block_bytes_of(alloc), "host bytes != resident blocks"
    on_gpu = {alloc.block_key(b) for b in range(alloc.num_blocks)} - {None}
    assert not on_gpu & set(host.keys()), "a key is in both tiers"


def check_cache(
    alloc: Allocator,
    num_tokens: dict[int, int],
    before: list[tuple] | None = None,
    evictions_before: int | None = None,
) -> None:
    """A caching allocator's evictable blocks: held by nobody, each with a key, each once; and when
    ``before`` (:func:`cache_queue` before the last operation) is given, the queue changed in LRU
    order: blocks that left it were taken back by a hit (now held with the same key) or evicted
    (the others: their key was dropped, even if the block was reused at once or is back in the
    queue under another key) from its front, the ones that stayed kept their order, and new ones
    joined at the back. A grouped allocator's window may give a block back within the operation
    that evicted it, even under the same key again (its prefix keyed it anew): with
    ``evictions_before`` (the allocator's ``num_evicted_blocks`` before the operation), up to as many
    kept-key blocks as were evicted meanwhile may be such ones, from the front of those kept."""
    cached = alloc.cached_block_ids()
    assert len(set(cached)) == len(cached), "a block is in the evictable queue twice"
    held = {b for s in num_tokens for b in alloc.block_table(s)}
    for block_id in cached:
        assert block_id not in held, f"evictable block {block_id} is in a block table"
        assert alloc.refcount(block_id) == 0
        assert alloc.block_key(block_id) is not None, f"evictable block {block_id} has no key"
    led = alloc.ledger()
    assert led.cached_bytes == len(cached) * block_bytes_of(alloc)
    check_host_tier(alloc)
    if before is None:
        return
    key_before = dict(before)
    before = [b for b, _ in before]
    # a block back in the queue under another key left it too: it was evicted, reused and given
    # back within the operation (a window group's block in a run of appends or decode steps)
    in_queue = set(cached)
    kept = [b for b in before if b in in_queue and alloc.block_key(b) == key_before[b]]
    requeued = 0
    if is_grouped(alloc) and evictions_before is not None:
        # back under its own key: evicted blocks are older than every one that stayed, so such
        # blocks are the front of the kept ones, and the ones that stayed lead the queue
        evictions = alloc.num_evicted_blocks - evictions_before
        while requeued < min(evictions, len(kept)) and cached[: len(kept) - requeued] != kept[requeued:]:
            requeued += 1
    now = set(kept[requeued:])
    left = [b for b in before if b not in now]
    evicted = [b for b in left if b not in held or alloc.block_key(b) != key_before[b]]
    # hits are taken back before new blocks are taken: the evicted ones are the queue's front once
    # the revived ones are out of it
    remaining = [b for b in before if b not in left or b in evicted]
    assert remaining[: len(evicted)] == evicted, "a block was evicted before a less recently used one"
    stayed = [b for b in before if b in now]
    assert cached[: len(stayed)] == stayed, "the evictable queue lost its order"
