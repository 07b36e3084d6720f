"""PagedAllocator with prefix caching: hand-built cases with known answers."""

from __future__ import annotations

import pytest
from kvbench_plugins.allocators import paged
from kvbench_plugins.allocators.paged import PagedAllocator, PagedConfig

from kvbench.memory.allocator import SeqShape
from kvbench.testing.allocators import check_cache, check_ledger, prefix_hashes

B = 16  # tokens per block


def make(budget_blocks: int = 64, block_size_tokens: int = B) -> PagedAllocator:
    return PagedAllocator(
        PagedConfig(block_size_tokens, prefix_caching=True),
        budget_bytes=budget_blocks * block_size_tokens,
        kv_bytes_per_token=1,
    )


def shape(
    request: int, prompt: int, shared_tokens: int, prefix: int = 0, granule: int = B, num_tokens=None
) -> SeqShape:
    hashes = prefix_hashes(prompt, granule, shared_tokens // granule, prefix, request)
    return SeqShape(prompt if num_tokens is None else num_tokens, prompt + 100, prompt + 50, 1, prompt, hashes, granule)


def test_three_requests_sharing_a_two_block_prefix_hit_0_then_2_then_2_blocks():
    alloc = make()
    first, second, third = (shape(r, 40, 32) for r in range(3))
    assert alloc.allocate(1, first) == 0
    assert alloc.allocate(2, second) == 2 * B  # while the first still runs: shared, refcount 2
    assert alloc.block_table(2)[:2] == alloc.block_table(1)[:2]
    assert alloc.block_table(2)[2] != alloc.block_table(1)[2]  # the unshared tail is its own
    assert [alloc.refcount(b) for b in alloc.block_table(1)] == [2, 2, 1]
    assert check_ledger(alloc).token_bytes == 32 + 8 + 8  # the shared prefix counts once
    alloc.free(1)
    alloc.free(2)
    led = check_ledger(alloc)
    assert led.allocated_bytes == 0 and led.cached_bytes == 2 * B  # only the two full shared blocks had keys...
    assert alloc.allocate(3, third) == 2 * B  # ...and come back out of the evictable queue
    assert alloc.cached_block_ids() == []
    check_cache(alloc, {3: 40})


def test_only_full_prompt_blocks_get_keys_and_the_unshared_ones_are_cached_too():
    alloc = make()
    assert alloc.allocate(1, shape(1, 40, 32)) == 0
    table = alloc.block_table(1)
    assert [alloc.block_key(b) is not None for b in table] == [True, True, False]  # 40 = 2 full + 8
    alloc.free(1)
    assert alloc.cached_block_ids() == [table[1], table[0]]  # tail first: a prefix's head is evicted last


def test_eviction_takes_free_blocks_first_then_the_least_recently_used_cached_block():
    alloc = make(budget_blocks=6)
    assert alloc.allocate(1, shape(1, 33, 32, prefix=0)) == 0  # blocks a0 a1 + 1 private
    assert alloc.allocate(2, shape(2, 33, 32, prefix=1)) == 0  # blocks b0 b1 + 1 private
    a0, a1, _ = alloc.block_table(1)
    b0, b1, _ = alloc.block_table(2)
    alloc.free(1)
    alloc.free(2)
    assert alloc.cached_block_ids() == [a1, a0, b1, b0]
    led = check_ledger(alloc)
    assert (led.free_bytes, led.cached_bytes) == (2 * B, 4 * B)
    assert alloc.allocate(3, SeqShape(3 * B, 4 * B, 3 * B)) == 0  # 2 free blocks, then evicts a1
    assert alloc.cached_block_ids() == [a0, b1, b0] and alloc.block_key(a1) is None
    assert alloc.num_evicted_blocks == 1
    assert alloc.num_cached_tokens(shape(4, 40, 32, prefix=0)) == B  # a0 survives: the head still hits
    assert alloc.num_cached_tokens(shape(5, 40, 32, prefix=1)) == 2 * B


def test_a_prefix_shorter_than_one_block_gives_no_hit():
    alloc = make()
    # 8 shared tokens (two granules of 4) under 16-token blocks: no full block is shared
    assert alloc.allocate(1, shape(1, 64, 8, granule=4)) == 0
    assert alloc.allocate(2, shape(2, 64, 8, granule=4)) == 0
    small = make(block_size_tokens=8)  # the same prefix under 8-token blocks: one block
    assert small.allocate(1, shape(1, 64, 8, granule=4)) == 0
    assert small.allocate(2, shape(2, 64, 8, granule=4)) == 8


def test_a_fully_cached_prompt_still_computes_its_last_block():
    alloc = make()
    assert alloc.allocate(1, shape(1, 32, 32)) == 0
    alloc.free(1)
    # as vLLM: at most prompt - 1 tokens come from the cache, in whole blocks: 1 of the 2 blocks
    assert alloc.allocate(2, shape(2, 32, 32)) == B
    second = alloc.block_table(2)[1]
    assert alloc.block_key(second) is None  # recomputed content whose key another block holds: private
    alloc.free(2)
    assert len(alloc.cached_block_ids()) == 2
    assert alloc.allocate(3, shape(3, 33, 32)) == 2 * B  # one more token: both blocks


def test_a_block_gets_its_key_when_it_fills_during_a_chunked_prefill():
    alloc = make()
    assert alloc.allocate(1, shape(1, 64, 64, num_tokens=10)) == 0  # the first chunk: 10 of 64 tokens
    assert alloc.num_cached_tokens(shape(2, 64, 64)) == 0
    assert alloc.append(1, 6)  # block 0 is full
    assert alloc.num_cached_tokens(shape(2, 64, 64)) == B
    assert alloc.append(1, 30)  # 46 tokens: blocks 1 full, 2 not
    assert alloc.num_cached_tokens(shape(2, 64, 64)) == 2 * B
    alloc.truncate(1, 20)  # growth taken back: block 1 was never computed, its key goes
    assert alloc.num_cached_tokens(shape(2, 64, 64)) == B
    check_cache(alloc, {1: 20})
    assert alloc.append(1, 12)  # refilled: keyed again
    assert alloc.num_cached_tokens(shape(2, 64, 64)) == 2 * B


def test_swap_moves_a_shared_cached_block_for_the_family_and_leaves_it_to_its_other_holder():
    alloc = make()
    assert alloc.allocate(1, shape(1, 40, 32)) == 0
    assert alloc.allocate(2, shape(2, 40, 32)) == 2 * B
    shared = alloc.block_table(1)[:2]
    footprint = alloc.footprint([2])
    assert footprint.held_bytes == B and footprint.transfer.num_bytes == 3 * B  # frees its own block only
    assert alloc.swap_out([2]) == footprint.transfer
    assert [alloc.refcount(b) for b in shared] == [1, 1] and alloc.block_table(1)[:2] == shared
    assert alloc.swap_in([2]) is not None
    assert not set(alloc.block_table(2)) & set(alloc.block_table(1))  # private copies: keys stay with request 1
    alloc.free(1)
    assert alloc.allocate(3, shape(3, 40, 32)) == 2 * B and alloc.block_table(3)[:2] == shared


def test_decode_projection_counts_evictable_blocks_as_available_and_evicts_them_in_order():
    alloc = make(budget_blocks=4)
    assert alloc.allocate(1, shape(1, 33, 32)) == 0
    alloc.free(1)  # 2 cached, 2 free
    assert alloc.allocate(2, SeqShape(1, 200, 100)) == 0
    projection = alloc.project_decode([2], 99)
    assert projection.num_steps == 4 * B - 1  # 1 token + 63 more fill all 4 blocks, 2 of them evicted
    led = alloc.ledger()
    for step in range(projection.num_steps):
        assert alloc.append(2, 1)
        led = alloc.ledger()
        assert all(projection.ledgers[f][step] == getattr(led, f) for f in projection.ledgers)
    assert led.cached_bytes == 0 and alloc.num_evicted_blocks == 2


@pytest.mark.parametrize("max_steps", [15, 16, 33, paged.SHORT_PROJECTION_STEPS])
def test_a_short_projection_that_evicts_equals_the_array_projection(max_steps):
    """A few steps are projected in plain integers: where new blocks come from cached ones (evicted)
    as well as truly free ones, the same values as the arrays give, and as appends one by one."""
    alloc = make(budget_blocks=4)
    assert alloc.allocate(1, shape(1, 33, 32)) == 0
    alloc.free(1)  # 2 cached, 2 free
    assert alloc.allocate(2, SeqShape(1, 200, 100)) == 0
    short = alloc.project_decode([2], max_steps)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paged, "SHORT_PROJECTION_STEPS", 0)
        arrays = alloc.project_decode([2], max_steps)
    assert short.num_steps == arrays.num_steps == max_steps
    for name, values in short.ledgers.items():
        assert isinstance(values, list) and values == [int(v) for v in arrays.ledgers[name]], name
    for step in range(max_steps):
        assert alloc.append(2, 1)
        assert all(short.ledgers[f][step] == getattr(alloc.ledger(), f) for f in short.ledgers)
    assert alloc.num_evicted_blocks == (max_steps >= 32) + (max_steps >= 48)


# --- cache_duplicate_blocks: vLLM's BlockPool keeps a recomputed copy of a cached block cached ----


def make_vllm(budget_blocks: int) -> PagedAllocator:
    """Every full block keyed (generated ones too) and duplicates kept, as vLLM's prefix cache."""
    return PagedAllocator(
        PagedConfig(B, prefix_caching=True, cache_generated_blocks=True, cache_duplicate_blocks=True),
        budget_bytes=budget_blocks * B,
        kv_bytes_per_token=1,
    )


def test_a_recomputed_copy_of_a_cached_block_holds_its_key_beside_it_until_the_last_holder_goes():
    alloc = make_vllm(budget_blocks=4)
    assert alloc.allocate(1, shape(1, 32, 32)) == 0
    x0, x1 = alloc.block_table(1)
    alloc.free(1)  # queue: x1, x0
    # a fully cached prompt computes its last block again (see above): the copy takes the key too
    assert alloc.allocate(2, shape(2, 32, 32)) == B
    y1 = alloc.block_table(2)[1]
    assert alloc.block_key(y1) == alloc.block_key(x1) is not None
    alloc.free(2)
    assert alloc.cached_block_ids() == [x1, y1, x0]  # the copy is cached and evictable, not free
    check_cache(alloc, {})
    led = check_ledger(alloc)
    assert (led.free_bytes, led.cached_bytes) == (B, 3 * B)
    # a lookup takes the earliest holder: x1 comes back out of the queue, y1 stays there
    assert alloc.allocate(3, shape(3, 33, 32)) == 2 * B and alloc.block_table(3)[:2] == [x0, x1]
    assert alloc.cached_block_ids() == [y1]
    alloc.free(3)
    assert alloc.cached_block_ids() == [y1, x1, x0]
    # 2 blocks: the free one, then y1 evicted (the front); its key stays with x1
    assert alloc.allocate(4, SeqShape(2 * B, 4 * B, 2 * B)) == 0
    assert alloc.block_key(y1) is None and alloc.num_evicted_blocks == 1
    assert alloc.num_cached_tokens(shape(5, 33, 32)) == 2 * B
    alloc.free(4)
    # evicting the earliest holder hands the key to the next one in line
    assert alloc.allocate(6, shape(6, 32, 32)) == B  # x0 hit, a new copy y of block 1 (a duplicate)
    y = alloc.block_table(6)[1]
    assert alloc.allocate(7, SeqShape(2 * B, 4 * B, 2 * B)) == 0  # the free block, then x1 evicted
    assert alloc.block_key(x1) is None and alloc.block_key(y) is not None
    assert alloc.num_cached_tokens(shape(8, 33, 32)) == 2 * B  # block 1 is still found: in y
    check_cache(alloc, {6: 32, 7: 2 * B})


def test_without_duplicates_the_recomputed_copy_is_private_and_reused_first():
    alloc = make(budget_blocks=4)
    assert alloc.allocate(1, shape(1, 32, 32)) == 0
    x0, x1 = alloc.block_table(1)
    alloc.free(1)
    assert alloc.allocate(2, shape(2, 32, 32)) == B
    y1 = alloc.block_table(2)[1]
    alloc.free(2)
    assert alloc.block_key(y1) is None and alloc.cached_block_ids() == [x1, x0]
    assert alloc.allocate(3, SeqShape(2 * B, 4 * B, 2 * B)) == 0  # the free ones: y1 first
    assert alloc.block_table(3)[0] == y1 and alloc.num_evicted_blocks == 0


def own_tokens(request: int, tokens: int, final: int) -> SeqShape:
    """A request without prefix hashes: every full block has its own key (cache_generated_blocks)."""
    return SeqShape(tokens, 100, final, 1, 24, (), 0, request)


@pytest.mark.parametrize("duplicates, found_tokens", [(True, 8), (False, 16)])
def test_a_readmitted_request_finds_the_blocks_vllm_s_free_queue_left_it(duplicates, found_tokens):
    """The decision kvbench made differently from vLLM 0.33 (issue 45): a request preempted by
    recompute, readmitted, found one cached block more in kvbench.

    8-token blocks, 6 of them. R1 (a 16-token system prompt) leaves blocks 0 and 1 cached; P (24
    tokens of its own) holds 2, 3, 4 and is preempted: the queue is 1 0 4 3 2 (each request's tail
    first). R2 (the system prompt again) hits block 0 and, as a fully cached prompt must, computes
    block 1's content again in block 5. Freed, vLLM caches that copy behind P's blocks (queue
    1 4 3 2 5 0); a de-duplicating cache frees it (queue 1 4 3 2 0, block 5 free). Q then takes 3
    blocks: vLLM evicts 1, 4, 3, leaving P's first block only (8 tokens); the de-duplicating cache
    takes block 5 and evicts 1, 4, leaving P's first two (16 tokens)."""
    alloc = PagedAllocator(
        PagedConfig(8, prefix_caching=True, cache_generated_blocks=True, cache_duplicate_blocks=duplicates),
        budget_bytes=6 * 8,
        kv_bytes_per_token=1,
    )
    system = [SeqShape(16, 100, 16, 1, 16, prefix_hashes(16, 8, 2, 0, r), 8, r) for r in (0, 1)]
    assert alloc.allocate(1, system[0]) == 0 and alloc.block_table(1) == [0, 1]
    alloc.free(1)
    assert alloc.allocate(9, own_tokens(9, 24, 40)) == 0 and alloc.block_table(9) == [2, 3, 4]
    alloc.free(9)  # preempted by recompute
    assert alloc.cached_block_ids() == [1, 0, 4, 3, 2]
    assert alloc.allocate(2, system[1]) == 8 and alloc.block_table(2) == [0, 5]
    alloc.free(2)
    assert alloc.cached_block_ids() == ([1, 4, 3, 2, 5, 0] if duplicates else [1, 4, 3, 2, 0])
    assert alloc.allocate(3, own_tokens(3, 24, 24)) == 0
    assert alloc.block_table(3) == ([1, 4, 3] if duplicates else [5, 1, 4])
    alloc.free(3)
    # P comes back with one generated token more (25): at most 24 tokens can come from the cache
    assert alloc.allocate(9, own_tokens(9, 25, 40)) == found_tokens
    check_cache(alloc, {9: 25})
