"""Conformance suite for allocator plugins: every allocator, built-in or third-party, must pass it.

Subclass :class:`AllocatorConformance` in a test module and override the ``allocator_factory``
fixture (parametrize it to test several configs)::

    from kvbench.testing import AllocatorConformance

    class TestMyAllocator(AllocatorConformance):
        @pytest.fixture(params=[8, 64])
        def allocator_factory(self, request):
            return lambda budget_bytes, kv_bytes_per_token: MyAllocator(
                MyConfig(block_size_tokens=request.param),
                budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token)

The random-operations test drives the allocator like a scheduler would (admissions of fan-out
families, appends of one or many tokens, forks into reserved branches and over existing ones,
frees, swaps out and in, decode projections) and checks after every operation: the ledger sums
to the budget, block tables of live sequences overlap only in blocks whose reference count says
they are shared, a refusal changes nothing, a projection equals the steps taken one by one, and
freeing everything gives back exactly the empty cache. :func:`run_operations` and
:func:`check_invariants` can be used without pytest classes too. Needs pytest and hypothesis.

An allocator with KV-cache groups (sliding-window layers: it has ``kv_groups``, ``page_bytes`` and
``group_block_tables``, as ``hybrid_paged``) is checked group by group: each group's table ends at
the sequence's last block, a window group never holds a block wholly outside its window, and a
block is ``page_bytes`` (one group's block) instead of ``block_size_tokens * kv_bytes_per_token``.

Allocators with a prefix cache (``caches_prefixes``) subclass :class:`CachingAllocatorConformance`
instead: the same random operations, with requests drawn from a small pool of shared prefixes and
sometimes allocated a first chunk at a time, and on top: every hit is the longest run of cached
keys, in whole blocks, never more than ``prompt - 1`` tokens, and what ``num_cached_tokens`` said;
hit blocks carry the prompt's keys; evictable blocks are held by nobody and leave their queue in
least-recently-used order (taken back by a hit, or evicted from the front); freeing everything
leaves blocks free or cached, none lost, and every cached block can still be taken.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.core.ledger import LEDGER_FIELDS, MemoryLedger
from kvbench.core.prefix import block_keys
from kvbench.memory.allocator import Allocator, Refusal, SeqShape

#: (budget_bytes, kv_bytes_per_token) -> a fresh allocator
AllocatorFactory = Callable[[int, int], Allocator]

#: a mid-sized request whose reservation decides what the ledger calls externally fragmented
PROBE_SHAPE = SeqShape(num_tokens=8, s_max_tokens=96, final_kv_tokens=60)

# One operation:
#   ("allocate", prompt_tokens, output_tokens, extra_declared_tokens, keep_free_fraction, num_branches)
#   ("append", which_seq, num_tokens, tokens_per_call)     ("fork", which_seq, child_extra_tokens or None)
#   ("free", which_seq)   ("swap_out", which_seq)   ("swap_in", which_family, keep_free_fraction)
#   ("project", max_steps)   ("truncate", which_seq, tokens_to_append_then_take_back)
#   ("append_each", first_seq, num_tokens): every live sequence from ``first_seq`` on, wrapping round
# (max_steps up to 120: the paged allocator computes short projections in plain integers, longer
# ones in arrays; both are checked against the steps taken one by one)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(
            st.just("allocate"),
            st.integers(1, 160),
            st.integers(1, 160),
            st.integers(0, 64),
            st.sampled_from([0.0, 0.0, 0.05, 0.5]),
            st.sampled_from([1, 1, 1, 2, 3]),
        ),
        st.tuples(st.just("append"), st.integers(0, 31), st.integers(1, 40), st.sampled_from([1, 7, 40])),
        st.tuples(st.just("append_each"), st.integers(0, 31), st.sampled_from([1, 3, 16, 40])),
        st.tuples(st.just("fork"), st.integers(0, 31), st.one_of(st.none(), st.integers(0, 80))),
        st.tuples(st.just("free"), st.integers(0, 31)),
        st.tuples(st.just("swap_out"), st.integers(0, 31)),
        st.tuples(st.just("swap_in"), st.integers(0, 31), st.sampled_from([0.0, 0.05])),
        st.tuples(st.just("project"), st.integers(1, 120)),
        st.tuples(st.just("truncate"), st.integers(0, 31), st.integers(1, 20)),
    ),
    min_size=10,  # hypothesis favours tiny lists; short runs never reach a full cache
    max_size=50,
)

# For caching allocators, allocations also draw a prefix from the pool (index into the example's
# ``shared_granules``) and the fraction of the prompt allocated first (the rest is appended, as a
# scheduler computes a prompt in chunks):
#   ("allocate", prompt_tokens, output_tokens, extra, keep_free_fraction, num_branches, prefix, first_fraction)
CACHING_OPERATIONS = st.lists(
    st.one_of(
        *[
            st.tuples(
                st.just("allocate"),
                st.one_of(st.integers(1, 160), st.sampled_from([33, 64, 100])),
                st.integers(1, 160),
                st.integers(0, 64),
                st.sampled_from([0.0, 0.0, 0.05, 0.5]),
                st.sampled_from([1, 1, 1, 2]),
                st.integers(0, 3),
                st.sampled_from([1.0, 1.0, 0.3]),
            )
        ]
        * 2,
        st.tuples(st.just("append"), st.integers(0, 31), st.integers(1, 40), st.sampled_from([1, 7, 40])),
        st.tuples(st.just("append_each"), st.integers(0, 31), st.sampled_from([1, 3, 16, 40])),
        st.tuples(st.just("fork"), st.integers(0, 31), st.one_of(st.none(), st.integers(0, 80))),
        st.tuples(st.just("free"), st.integers(0, 31)),
        st.tuples(st.just("free"), st.integers(0, 31)),
        st.tuples(st.just("swap_out"), st.integers(0, 31)),
        st.tuples(st.just("swap_in"), st.integers(0, 31), st.sampled_from([0.0, 0.05])),
        st.tuples(st.just("project"), st.integers(1, 120)),
        st.tuples(st.just("truncate"), st.integers(0, 31), st.integers(1, 20)),
    ),
    min_size=10,
    max_size=60,
)


def prefix_hashes(
    prompt_tokens: int, granule_tokens: int, shared_granules: int, prefix: int, request: int
) -> tuple[int, ...]:
    """Chained ids of a prompt whose first ``shared_granules`` granules are prefix ``prefix``'s
    (the same for every request drawing it) and the rest the request's own."""
    num_granules = -(-prompt_tokens // granule_tokens)
    return tuple(
        (prefix + 1) * 100_000 + g if g < shared_granules else -(request * 100_000 + g) - 1 for g in range(num_granules)
    )


def check_ledger(alloc: Allocator, next_shape: SeqShape | None = None) -> MemoryLedger:
    """The ledger is non-negative everywhere and its parts sum to the budget; its split by KV-cache
    group (a model with several) is non-negative and sums to its allocated bytes."""
    led = alloc.ledger(next_shape)
    assert led.budget_bytes == alloc.budget_bytes
    for field in LEDGER_FIELDS:
        assert getattr(led, field) >= 0, (field, led)
    assert led.total_bytes == alloc.budget_bytes, led
    if led.group_bytes:
        assert all(value >= 0 for _, value in led.group_bytes), led
        assert sum(value for _, value in led.group_bytes) == led.allocated_bytes, led
    return led


def _grouped(alloc: Allocator) -> bool:
    """Whether ``alloc`` keeps one block table per KV-cache group (a model with window layers)."""
    return hasattr(alloc, "group_block_tables")


def _block_bytes(alloc: Allocator) -> int:
    return alloc.page_bytes if _grouped(alloc) else alloc.block_size_tokens * alloc.kv_bytes_per_token


def check_group_invariants(alloc: Allocator, num_tokens: dict[int, int], final_tokens: dict[int, int]) -> None:
    """A grouped allocator: per sequence and group, the table ends at the last block, starts at
    block 0 (full group) or no earlier than the window's first block, holds each block once; a
    block is in one group only; refcounts are holders; the ledger's allocated bytes are the distinct
    blocks held, its token bytes between the largest sequence's held slots and all of them."""
    led = check_ledger(alloc)
    check_ledger(alloc, PROBE_SHAPE)
    size, page, slot = alloc.block_size_tokens, alloc.page_bytes, alloc.page_bytes // alloc.block_size_tokens
    holders: Counter[int] = Counter()
    group_of: dict[int, int] = {}
    held_slots = {}
    for seq_id, n in num_tokens.items():
        assert alloc.num_tokens(seq_id) == n
        tables = alloc.group_block_tables(seq_id)
        assert len(tables) == len(alloc.kv_groups)
        slots = 0
        for g, (group, (first, blocks)) in enumerate(zip(alloc.kv_groups, tables)):
            assert len(set(blocks)) == len(blocks), "a block appears twice in one table"
            if blocks:
                assert first + len(blocks) == -(-n // size), "a group's table does not end at the last block"
            if group.window_tokens:
                assert first >= max(0, n - group.window_tokens) // size, "a block outside the window is held"
            else:
                assert first == 0 and len(blocks) * size >= n, "a full group's table is too short"
            for block_id in blocks:
                assert group_of.setdefault(block_id, g) == g, f"block {block_id} is in two groups"
            slots += sum(min(size, n - index * size) for index in range(first, first + len(blocks)))
            holders.update(blocks)
        held_slots[seq_id] = slots
        assert alloc.block_table(seq_id) == [b for _, blocks in tables for b in blocks]
    for block_id, num_holders in holders.items():
        assert block_id >= 0 and alloc.refcount(block_id) == num_holders, f"block {block_id}: refcount != holders"
    assert len(holders) * page == led.allocated_bytes
    per_group = Counter(group_of.values())
    assert alloc.group_bytes() == [per_group[g] * page for g in range(len(alloc.kv_groups))], (
        "group bytes != held blocks"
    )
    by_kind = Counter()
    for g, group in enumerate(alloc.kv_groups):
        by_kind[f"{group.kind}_group_bytes"] += per_group[g] * page
    assert dict(led.group_bytes) == dict(by_kind), "the ledger's group split != each kind's held blocks"
    assert alloc.shared_bytes_saved() == sum(n - 1 for n in holders.values()) * page
    assert alloc.num_shared_blocks() == sum(n > 1 for n in holders.values())
    assert max(held_slots.values(), default=0) * slot <= led.token_bytes <= sum(held_slots.values()) * slot
    future = sum(max(0, final_tokens[s] - n) for s, n in num_tokens.items()) * len(alloc.kv_groups)
    assert led.reserved_future_bytes <= future * slot


def check_invariants(
    alloc: Allocator,
    num_tokens: dict[int, int],
    final_tokens: dict[int, int],
    tables_cover_allocation: bool = True,
) -> None:
    """Check ``alloc`` against the scheduler's view: ``num_tokens``/``final_tokens`` of each live
    sequence. ``tables_cover_allocation``: every allocated slot is in some block table (false while
    a contiguous family still holds ranges reserved for branches it has not forked)."""
    if _grouped(alloc):
        check_group_invariants(alloc, num_tokens, final_tokens)
        return
    led = check_ledger(alloc)
    check_ledger(alloc, PROBE_SHAPE)
    kv_bytes = alloc.kv_bytes_per_token
    caps = alloc.capabilities
    holders: Counter[int] = Counter()
    for seq_id, expected_tokens in num_tokens.items():
        assert alloc.num_tokens(seq_id) == expected_tokens
        table = alloc.block_table(seq_id)
        assert len(table) * alloc.block_size_tokens >= expected_tokens, "block table too short"
        assert len(set(table)) == len(table), "a block appears twice in one table"
        if caps.contiguous_layout and table:  # kernels read such a sequence as one contiguous range
            assert table == list(range(table[0], table[0] + len(table))), "contiguous table has gaps"
        holders.update(table)
    for block_id, num_holders in holders.items():
        assert block_id >= 0
        if caps.shares_blocks:
            assert alloc.refcount(block_id) == num_holders, f"block {block_id}: refcount != holders"
        else:
            assert num_holders == 1, f"block {block_id} is in {num_holders} tables"
    if tables_cover_allocation:
        assert len(holders) * alloc.block_size_tokens * kv_bytes == led.allocated_bytes
    # what sharing saves: every table entry beyond a block's first holder, counted once per holder
    block_bytes = alloc.block_size_tokens * kv_bytes
    extra_holders = sum(n - 1 for n in holders.values())
    assert alloc.shared_bytes_saved() == extra_holders * block_bytes, "shared_bytes_saved != extra holders"
    assert alloc.num_shared_blocks() == sum(n > 1 for n in holders.values()), "num_shared_blocks != shared"
    total_tokens = sum(num_tokens.values())
    if caps.shares_blocks:  # shared blocks count once
        assert max(num_tokens.values(), default=0) * kv_bytes <= led.token_bytes <= total_tokens * kv_bytes
    else:
        assert led.token_bytes == total_tokens * kv_bytes
    if tables_cover_allocation:
        future_tokens = sum(max(0, final_tokens[s] - n) for s, n in num_tokens.items())
        assert led.reserved_future_bytes <= future_tokens * kv_bytes


def _snapshot(alloc: Allocator, seq_ids: list[int]) -> tuple:
    return (
        alloc.ledger(),
        alloc.ledger(PROBE_SHAPE),
        alloc.refusal_reason(PROBE_SHAPE),
        [(alloc.num_tokens(s), alloc.block_table(s)) for s in seq_ids],
        alloc.cached_block_ids() if alloc.capabilities.caches_prefixes else None,
    )


def _key_map(alloc: Allocator) -> dict:
    """Every block's prefix-cache key -> the blocks holding it (the allocator's cache as seen from
    outside): one block, unless the allocator keeps duplicate blocks."""
    num_blocks = alloc.budget_bytes // _block_bytes(alloc)
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
    assert led.cached_bytes == len(host) * _block_bytes(alloc), "host bytes != resident blocks"
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
    assert led.cached_bytes == len(cached) * _block_bytes(alloc)
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
    if _grouped(alloc) and evictions_before is not None:
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


def run_operations(
    alloc: Allocator, operations: list[tuple], granule_tokens: int = 8, shared_granules: tuple[int, ...] = (0, 1, 4, 40)
) -> None:
    """Apply ``operations`` (see :data:`OPERATIONS`, :data:`CACHING_OPERATIONS`) as a scheduler
    would, checking after each one, then free everything and check that the cache is exactly as it
    was when empty (a caching allocator: that nothing is held and every block is free or cached).
    ``granule_tokens`` and ``shared_granules`` (tokens per hash granule, and how many granules
    each prefix of the pool shares) shape the prompts of caching operations."""
    caching = alloc.capabilities.caches_prefixes
    empty = _snapshot(alloc, [])
    led = check_ledger(alloc)
    assert led.token_bytes == led.reserved_future_bytes == led.internal_bytes == 0, led
    model = _Model()
    model.granule_tokens, model.shared_granules = granule_tokens, shared_granules
    for op in operations:
        queue_before = cache_queue(alloc) if caching else None
        evictions_before = getattr(alloc, "num_evicted_blocks", None)
        _apply(alloc, model, op)
        check_invariants(alloc, model.num_tokens, model.final, not model.spares_outstanding())
        if caching:
            check_cache(alloc, model.num_tokens, queue_before, evictions_before)
    for seq_id in model.live():
        alloc.free(seq_id)
    for members in model.swapped.values():  # each family fitted once, so it fits an empty cache
        seq_ids = [s for s, _, _ in members]
        assert alloc.swap_in(seq_ids) is not None, "a swapped family cannot come back into an empty cache"
        for seq_id in seq_ids:
            alloc.free(seq_id)
    if not caching:
        assert _snapshot(alloc, []) == empty, "freeing everything did not give back the empty cache"
        return
    check_cache(alloc, {})
    led = check_ledger(alloc)
    assert led.allocated_bytes == 0, "freeing everything left blocks held"
    assert led.free_bytes + led.cached_bytes == empty[0].free_bytes, "a block was lost: free + cached != all"
    if _grouped(alloc):
        # the cached blocks are not lost: one-token sequences (a block in every group each) take
        # them all but fewer than one sequence's blocks
        num_groups, seq_id = len(alloc.kv_groups), -1
        while alloc.allocate(seq_id, SeqShape(1, 2, 1)) is not None:
            seq_id -= 1
        led = alloc.ledger()
        assert led.free_bytes + led.cached_bytes < num_groups * alloc.page_bytes, "cached blocks could not be taken"
        for taken in range(-1, seq_id, -1):
            alloc.free(taken)
        return
    # the cached blocks are not lost: one request as large as the pool takes every one of them
    everything = SeqShape(
        led.free_bytes // alloc.kv_bytes_per_token + led.cached_bytes // alloc.kv_bytes_per_token, alloc.budget_bytes, 1
    )
    if everything.num_tokens:
        assert alloc.allocate(-1, everything) == 0, "cached blocks could not be taken"
        assert alloc.cached_block_ids() == [] and alloc.ledger().free_bytes == 0
        alloc.free(-1)
    assert _snapshot(alloc, []) == empty, "freeing everything did not give back the empty cache"


class _Model:
    """What a scheduler knows about the sequences it handed the allocator."""

    def __init__(self) -> None:
        self.num_tokens: dict[int, int] = {}
        self.final: dict[int, int] = {}
        self.family: dict[int, int] = {}  # seq -> its family's first sequence
        self.branches_left: dict[int, int] = {}  # family -> reserved branches not yet forked into
        self.swapped: dict[int, list[tuple[int, int, int]]] = {}  # family -> [(seq, tokens, final)]
        self.next_seq_id = 0

    def live(self) -> list[int]:
        return sorted(self.num_tokens)

    def members(self, family: int) -> list[int]:
        return [s for s in self.live() if self.family[s] == family]

    def add(self, seq_id: int, tokens: int, final: int, family: int) -> None:
        self.num_tokens[seq_id], self.final[seq_id], self.family[seq_id] = tokens, final, family

    def remove(self, seq_id: int) -> None:
        del self.num_tokens[seq_id], self.final[seq_id]

    def spares_outstanding(self) -> bool:
        return any(self.branches_left.get(f, 0) for f in set(self.family[s] for s in self.live()))


def _apply(alloc: Allocator, model: _Model, op: tuple) -> None:
    live = model.live()
    kind = op[0]
    if kind == "allocate":
        _, prompt, output, extra, keep_fraction, branches, *caching = op
        shape = SeqShape(prompt, prompt + output + extra, prompt + output - 1, branches)
        if not alloc.fits_in_empty(shape):
            return  # the engine rejects such a request up front
        if caching:
            prefix, first_fraction = caching
            hashes = prefix_hashes(
                prompt, model.granule_tokens, model.shared_granules[prefix], prefix, model.next_seq_id
            )
            first = max(1, int(first_fraction * prompt))
            shape = shape._replace(
                num_tokens=first, prompt_tokens=prompt, prefix_hashes=hashes, hash_block_tokens=model.granule_tokens
            )
            keys_before = _key_map(alloc) if alloc.capabilities.caches_prefixes else {}
        keep_free_bytes = int(keep_fraction * alloc.budget_bytes)
        before = _snapshot(alloc, live)
        said = alloc.num_cached_tokens(shape)
        assert _snapshot(alloc, live) == before, "num_cached_tokens changed something"
        cached = alloc.allocate(model.next_seq_id, shape, keep_free_bytes)
        if cached is None:
            assert _snapshot(alloc, live) == before, "a refused allocate changed something"
            assert isinstance(alloc.refusal_reason(shape, keep_free_bytes), Refusal)
            return
        assert cached == said, "allocate served another number of cached tokens than num_cached_tokens said"
        if not alloc.capabilities.caches_prefixes:
            assert cached == 0
        elif caching:
            _check_hit(alloc, model.next_seq_id, shape, cached, keys_before)
        else:
            assert cached == 0, "a request without prefix hashes hit the cache"
        seq_id = model.next_seq_id
        model.add(seq_id, shape.num_tokens, shape.final_kv_tokens, seq_id)
        model.branches_left[seq_id] = branches - 1
        model.next_seq_id += 1
        return
    if kind == "swap_in":
        if not model.swapped:
            return
        family = sorted(model.swapped)[op[1] % len(model.swapped)]
        members = model.swapped[family]
        before = _snapshot(alloc, live)
        transfer = alloc.swap_in([s for s, _, _ in members], int(op[2] * alloc.budget_bytes))
        if transfer is None:
            assert _snapshot(alloc, live) == before, "a refused swap_in changed something"
            return
        for seq_id, tokens, final in members:
            model.add(seq_id, tokens, final, family)
        del model.swapped[family]
        return
    if kind == "project":
        _project(alloc, model, op[1])
        return
    if not live:
        return
    if kind == "append_each":
        _append_each(alloc, model, live[op[1] % len(live) :] + live[: op[1] % len(live)], op[2])
        return
    seq_id = live[op[1] % len(live)]
    if kind == "append":
        _, _, total, per_call = op
        while total > 0:
            n = min(per_call, total)
            before = (alloc.ledger(), alloc.ledger(PROBE_SHAPE), alloc.block_table(seq_id))
            if not alloc.append(seq_id, n):
                after = (alloc.ledger(), alloc.ledger(PROBE_SHAPE), alloc.block_table(seq_id))
                assert after == before, "a refused append changed something"
                break
            model.num_tokens[seq_id] += n
            total -= n
        alloc.drain_copies()
    elif kind == "fork":
        _fork(alloc, model, seq_id, op[2])
    elif kind == "truncate":  # growth taken and given back (a request preempted halfway through a step)
        tokens = model.num_tokens[seq_id]
        before = (alloc.ledger(), alloc.ledger(PROBE_SHAPE), alloc.block_table(seq_id))
        queue = alloc.cached_block_ids() if alloc.capabilities.caches_prefixes else None
        if alloc.append(seq_id, op[2]):
            alloc.drain_copies()
            alloc.truncate(seq_id, tokens)
            # no copy-on-write in between (and no cached block evicted or key given): exactly as before
            if before[2] == alloc.block_table(seq_id) and (queue is None or queue == alloc.cached_block_ids()):
                assert (alloc.ledger(), alloc.ledger(PROBE_SHAPE)) == before[:2], "truncate did not undo an append"
    elif kind == "free":
        alloc.free(seq_id)
        model.remove(seq_id)
        model.branches_left[seq_id] = 0  # a family's unforked branches go with its first sequence
        with pytest.raises(KeyError):
            alloc.free(seq_id)  # a second free is a bug, reported loudly
    elif kind == "swap_out" and alloc.capabilities.can_swap:
        family = model.family[seq_id]
        members = model.members(family)
        footprint = alloc.footprint(members)
        transfer = alloc.swap_out(members)
        assert transfer == footprint.transfer
        model.swapped[family] = [(s, model.num_tokens[s], model.final[s]) for s in members]
        for s in members:
            model.remove(s)


def _append_each(alloc: Allocator, model: _Model, seq_ids: list[int], num_tokens: int) -> None:
    """``append_each`` (a run of decode steps advancing the batch) leaves the allocator exactly as
    the appends one by one do on a copy of it, and fits as many of the sequences."""
    twin = copy.deepcopy(alloc)
    expected = 0
    for seq_id in seq_ids:
        if not twin.append(seq_id, num_tokens):
            break
        expected += 1
    done = alloc.append_each(seq_ids, num_tokens)
    assert done == expected, f"append_each fitted {done} of {len(seq_ids)} sequences, the appends {expected}"
    live = model.live()
    assert _snapshot(alloc, live) == _snapshot(twin, live), "append_each left another state than the appends"
    assert alloc.drain_copies() == twin.drain_copies(), "append_each made other copies than the appends"
    for seq_id in seq_ids[:done]:
        model.num_tokens[seq_id] += num_tokens


def _check_hit(alloc: Allocator, seq_id: int, shape: SeqShape, cached: int, keys_before: dict) -> None:
    """The hit is the longest run of the prompt's keys cached before the allocation, in whole
    blocks, never the whole prompt (one token is computed for its logits)."""
    size = alloc.block_size_tokens
    assert 0 <= cached < max(min(shape.prompt_tokens, shape.num_tokens), 1), (cached, shape)
    assert cached % size == 0, "a hit is not a whole number of blocks"
    keys = block_keys(shape.prompt_tokens, shape.prefix_hashes, shape.hash_block_tokens, size)
    num_hits = cached // size
    if _grouped(alloc):  # every group's hit blocks are its cached ones, keyed (group, prefix key)
        for g, (first, blocks) in enumerate(alloc.group_block_tables(seq_id)):
            hit = [(g, key) for key in keys[first:num_hits]]
            assert [{b} for b in blocks[: len(hit)]] == [keys_before.get(k) for k in hit], (
                "hit blocks are not the cached ones"
            )
            assert [alloc.block_key(b) for b in blocks[: len(hit)]] == hit
        return
    table = alloc.block_table(seq_id)
    # a hit block held its key before (as one of its holders, where the allocator keeps duplicates)
    assert len(table) >= num_hits and all(b in keys_before.get(k, ()) for k, b in zip(keys[:num_hits], table)), (
        "hit blocks are not the cached ones"
    )
    assert [alloc.block_key(b) for b in table[:num_hits]] == keys[:num_hits]
    max_blocks = min(shape.prompt_tokens, shape.num_tokens - 1) // size
    if num_hits < min(max_blocks, len(keys)):
        assert keys[num_hits] not in keys_before, "a cached block of the prefix was not reused"


def _fork(alloc: Allocator, model: _Model, parent_id: int, child_extra: int | None) -> None:
    family = model.family[parent_id]
    child_final = None if child_extra is None else model.num_tokens[parent_id] + child_extra
    if model.branches_left.get(family, 0) > 0 and family in model.num_tokens:
        child_id = model.next_seq_id
        model.next_seq_id += 1
        model.branches_left[family] -= 1
    else:  # fork over an existing member of the family (a beam replaced by a copy of another)
        others = [s for s in model.members(family) if s != parent_id]
        if not others:
            return
        child_id = others[0]
    parent_before = (alloc.num_tokens(parent_id), alloc.block_table(parent_id))
    alloc.fork(parent_id, child_id, child_final)
    copies = alloc.drain_copies()
    assert all(copy.num_bytes > 0 for copy in copies)
    assert (alloc.num_tokens(parent_id), alloc.block_table(parent_id)) == parent_before, "fork changed the parent"
    final = model.final[parent_id] if child_final is None else child_final
    if child_id in model.num_tokens:
        model.remove(child_id)
    model.add(child_id, model.num_tokens[parent_id], final, family)


def _project(alloc: Allocator, model: _Model, max_steps: int) -> None:
    """A projection equals the decode steps taken one by one, and stops where a step would not go through."""
    seq_ids = [s for s in model.live() if model.num_tokens[s] < model.final[s]]
    if not seq_ids:
        return
    max_steps = min(max_steps, min(model.final[s] - model.num_tokens[s] for s in seq_ids))
    projection = alloc.project_decode(seq_ids, max_steps, PROBE_SHAPE)
    assert 0 <= projection.num_steps <= max_steps
    if not alloc.capabilities.projects_decode:
        assert projection.num_steps == 0
        return
    for step in range(projection.num_steps):
        for seq_id in seq_ids:
            assert alloc.append(seq_id, 1), "a projected step was refused"
            model.num_tokens[seq_id] += 1
        assert not alloc.drain_copies(), "a projected step made a copy"
        led = alloc.ledger(PROBE_SHAPE)
        for field in LEDGER_FIELDS:
            assert projection.ledgers[field][step] == getattr(led, field), (field, step)
    if projection.num_steps < max_steps:  # exact: the next step needs a refusal or a copy, or changes sharing
        went_through = True
        saved_bytes = alloc.shared_bytes_saved()
        for seq_id in seq_ids:
            if not alloc.append(seq_id, 1):
                went_through = False
                break
            model.num_tokens[seq_id] += 1
        sharing_changed = alloc.shared_bytes_saved() != saved_bytes
        assert not went_through or alloc.drain_copies() or sharing_changed, "the projection stopped early"
    alloc.drain_copies()


class AllocatorConformance:
    """Tests every allocator must pass. Override :meth:`allocator_factory` (a fixture)."""

    #: hypothesis examples per config for the random-operations test (keep the suite fast)
    max_examples = 60
    #: budgets drawn, in tokens (requests are 1-160 prompt + 1-160 output tokens)
    min_budget_tokens = 128
    max_budget_tokens = 2048

    @pytest.fixture
    def allocator_factory(self) -> AllocatorFactory:
        """Override: return ``(budget_bytes, kv_bytes_per_token) -> Allocator``."""
        raise NotImplementedError("override the allocator_factory fixture")

    def test_random_operations(self, allocator_factory: AllocatorFactory) -> None:
        @settings(max_examples=self.max_examples, deadline=None)
        @given(
            kv_bytes_per_token=st.sampled_from([1, 3, 64]),
            budget_tokens=st.integers(self.min_budget_tokens, self.max_budget_tokens),
            remainder_bytes=st.integers(0, 63),
            operations=OPERATIONS,
        )
        def run(kv_bytes_per_token: int, budget_tokens: int, remainder_bytes: int, operations: list) -> None:
            budget_bytes = budget_tokens * kv_bytes_per_token + remainder_bytes % kv_bytes_per_token
            alloc = allocator_factory(budget_bytes, kv_bytes_per_token)
            run_operations(alloc, operations)

        run()

    def test_empty_cache_is_all_free(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(10_000_000, 1000)
        led = check_ledger(alloc)
        assert led.token_bytes == led.reserved_future_bytes == led.internal_bytes == 0
        assert alloc.unallocated_bytes() == alloc.budget_bytes

    def test_zero_budget_holds_nothing(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(0, 1000)
        assert check_ledger(alloc, PROBE_SHAPE).total_bytes == 0
        shape = SeqShape(1, 2, 1)
        assert not alloc.fits_in_empty(shape) or alloc.allocate(1, shape) is None

    def test_free_of_unknown_sequence_raises(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(10_000_000, 1000)
        with pytest.raises(KeyError):
            alloc.free(12345)
        assert alloc.allocate(1, SeqShape(10, 100, 50)) == 0
        alloc.free(1)
        with pytest.raises(KeyError):
            alloc.free(1)

    def test_fill_then_free_everything(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(1_000_000, 100)
        empty = alloc.ledger(PROBE_SHAPE)
        shape = SeqShape(30, 120, 90)
        num_admitted = 0
        while alloc.allocate(num_admitted, shape) is not None:
            num_admitted += 1
            assert num_admitted <= alloc.budget_bytes // alloc.kv_bytes_per_token, "allocates forever"
        assert num_admitted >= 1
        assert alloc.refusal_reason(shape) in (Refusal.NO_MEMORY, Refusal.FRAGMENTED)
        check_ledger(alloc, PROBE_SHAPE)
        for seq_id in range(num_admitted):
            alloc.free(seq_id)
        assert alloc.ledger(PROBE_SHAPE) == empty

    def test_fork_then_append_to_child_leaves_parent_untouched(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(1_000_000, 100)
        assert alloc.allocate(1, SeqShape(21, 200, 100, num_branches=2)) == 0
        parent_table = alloc.block_table(1)
        alloc.fork(1, 2)
        assert alloc.num_tokens(2) == 21
        assert alloc.append(2, 5)
        assert alloc.num_tokens(2) == 26
        assert alloc.num_tokens(1) == 21
        assert alloc.block_table(1) == parent_table
        check_invariants(alloc, {1: 21, 2: 26}, {1: 100, 2: 100})

    def test_appending_many_tokens_at_once_equals_one_at_a_time(self, allocator_factory: AllocatorFactory) -> None:
        one, many = allocator_factory(1_000_000, 100), allocator_factory(1_000_000, 100)
        shape = SeqShape(21, 400, 300)
        num_appended = min(77, one.max_sequence_tokens(shape) - 21)
        for alloc in (one, many):
            assert alloc.allocate(1, shape) == 0
        for _ in range(num_appended):
            assert one.append(1)
        assert many.append(1, num_appended)
        assert one.ledger(PROBE_SHAPE) == many.ledger(PROBE_SHAPE)
        assert one.num_tokens(1) == many.num_tokens(1) == 21 + num_appended
        if _grouped(one) and all(g.window_tokens for g in one.kv_groups):
            return  # every layer windowed: any length fits once the windows do, nothing is too long
        assert not many.append(1, one.max_sequence_tokens(shape))  # all or nothing
        assert one.ledger(PROBE_SHAPE) == many.ledger(PROBE_SHAPE)

    def test_a_request_without_prefix_hashes_never_hits(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(1_000_000, 100)
        shape = SeqShape(64, 200, 100)
        assert alloc.num_cached_tokens(shape) == 0
        for seq_id in range(3):
            assert alloc.allocate(seq_id, shape) == 0
            alloc.free(seq_id)

    def test_swap_out_then_in_restores_tokens_and_ledger(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(1_000_000, 100)
        if not alloc.capabilities.can_swap:
            pytest.skip("this allocator does not swap")
        assert alloc.allocate(1, SeqShape(37, 200, 150, num_branches=2)) == 0
        alloc.fork(1, 2)
        assert alloc.append(2, 3)
        alloc.drain_copies()
        before = alloc.ledger(PROBE_SHAPE)
        footprint = alloc.footprint([1, 2])
        transfer = alloc.swap_out([1, 2])
        assert transfer == footprint.transfer and transfer.num_bytes > 0 and transfer.num_runs >= 1
        assert alloc.ledger().allocated_bytes == 0
        assert alloc.swap_in([1, 2]) == transfer
        assert alloc.ledger(PROBE_SHAPE) == before
        assert (alloc.num_tokens(1), alloc.num_tokens(2)) == (37, 40)


class CachingAllocatorConformance(AllocatorConformance):
    """Tests every allocator with a prefix cache must pass (on top of :class:`AllocatorConformance`).
    Override :meth:`allocator_factory`; it must build allocators with the prefix cache on."""

    def test_factory_builds_a_prefix_cache(self, allocator_factory: AllocatorFactory) -> None:
        assert allocator_factory(10_000, 10).capabilities.caches_prefixes

    def test_random_operations_with_shared_prefixes(self, allocator_factory: AllocatorFactory) -> None:
        @settings(max_examples=self.max_examples, deadline=None)
        @given(
            kv_bytes_per_token=st.sampled_from([1, 64]),
            budget_tokens=st.integers(self.min_budget_tokens, self.max_budget_tokens),
            granule_tokens=st.sampled_from([4, 8, 16, 64]),
            shared_granules=st.tuples(st.just(0), st.integers(1, 4), st.integers(1, 12), st.just(1000)),
            operations=CACHING_OPERATIONS,
        )
        def run(
            kv_bytes_per_token: int, budget_tokens: int, granule_tokens: int, shared_granules: tuple, operations: list
        ) -> None:
            alloc = allocator_factory(budget_tokens * kv_bytes_per_token, kv_bytes_per_token)
            run_operations(alloc, operations, granule_tokens, shared_granules)

        run()

    def test_freeing_everything_leaves_blocks_cached_not_lost(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(100_000, 100)
        size = alloc.block_size_tokens
        prompt = 4 * size + 1
        shape = SeqShape(prompt, 2 * prompt, prompt + 9, 1, prompt, prefix_hashes(prompt, size, 1000, 0, 0), size)
        assert alloc.allocate(1, shape) == 0
        alloc.free(1)
        led = check_ledger(alloc)
        assert led.allocated_bytes == 0
        if _grouped(alloc):  # each group's full prompt blocks it held: a window group's last ones only
            first = [max(0, prompt - g.window_tokens) // size if g.window_tokens else 0 for g in alloc.kv_groups]
            assert led.cached_bytes == sum(4 - f for f in first) * alloc.page_bytes
        else:
            assert led.cached_bytes == 4 * size * alloc.kv_bytes_per_token  # the four full prompt blocks
        assert led.free_bytes + led.cached_bytes + led.external_bytes == alloc.budget_bytes
        assert alloc.num_cached_tokens(shape) == 4 * size  # capped below the prompt: 4 blocks of 4 full + 1
        assert alloc.allocate(2, shape) == 4 * size
        check_cache(alloc, {2: prompt})
