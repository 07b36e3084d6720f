"""PagedAllocator: block pool, block tables, reference counts, copy-on-write, ledger."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvbench_plugins.allocators import paged
from kvbench_plugins.allocators.paged import PagedAllocator, PagedConfig

from kvbench.app.config import plugin_config
from kvbench.errors import ConfigError
from kvbench.memory.allocator import Refusal, SeqShape
from kvbench.testing.allocators import OPERATIONS, AllocatorConformance, CachingAllocatorConformance

LLAMA2_7B_KV_BYTES_PER_TOKEN = 524_288  # 2 (K,V) x 32 layers x 4096 hidden x 2 bytes
H100_KV_BUDGET_BYTES = 62_500_000_000


def make(block_size_tokens: int = 16, budget_tokens: int = 1024, kv_bytes_per_token: int = 1) -> PagedAllocator:
    budget_bytes = budget_tokens * kv_bytes_per_token
    config = PagedConfig(block_size_tokens)
    return PagedAllocator(config, budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token)


def test_lecture_numbers_block_16_gives_7450_blocks():
    alloc = PagedAllocator(
        PagedConfig(16), budget_bytes=H100_KV_BUDGET_BYTES, kv_bytes_per_token=LLAMA2_7B_KV_BYTES_PER_TOKEN
    )
    assert alloc.num_blocks == 7450
    led = alloc.ledger()
    assert led.external_bytes == H100_KV_BUDGET_BYTES - 7450 * 16 * LLAMA2_7B_KV_BYTES_PER_TOKEN
    assert led.free_bytes == 7450 * 16 * LLAMA2_7B_KV_BYTES_PER_TOKEN


def test_allocate_takes_ceil_blocks_and_grows_one_block_at_a_time():
    alloc = make()
    assert alloc.allocate(1, SeqShape(20, 100, 40)) == 0
    assert alloc.block_table(1) == [0, 1]
    for _ in range(12):  # fills block 1 exactly
        assert alloc.append(1)
    assert alloc.block_table(1) == [0, 1]
    assert alloc.append(1)  # 33rd token: a new block
    assert alloc.block_table(1) == [0, 1, 2]
    assert alloc.num_tokens(1) == 33


def test_ledger_splits_the_tail_into_future_and_internal():
    alloc = make()
    assert alloc.allocate(1, SeqShape(20, 100, 25)) == 0  # 2 blocks = 32 slots; will fill 5 more
    led = alloc.ledger()
    assert (led.token_bytes, led.reserved_future_bytes, led.internal_bytes) == (20, 5, 7)
    assert led.free_bytes == 1024 - 32 and led.external_bytes == 0
    for _ in range(5):
        alloc.append(1)
    led = alloc.ledger()
    assert (led.token_bytes, led.reserved_future_bytes, led.internal_bytes) == (25, 0, 7)


def test_fork_then_append_to_child_copies_one_block_and_leaves_parent_untouched():
    alloc = make()
    assert alloc.allocate(1, SeqShape(20, 100, 40)) == 0
    alloc.fork(1, 2)
    assert alloc.block_table(2) == [0, 1]
    assert [alloc.refcount(b) for b in (0, 1)] == [2, 2]
    led = alloc.ledger()
    assert led.token_bytes == 20  # shared blocks count once
    assert led.reserved_future_bytes == 0 and led.internal_bytes == 12  # a shared tail is internal
    assert alloc.append(2)
    assert alloc.num_cow_copies == 1
    assert alloc.block_table(2) == [0, 2]
    assert alloc.block_table(1) == [0, 1] and alloc.num_tokens(1) == 20
    assert [alloc.refcount(b) for b in (0, 1, 2)] == [2, 1, 1]
    led = alloc.ledger()
    assert led.token_bytes == 20 + 5  # the 4 copied tokens and the new one
    assert led.reserved_future_bytes == 12 + 11  # both tails are owned again
    assert alloc.append(1)  # the parent now owns block 1: no copy
    assert alloc.num_cow_copies == 1 and alloc.block_table(1) == [0, 1]


def test_fork_with_full_last_block_needs_no_copy():
    alloc = make()
    assert alloc.allocate(1, SeqShape(32, 100, 60)) == 0
    alloc.fork(1, 2)
    assert alloc.append(2)
    assert alloc.num_cow_copies == 0
    assert alloc.block_table(2) == [0, 1, 2] and alloc.block_table(1) == [0, 1]


def test_free_returns_blocks_only_when_the_last_holder_leaves():
    alloc = make()
    assert alloc.allocate(1, SeqShape(20, 100, 40)) == 0
    alloc.fork(1, 2)
    free_before = alloc.ledger().free_bytes
    alloc.free(1)
    assert alloc.ledger().free_bytes == free_before
    assert [alloc.refcount(b) for b in (0, 1)] == [1, 1]
    assert alloc.ledger().reserved_future_bytes == 12  # the survivor's tail is its future again
    alloc.free(2)
    assert alloc.ledger().free_bytes == 1024
    with pytest.raises(KeyError):
        alloc.free(2)


def test_out_of_blocks_append_returns_false_and_changes_nothing():
    alloc = make(budget_tokens=32)
    assert alloc.allocate(1, SeqShape(32, 100, 60)) == 0
    led = alloc.ledger()
    assert not alloc.append(1)
    assert alloc.ledger() == led and alloc.num_tokens(1) == 32


def test_watermark_refuses_admission_that_would_leave_too_little_free():
    alloc = make(budget_tokens=64)  # 4 blocks of 16 bytes
    shape = SeqShape(20, 100, 40)  # 2 blocks
    assert alloc.allocate(1, shape, keep_free_bytes=33) is None
    assert alloc.refusal_reason(shape, keep_free_bytes=33) is Refusal.WATERMARK
    assert alloc.ledger().free_bytes == 64
    assert alloc.allocate(1, shape, keep_free_bytes=32) == 0
    assert alloc.refusal_reason(SeqShape(40, 100, 40)) is Refusal.NO_MEMORY
    caps = PagedAllocator.capabilities
    assert caps.shares_blocks and not caps.reserves_future and not caps.contiguous_layout


def test_budget_remainder_below_one_block_is_external():
    alloc = PagedAllocator(PagedConfig(16), budget_bytes=16 * 3 * 10 + 7, kv_bytes_per_token=10)
    assert alloc.num_blocks == 3
    assert alloc.ledger().external_bytes == 7


@pytest.mark.parametrize("bad", [7, 4, 12, 512, 0, -16])
def test_invalid_block_size_names_the_key(bad):
    message = r"allocator\.block_size_tokens=.* is invalid: use a power of two from 8 to 256"
    with pytest.raises(ConfigError, match=message):
        PagedConfig(bad).validate()


def test_config_edge_rejects_bad_block_size_and_unknown_keys():
    with pytest.raises(ConfigError, match="block_size_tokens"):
        plugin_config(PagedAllocator, {"name": "paged", "block_size_tokens": 7}, "allocator")
    with pytest.raises(ConfigError, match="blok_size"):
        plugin_config(PagedAllocator, {"name": "paged", "blok_size": 16}, "allocator")
    assert plugin_config(PagedAllocator, {"name": "paged", "block_size_tokens": 32}, "allocator") == PagedConfig(32)


def _brute_force_ledger(alloc: PagedAllocator, final_tokens: dict[int, int]) -> tuple[int, int]:
    """token and reserved-future slots recomputed from the tables (kv_bytes_per_token == 1)."""
    size = alloc.block_size_tokens
    fill: dict[int, int] = {}
    future_tokens = 0
    for seq_id, final in final_tokens.items():
        table, num_tokens = alloc.block_table(seq_id), alloc.num_tokens(seq_id)
        for index, block_id in enumerate(table):
            fill[block_id] = min(size, num_tokens - index * size)
        tail = len(table) * size - num_tokens
        if tail and alloc.refcount(table[-1]) == 1:
            future_tokens += max(0, min(tail, final - num_tokens))
    return sum(fill.values()), future_tokens


@settings(max_examples=60, deadline=None)
@given(block_size_tokens=st.sampled_from([8, 16]), operations=OPERATIONS)
def test_running_totals_match_a_brute_force_recount(block_size_tokens, operations):
    alloc = make(block_size_tokens, budget_tokens=2048)
    finals: dict[int, int] = {}
    next_id = 0
    for op in operations:
        live = sorted(finals)
        if op[0] == "allocate":
            shape = SeqShape(op[1], op[1] + op[2] + op[3], op[1] + op[2] - 1)
            if alloc.allocate(next_id, shape) is not None:
                finals[next_id] = shape.final_kv_tokens
                next_id += 1
        elif live and op[0] == "append":
            alloc.append(live[op[1] % len(live)], op[2])
        elif live and op[0] == "fork":
            parent = live[op[1] % len(live)]
            alloc.fork(parent, next_id, None if op[2] is None else alloc.num_tokens(parent) + op[2])
            finals[next_id] = finals[parent] if op[2] is None else alloc.num_tokens(parent) + op[2]
            next_id += 1
        elif live and op[0] == "free":
            seq_id = live[op[1] % len(live)]
            alloc.free(seq_id)
            del finals[seq_id]
        led = alloc.ledger()
        assert (led.token_bytes, led.reserved_future_bytes) == _brute_force_ledger(alloc, finals)


class TestPagedConformance(AllocatorConformance):
    @pytest.fixture(params=[8, 16, 256], ids=lambda b: f"block{b}")
    def allocator_factory(self, request):
        return lambda budget_bytes, kv_bytes_per_token: PagedAllocator(
            PagedConfig(request.param), budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token
        )


def test_a_huge_pool_costs_memory_for_blocks_used_not_for_the_budget():
    import tracemalloc

    tracemalloc.start()
    alloc = make(budget_tokens=10**15)  # 62.5 trillion blocks: a list of their ids would not fit in RAM
    assert alloc.allocate(1, SeqShape(40, 100, 100)) == 0
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak_bytes < 1_000_000
    assert alloc.ledger().free_bytes == (alloc.num_blocks - 3) * 16


def test_blocks_given_back_are_reused_last_in_first_out_before_fresh_ones():
    alloc = make()
    alloc.allocate(1, SeqShape(32, 100, 100))  # blocks 0, 1
    alloc.allocate(2, SeqShape(16, 100, 100))  # block 2
    alloc.free(1)
    assert alloc.refcount(0) == alloc.refcount(5) == 0 and alloc.refcount(2) == 1
    alloc.allocate(3, SeqShape(48, 100, 100))
    assert alloc.block_table(3) == [0, 1, 3]  # the freed blocks in their old order, then a fresh one


class TestPagedWithPrefixCachingConforms(CachingAllocatorConformance):
    @pytest.fixture(params=[8, 16])
    def allocator_factory(self, request):
        return lambda budget_bytes, kv_bytes_per_token: PagedAllocator(
            PagedConfig(block_size_tokens=request.param, prefix_caching=True),
            budget_bytes=budget_bytes,
            kv_bytes_per_token=kv_bytes_per_token,
        )


class TestPagedKeepingDuplicateBlocksConforms(CachingAllocatorConformance):
    """vLLM's prefix cache: a recomputed copy of a cached block keeps the key beside it."""

    @pytest.fixture(
        params=[(False, False), (True, False), (True, True)], ids=["prompt_blocks", "every_block", "host_tier"]
    )
    def allocator_factory(self, request):
        every_block, host_tier = request.param
        return lambda budget_bytes, kv_bytes_per_token: PagedAllocator(
            PagedConfig(
                8,
                prefix_caching=True,
                cache_generated_blocks=every_block,
                cache_duplicate_blocks=True,
                host_cache_bytes=budget_bytes if host_tier else 0,
            ),
            budget_bytes=budget_bytes,
            kv_bytes_per_token=kv_bytes_per_token,
        )


@settings(max_examples=200, deadline=None)
@given(
    block_size_tokens=st.sampled_from([1, 4, 16, 32]),
    budget_tokens=st.integers(64, 2048),
    seqs=st.lists(st.tuples(st.integers(1, 200), st.integers(0, 300)), min_size=1, max_size=12),
    max_steps=st.integers(1, paged.SHORT_PROJECTION_STEPS),
)
def test_short_projection_equals_the_array_projection(block_size_tokens, budget_tokens, seqs, max_steps):
    """A few steps are projected in plain integers, more in numpy arrays: the same values either
    way, up to the step where blocks run out, whether new blocks come from given-back or fresh ones."""
    alloc = make(block_size_tokens, budget_tokens, kv_bytes_per_token=3)
    seq_ids = []
    for seq_id, (prompt_tokens, output_tokens) in enumerate(seqs):
        shape = SeqShape(prompt_tokens, prompt_tokens + output_tokens + 1, prompt_tokens + output_tokens)
        if alloc.allocate(seq_id, shape) is not None:
            seq_ids.append(seq_id)
    for seq_id in seq_ids[: len(seq_ids) // 3]:  # some blocks given back: free ids beside fresh ones
        alloc.free(seq_id)
    seq_ids = seq_ids[len(seq_ids) // 3 :]
    if not seq_ids:
        return
    short = alloc.project_decode(seq_ids, max_steps)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paged, "SHORT_PROJECTION_STEPS", 0)
        arrays = alloc.project_decode(seq_ids, max_steps)
    assert short.num_steps == arrays.num_steps
    assert set(short.ledgers) == set(arrays.ledgers)
    for name, values in short.ledgers.items():
        assert isinstance(values, list)
        assert values == [int(v) for v in arrays.ledgers[name]], name
