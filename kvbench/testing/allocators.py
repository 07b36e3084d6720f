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

from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.memory.allocator import Allocator, Refusal, SeqShape
from kvbench.testing.cache_checks import cache_queue, check_cache, check_host_tier
from kvbench.testing.invariants import PROBE_SHAPE, check_group_invariants, check_invariants, check_ledger, is_grouped
from kvbench.testing.operations import CACHING_OPERATIONS, OPERATIONS, prefix_hashes, run_operations

#: the names plugin authors import from here (the checks live in invariants, cache_checks, operations)
__all__ = [
    "CACHING_OPERATIONS",
    "OPERATIONS",
    "PROBE_SHAPE",
    "AllocatorConformance",
    "AllocatorFactory",
    "CachingAllocatorConformance",
    "cache_queue",
    "check_cache",
    "check_group_invariants",
    "check_host_tier",
    "check_invariants",
    "check_ledger",
    "prefix_hashes",
    "run_operations",
]

#: (budget_bytes, kv_bytes_per_token) -> a fresh allocator
AllocatorFactory = Callable[[int, int], Allocator]


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
        if is_grouped(one) and all(g.window_tokens for g in one.kv_groups):
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
        if is_grouped(alloc):  # each group's full prompt blocks it held: a window group's last ones only
            first = [max(0, prompt - g.window_tokens) // size if g.window_tokens else 0 for g in alloc.kv_groups]
            assert led.cached_bytes == sum(4 - f for f in first) * alloc.page_bytes
        else:
            assert led.cached_bytes == 4 * size * alloc.kv_bytes_per_token  # the four full prompt blocks
        assert led.free_bytes + led.cached_bytes + led.external_bytes == alloc.budget_bytes
        assert alloc.num_cached_tokens(shape) == 4 * size  # capped below the prompt: 4 blocks of 4 full + 1
        assert alloc.allocate(2, shape) == 4 * size
        check_cache(alloc, {2: prompt})
