"""PagedAllocator's host tier for evicted prefix blocks: a hand-made case with exact counts, the
exclusive-tier invariants under random operations, and the conformance suite with the tier on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvbench_plugins.allocators.paged import PagedAllocator, PagedConfig

from kvbench.app.config import plugin_config
from kvbench.core.kv import Transfer
from kvbench.core.ledger import MemoryLedger
from kvbench.errors import ConfigError
from kvbench.memory.allocator import SeqShape
from kvbench.testing.allocators import CachingAllocatorConformance, check_cache, check_invariants, prefix_hashes

B = 16  # tokens per block
PIN = -5  # the holder id a scheduler pins a reload under (negative: never a sequence's)


def make(budget_blocks: int, host_blocks: int, block_size_tokens: int = B) -> PagedAllocator:
    return PagedAllocator(
        PagedConfig(block_size_tokens, prefix_caching=True, host_cache_bytes=host_blocks * block_size_tokens),
        budget_bytes=budget_blocks * block_size_tokens,
        kv_bytes_per_token=1,
    )


def shape(request: int, prompt: int, shared_tokens: int, prefix: int = 0) -> SeqShape:
    hashes = prefix_hashes(prompt, B, shared_tokens // B, prefix, request)
    return SeqShape(prompt, prompt + 100, prompt + 50, 1, prompt, hashes, B)


def check_exclusive(alloc: PagedAllocator) -> None:
    """No key is both GPU-cached and on host; the host never holds more than its slots."""
    host = alloc.host_cache
    assert len(host) <= host.capacity_blocks
    on_gpu = {alloc.block_key(b) for b in range(alloc.num_blocks)} - {None}
    assert not on_gpu & set(host.keys()), "a key is in both tiers"


def test_an_evicted_prefix_is_found_on_host_and_reloaded():
    alloc = make(budget_blocks=4, host_blocks=2)
    # request 1: 33 tokens, its first two blocks keyed by prefix 0; freed, they stay GPU-cached
    assert alloc.allocate(1, shape(1, 33, 32, prefix=0)) == 0
    alloc.free(1)
    # request 2 takes all 4 blocks: the free two, then it evicts a1 and a0 (LRU, tail first) to host
    assert alloc.allocate(2, shape(2, 64, 64, prefix=1)) == 0
    keys_a = [(prefix_hashes(33, B, 2, 0, 1)[g], (g + 1) * B) for g in range(2)]
    assert alloc.host_cache.keys() == [keys_a[1], keys_a[0]]
    assert alloc.num_evicted_blocks == 2 and alloc.host_cache.num_offloaded_blocks == 2
    alloc.free(2)  # its 4 keyed blocks join the GPU cache, tail first
    # request 3 shares request 1's prefix: nothing on the GPU, both blocks on host
    third = shape(3, 33, 32, prefix=0)
    assert alloc.num_cached_tokens(third) == 0
    reload = alloc.reload_from_host(PIN, third)
    assert reload is not None
    assert reload.transfer == Transfer(2 * B, 1) and reload.block_indices == (0, 1)
    # two GPU blocks were taken for them by evicting request 2's last two blocks, now on host
    b_keys = [(prefix_hashes(64, B, 4, 1, 2)[g], (g + 1) * B) for g in range(4)]
    assert alloc.host_cache.keys() == [b_keys[3], b_keys[2]]
    assert alloc.num_evicted_blocks == 4 and alloc.host_cache.num_reloaded_blocks == 2
    pinned = alloc.block_table(PIN)
    assert [alloc.block_key(b) for b in pinned] == keys_a
    check_exclusive(alloc)
    # the admission hits the reloaded blocks on the GPU; the pin is released after it
    assert alloc.num_cached_tokens(third) == 2 * B
    assert alloc.allocate(3, third) == 2 * B
    alloc.free(PIN)
    assert alloc.block_table(3)[:2] == pinned and [alloc.refcount(b) for b in pinned] == [1, 1]
    # its third block evicted request 2's second one to host, whose full LRU dropped the oldest key
    assert [alloc.block_key(b) for b in alloc.cached_block_ids()] == [b_keys[0]]
    assert alloc.host_cache.keys() == [b_keys[2], b_keys[1]]
    check_cache(alloc, {3: 33})
    check_exclusive(alloc)
    host = alloc.host_cache
    assert (host.num_offloaded_blocks, host.num_reloaded_blocks, host.num_evicted_blocks) == (5, 2, 1)
    assert alloc.num_evicted_blocks == 5


def test_a_reload_continues_past_gpu_blocks_and_pins_them():
    alloc = make(budget_blocks=6, host_blocks=4)
    assert alloc.allocate(1, shape(1, 49, 48, prefix=0)) == 0  # 3 keyed blocks + 1
    a0, a1, a2, _ = alloc.block_table(1)
    alloc.free(1)  # cached a2, a1, a0 (tail first); 3 free
    assert alloc.allocate(2, SeqShape(4 * B, 5 * B, 4 * B)) == 0  # 3 free, then evicts a2
    assert alloc.host_cache.num_offloaded_blocks == 1
    third = shape(3, 49, 48, prefix=0)
    assert alloc.num_cached_tokens(third) == 2 * B  # a0, a1 on the GPU; a2 on host
    assert not alloc.can_allocate(third)  # 4 blocks: 2 revived + 2 new, and only a0, a1 are available
    alloc.free(2)
    reload = alloc.reload_from_host(PIN, third)
    assert reload.block_indices == (2,) and reload.transfer.num_bytes == B
    assert alloc.block_table(PIN)[:2] == [a0, a1]  # the GPU blocks of the walk are pinned too
    assert alloc.cached_block_ids() == [] and alloc.refcount(a0) == 1
    assert alloc.allocate(3, third) == 3 * B
    alloc.free(PIN)
    check_cache(alloc, {3: 49})


def test_nothing_on_host_or_no_room_changes_nothing():
    alloc = make(budget_blocks=4, host_blocks=4)
    assert alloc.reload_from_host(PIN, shape(1, 33, 32)) is None
    assert alloc.allocate(1, shape(1, 33, 32)) == 0
    alloc.free(1)
    assert alloc.allocate(2, SeqShape(4 * B, 5 * B, 4 * B)) == 0  # evicts both keyed blocks to host
    assert len(alloc.host_cache) == 2
    before = (alloc.ledger(), alloc.host_cache.keys())
    assert alloc.reload_from_host(PIN, shape(3, 33, 32)) is None  # every block is held: no room
    assert (alloc.ledger(), alloc.host_cache.keys()) == before
    with pytest.raises(ValueError):
        alloc.reload_from_host(2, shape(3, 33, 32))  # a holder id in use is a bug


def test_without_a_host_tier_evicted_blocks_vanish_as_before():
    alloc = make(budget_blocks=4, host_blocks=0)
    assert alloc.host_cache is None
    assert alloc.allocate(1, shape(1, 33, 32)) == 0
    alloc.free(1)
    assert alloc.allocate(2, SeqShape(4 * B, 5 * B, 4 * B)) == 0
    alloc.free(2)
    assert alloc.reload_from_host(PIN, shape(3, 33, 32)) is None
    assert alloc.num_cached_tokens(shape(3, 33, 32)) == 0


def test_config_refuses_a_host_tier_without_prefix_caching_and_negative_sizes():
    with pytest.raises(ConfigError, match="prefix_caching"):
        plugin_config(PagedAllocator, {"name": "paged", "host_cache_bytes": 1e9}, "allocator")
    with pytest.raises(ConfigError, match="host_cache_bytes"):
        plugin_config(PagedAllocator, {"name": "paged", "prefix_caching": True, "host_cache_bytes": -1}, "allocator")
    with pytest.raises(ConfigError, match="host_reload"):
        plugin_config(PagedAllocator, {"name": "paged", "prefix_caching": True, "host_reload": "eager"}, "allocator")
    config = plugin_config(
        PagedAllocator, {"name": "paged", "prefix_caching": True, "host_cache_bytes": 62.5e9}, "allocator"
    )
    assert config.host_cache_bytes == 62.5e9 and config.host_reload == "overlapped"


# --- random operations: the exclusive tiers' invariants ---------------------------------------

# ("admit", prompt tokens, prefix, reload first), ("append", which, tokens), ("free", which)
HOST_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.sampled_from([17, 33, 48, 64, 80]), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("append"), st.integers(0, 15), st.integers(1, 40)),
        st.tuples(st.just("free"), st.integers(0, 15)),
        st.tuples(st.just("free"), st.integers(0, 15)),
    ),
    min_size=10,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    budget_blocks=st.integers(4, 16),
    host_blocks=st.integers(0, 12),
    shared_tokens=st.sampled_from([16, 32, 64]),
    operations=HOST_OPERATIONS,
)
def test_random_operations_keep_the_tiers_exclusive_and_within_their_slots(
    budget_blocks, host_blocks, shared_tokens, operations
):
    alloc = make(budget_blocks, max(host_blocks, 1))
    num_tokens: dict[int, int] = {}
    finals: dict[int, int] = {}
    next_id = 0
    for op in operations:
        live = sorted(num_tokens)
        if op[0] == "admit":
            _, prompt, prefix, reload_first = op
            s = shape(next_id, prompt, min(shared_tokens, prompt), prefix)
            reload = alloc.reload_from_host(PIN, s) if reload_first else None
            if reload is not None:
                check_exclusive(alloc)
                last = reload.block_indices[-1]
                assert alloc.num_cached_tokens(s) >= (last + 1) * B, "a reloaded block is not a hit"
                assert reload.transfer.num_bytes == len(reload.block_indices) * alloc.block_bytes
            cached = alloc.num_cached_tokens(s)
            answer = alloc.allocate(next_id, s)
            if reload is not None:
                alloc.free(PIN)
            if answer is not None:
                assert answer == cached
                num_tokens[next_id], finals[next_id] = prompt, s.final_kv_tokens
            next_id += 1
        elif op[0] == "append" and live:
            seq_id = live[op[1] % len(live)]
            if alloc.append(seq_id, op[2]):
                num_tokens[seq_id] += op[2]
                finals[seq_id] = max(finals[seq_id], num_tokens[seq_id])
        elif op[0] == "free" and live:
            seq_id = live[op[1] % len(live)]
            alloc.free(seq_id)
            del num_tokens[seq_id], finals[seq_id]
        check_invariants(alloc, num_tokens, finals)
        check_cache(alloc, num_tokens)
        check_exclusive(alloc)
    host = alloc.host_cache
    assert host.num_offloaded_blocks == alloc.num_evicted_blocks
    assert len(host) == (
        host.num_offloaded_blocks - host.num_evicted_blocks - host.num_reloaded_blocks - host.num_discarded_blocks
    )


class TestPagedWithHostTierConforms(CachingAllocatorConformance):
    """The allocator's verbs with the host tier on behave as the suite requires (a reload is a
    verb of its own, which the scheduler calls before an admission)."""

    @pytest.fixture(params=[8, 16])
    def allocator_factory(self, request):
        return lambda budget_bytes, kv_bytes_per_token: PagedAllocator(
            PagedConfig(block_size_tokens=request.param, prefix_caching=True, host_cache_bytes=budget_bytes),
            budget_bytes=budget_bytes,
            kv_bytes_per_token=kv_bytes_per_token,
        )


def test_the_host_ledger_accounts_for_every_byte_of_the_host_budget():
    # 3 host slots of one 16-byte block, and 8 bytes below a block: external on host too
    alloc = PagedAllocator(
        PagedConfig(B, prefix_caching=True, host_cache_bytes=3 * B + 8), budget_bytes=4 * B, kv_bytes_per_token=1
    )
    assert alloc.host_ledger() == MemoryLedger(3 * B + 8, 0, 0, 0, 8, 3 * B, 0)
    assert alloc.allocate(1, shape(1, 64, 64)) == 0
    alloc.free(1)  # its four keyed blocks stay cached on the GPU
    assert alloc.allocate(2, SeqShape(2 * B, 3 * B, 2 * B)) == 0  # evicts two of them (LRU) to host
    assert alloc.host_ledger() == MemoryLedger(3 * B + 8, 0, 0, 0, 8, B, 2 * B)
    check_cache(alloc, {2: 2 * B})
    assert make(budget_blocks=4, host_blocks=0).host_ledger() is None


def test_a_key_held_by_two_blocks_moves_to_host_with_its_last_holder():
    alloc = PagedAllocator(
        PagedConfig(B, prefix_caching=True, cache_duplicate_blocks=True, host_cache_bytes=2 * B),
        budget_bytes=4 * B,
        kv_bytes_per_token=1,
    )
    assert alloc.allocate(1, shape(1, 32, 32)) == 0
    x0, x1 = alloc.block_table(1)
    alloc.free(1)
    assert alloc.allocate(2, shape(2, 32, 32)) == B  # a fully cached prompt computes block 1 again
    y1 = alloc.block_table(2)[1]
    key = alloc.block_key(x1)
    assert alloc.block_key(y1) == key  # the copy holds the key beside x1
    alloc.free(2)
    assert alloc.cached_block_ids() == [x1, y1, x0]
    assert alloc.allocate(3, SeqShape(2 * B, 4 * B, 2 * B)) == 0  # the free block, then x1 evicted
    assert alloc.block_key(x1) is None and key not in alloc.host_cache  # y1 still holds it
    check_exclusive(alloc)
    assert alloc.allocate(4, SeqShape(B, 4 * B, B)) == 0  # y1 evicted: the key's last GPU copy
    assert alloc.host_cache.keys() == [key] and alloc.num_evicted_blocks == 2
    check_exclusive(alloc)
