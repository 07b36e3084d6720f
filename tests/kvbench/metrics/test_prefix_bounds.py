"""Offline prefix-cache bounds on hand-built traces whose hits were worked out on paper, and Belady's
rule against an exhaustive search of every eviction choice."""

from __future__ import annotations

import random
from functools import cache

import pytest

from kvbench.core.request import Request
from kvbench.metrics.prefix_bounds import (
    _lookup_and_insert_keys,
    belady_hit_blocks,
    infinite_cache_hit_blocks,
    lru_hit_blocks,
    prefix_cache_bounds,
)

B = 4  # block size (tokens) of the hand-built traces, and their hash granule


def req(i: int, prompt: int, hashes: tuple[int, ...], granule: int = B) -> Request:
    return Request(i, float(i), prompt, prompt + 8, (8,), prefix_hashes=hashes, hash_block_tokens=granule)


# three unrelated 9-token prompts: two full blocks each (keys (h1, 4), (h2, 8)) and one token more,
# so a lookup (at most 8 tokens) covers both blocks
A, Bc, C = (10, 11, 12), (20, 21, 22), (30, 31, 32)


def trace(*chains):
    return [req(i, 9, chain) for i, chain in enumerate(chains)]


def hits(requests, capacity):
    refs = _lookup_and_insert_keys(requests, B)
    return infinite_cache_hit_blocks(refs), lru_hit_blocks(refs, capacity), belady_hit_blocks(refs, capacity)


def test_a_b_c_a_b_a_with_room_for_one_prompt():
    # capacity 2 blocks: LRU always holds the previous prompt, and every request differs from it.
    # Belady keeps A (looked up at 3 and 5) and lets B (next at 4, after A's 3) and C (never) go.
    infinite, lru, belady = hits(trace(A, Bc, C, A, Bc, A), 2)
    assert infinite == [0, 0, 0, 2, 2, 2]
    assert lru == [0, 0, 0, 0, 0, 0]
    assert belady == [0, 0, 0, 2, 0, 2]
    bounds = prefix_cache_bounds(trace(A, Bc, C, A, Bc, A), B, 2)
    assert bounds == {  # 6 requests x 9 prompt tokens = 54
        "prefix_hit_rate_infinite": 6 * 4 / 54,
        "prefix_hit_rate_lru_offline": 0.0,
        "prefix_hit_rate_belady": 4 * 4 / 54,
    }


def test_with_room_for_two_prompts_belady_reaches_the_ceiling():
    # capacity 4: C (never looked up again) arrives into a full cache {A, B} and is let go
    infinite, lru, belady = hits(trace(A, Bc, C, A, Bc, A), 4)
    assert belady == infinite == [0, 0, 0, 2, 2, 2]
    # LRU: C evicts A, A evicts B, B evicts C; only the last A finds itself (after B, A is recent)
    assert lru == [0, 0, 0, 0, 0, 2]


def test_lru_evicts_a_prompts_tail_before_its_head():
    # capacity 3. After A: [A2, A1] (LRU first). B inserts B1, then B2 evicts A2, and B's blocks go
    # to the recent end tail first: [A1, B2, B1]. A hits A1 (1 block), re-inserts A2 evicting B2:
    # [B1, A2, A1]. B hits B1. An LRU queuing blocks head first would have evicted A1 instead: 0 hits.
    infinite, lru, belady = hits(trace(A, Bc, A, Bc), 3)
    assert lru == [0, 0, 1, 1]
    # Belady: B2 (next at 3, deeper than B1) arrives into {A1, A2, B1} and goes; A hits both blocks;
    # then B hits B1 and B2 misses.
    assert belady == [0, 0, 2, 1]
    assert infinite == [0, 0, 2, 2]


def test_the_last_prompt_token_is_always_computed():
    # two identical 8-token prompts: both blocks cached, but a lookup covers 7 tokens: one block
    assert prefix_cache_bounds([req(0, 8, (10, 11)), req(1, 8, (10, 11))], B, 100)["prefix_hit_rate_infinite"] == 4 / 16
    # identical one-block prompts never hit, and the note says why (not the block size)
    bounds = prefix_cache_bounds([req(0, 4, (10,)), req(1, 4, (10,))], B, 100)
    assert bounds["prefix_hit_rate_infinite"] == 0.0
    assert "end at the prompt's last token" in bounds["prefix_note"]


def test_a_shared_prefix_shorter_than_a_block_gives_0_and_says_why():
    # 20-token prompts sharing their first 4-token granule only
    requests = [req(0, 20, (10, 11, 12, 13, 14)), req(1, 20, (10, 21, 22, 23, 24))]
    at_16 = prefix_cache_bounds(requests, 16, 100)
    assert at_16["prefix_hit_rate_infinite"] == at_16["prefix_hit_rate_belady"] == 0.0
    assert at_16["prefix_note"] == (
        "hit rate 0: prompts share at most 4 tokens, less than one 16-token block (only full blocks are cached)"
    )
    at_4 = prefix_cache_bounds(requests, 4, 100)
    assert at_4["prefix_hit_rate_infinite"] == 4 / 40 and "prefix_note" not in at_4


def test_blocks_finer_than_the_hash_granule():
    # granule 8, blocks 4: 16-token prompts sharing their first granule share two blocks
    requests = [req(0, 16, (10, 11), granule=8), req(1, 16, (10, 12), granule=8)]
    assert prefix_cache_bounds(requests, 4, 100)["prefix_hit_rate_infinite"] == 8 / 32
    # 16-token blocks span both granules: nothing shared
    assert prefix_cache_bounds(requests, 16, 100)["prefix_hit_rate_infinite"] == 0.0


def test_no_hashes_or_no_tokens_say_nothing():
    assert prefix_cache_bounds([req(0, 9, ()), req(1, 9, ())], B, 10) == {}
    assert prefix_cache_bounds([], B, 10) == {}
    # a request without hashes still counts in the denominator
    bounds = prefix_cache_bounds([req(0, 9, A), req(1, 9, A), req(2, 18, ())], B, 10)
    assert bounds["prefix_hit_rate_infinite"] == 8 / 36
    # capacity 0 caches nothing
    assert prefix_cache_bounds([req(0, 9, A), req(1, 9, A)], B, 0)["prefix_hit_rate_belady"] == 0.0


# --- Belady against every possible eviction choice ------------------------------------------------


def _optimal_hit_blocks(refs, capacity: int) -> int:
    """The most prefix-hit blocks any policy reaches: at each missing insertion, try dropping the
    arrival or (cache full) evicting each cached block; lookups hit leading blocks only."""

    @cache
    def best(i: int, j: int, cache: frozenset) -> int:
        if i == len(refs):
            return 0
        lookup, inserted = refs[i]
        gained = 0
        if j == 0:
            for key in lookup:
                if key not in cache:
                    break
                gained += 1
        while j < len(inserted) and inserted[j] in cache:
            j += 1
        if j == len(inserted):
            return gained + best(i + 1, 0, cache)
        key = inserted[j]
        options = [best(i, j + 1, cache)]  # let it go
        if len(cache) < capacity:
            options.append(best(i, j + 1, cache | {key}))
        else:
            options += [best(i, j + 1, (cache - {victim}) | {key}) for victim in cache]
        return gained + max(options)

    # j == 0 marks the lookup; a request whose blocks are all cached moves on with j == len
    return best(0, 0, frozenset())


@pytest.mark.parametrize("seed", range(40))
def test_belady_matches_an_exhaustive_search_and_bounds_lru(seed):
    rng = random.Random(seed)
    chain_ids: dict[tuple, int] = {}
    requests = []
    granule = rng.choice((2, 4, 8))  # finer than, equal to and coarser than the 4-token block
    for i in range(rng.randint(4, 7)):
        prompt = rng.randint(3, 13)
        hashes, path = [], ()
        for _ in range(-(-prompt // granule)):
            path += (rng.randint(0, 1),)  # two choices per granule: prefixes share often
            hashes.append(chain_ids.setdefault(path, len(chain_ids)))
        requests.append(req(i, prompt, tuple(hashes), granule))
    capacity = rng.randint(1, 4)
    refs = _lookup_and_insert_keys(requests, B)
    belady = sum(belady_hit_blocks(refs, capacity))
    assert belady == _optimal_hit_blocks(refs, capacity)
    assert sum(lru_hit_blocks(refs, capacity)) <= belady <= sum(infinite_cache_hit_blocks(refs))


@pytest.mark.parametrize("seed", range(10))
def test_the_room_for_everything_shortcut_gives_what_the_policies_give(seed):
    rng = random.Random(seed)
    requests = [
        req(i, rng.randint(5, 13), (rng.randint(0, 1), rng.randint(2, 3), rng.randint(4, 5), 6)) for i in range(8)
    ]
    refs = _lookup_and_insert_keys(requests, B)
    total = sum(r.prompt_tokens for r in requests)
    bounds = prefix_cache_bounds(requests, B, 10**6)
    assert bounds["prefix_hit_rate_lru_offline"] == sum(lru_hit_blocks(refs, 10**6)) * B / total
    assert bounds["prefix_hit_rate_belady"] == sum(belady_hit_blocks(refs, 10**6)) * B / total
