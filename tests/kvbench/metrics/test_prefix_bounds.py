"""Offline prefix-cache bounds on hand-built traces whose hits were worked out on paper, and Belady's
rule against an exhaustive search of every eviction choice."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from functools import cache

import pytest
from hang import HANG_S

from kvbench.core.request import Request
from kvbench.metrics import prefix_bounds
from kvbench.metrics.prefix_bounds import (
    _lookup_and_insert_keys,
    belady_hit_blocks,
    bounds_key,
    cache_file,
    cached_prefix_cache_bounds,
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


# --- the bounds depend on the block size, even below the hash granule -----------------------------


def test_the_bounds_differ_between_block_sizes_that_divide_the_hash_granule():
    """Why the cache key holds the block size: with 512-token hashes (Mooncake's), 16- and 64-token
    blocks give other bounds for the same requests. A lookup covers ``prompt - 1`` tokens, so an
    identical 1,024-token prompt hits 63 blocks of 16 (1,008 tokens) but 15 of 64 (960 tokens). (The
    capacity differs too: a budget rounded down to whole blocks holds other token counts.) On
    Mooncake's conversation trace the ceiling is 0.38388 at 16, 0.38385 at 64, 0.38373 at 256."""
    requests = [req(i, 1024, (1, 2), granule=512) for i in range(2)]
    at_16 = prefix_cache_bounds(requests, 16, 10**6)
    at_64 = prefix_cache_bounds(requests, 64, 10**6)
    assert at_16["prefix_hit_rate_infinite"] == 1008 / 2048
    assert at_64["prefix_hit_rate_infinite"] == 960 / 2048


# --- computed once: the cache -----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fresh_memo(monkeypatch):
    """Each test starts with nothing computed in this process."""
    monkeypatch.setattr(prefix_bounds, "_MEMO", type(prefix_bounds._MEMO)())


@pytest.fixture
def computations(monkeypatch):
    """The (block size, capacity) of every computation of the bounds (cache misses), in order."""
    calls = []
    compute = prefix_bounds.prefix_cache_bounds

    def counted(requests, block_size_tokens, capacity_blocks, **kwargs):
        calls.append((block_size_tokens, capacity_blocks))
        return compute(requests, block_size_tokens, capacity_blocks, **kwargs)

    monkeypatch.setattr(prefix_bounds, "prefix_cache_bounds", counted)
    return calls


TRACE = trace(A, Bc, C, A, Bc, A)


def forget() -> None:
    """What another process starts with: nothing in memory (the cache folder is all it shares)."""
    prefix_bounds._MEMO.clear()


def test_a_sweep_s_jobs_compute_the_bounds_once(tmp_path, computations):
    first = cached_prefix_cache_bounds(TRACE, B, 2, cache_dir=tmp_path)
    assert first == prefix_cache_bounds(TRACE, B, 2)
    forget()
    again = cached_prefix_cache_bounds(TRACE, B, 2, cache_dir=tmp_path)
    assert again == first and computations == [(B, 2)]
    assert list(tmp_path.glob("*.json")) == [cache_file(tmp_path, bounds_key(TRACE, B, 2))]
    # another capacity or block size is another computation, another file
    cached_prefix_cache_bounds(TRACE, B, 4, cache_dir=tmp_path)
    cached_prefix_cache_bounds(TRACE, 2, 4, cache_dir=tmp_path)
    assert computations == [(B, 2), (B, 4), (2, 4)] and len(list(tmp_path.glob("*.json"))) == 3


def test_a_job_waits_for_the_one_computing_the_same_bounds(tmp_path, computations):
    """Two workers of a launcher reaching the same bounds at once: the second waits for the first's
    file instead of computing them too. Here the test holds the lock as the first worker would, and
    writes (distinctive) bounds before letting go: the waiting job takes them, computing nothing."""
    import fcntl
    import os
    import threading

    key = bounds_key(TRACE, B, 2)
    path = cache_file(tmp_path, key)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    got = []
    waiting = threading.Thread(target=lambda: got.append(cached_prefix_cache_bounds(TRACE, B, 2, cache_dir=tmp_path)))
    waiting.start()
    planted = {name: 0.5 for name in prefix_bounds._RATES}
    path.write_text(json.dumps({"key": key, "bounds": planted}))
    os.close(fd)  # the first worker is done
    waiting.join(timeout=HANG_S)
    assert got == [planted] and computations == []


def test_in_one_process_the_bounds_are_kept_without_a_folder(computations):
    first = cached_prefix_cache_bounds(TRACE, B, 2)
    first["prefix_hit_rate_belady"] = -1.0  # a caller changing its copy changes nothing kept
    assert cached_prefix_cache_bounds(TRACE, B, 2) == prefix_cache_bounds(TRACE, B, 2)
    assert computations == [(B, 2)]


def test_a_cached_result_is_bit_identical(tmp_path):
    """JSON writes a float's shortest repr, which reads back to the very same double."""
    requests = [req(i, 7 + i % 11, (i % 3, 5 + i % 2, 9), granule=3) for i in range(40)]
    computed = cached_prefix_cache_bounds(requests, 2, 7, cache_dir=tmp_path)
    forget()
    read = cached_prefix_cache_bounds(requests, 2, 7, cache_dir=tmp_path)
    assert all(type(value) is float for value in read.values())
    assert [value.hex() for value in read.values()] == [value.hex() for value in computed.values()]


def test_the_key_is_what_the_bounds_depend_on():
    key = bounds_key(TRACE, B, 2)
    # the same prompts arriving at other times, with other ids and outputs: the same bounds, one key
    other_run = [
        dataclasses.replace(r, request_id=100 + i, arrival_s=3.5 * i, branch_output_tokens=(99,))
        for i, r in enumerate(TRACE)
    ]
    assert bounds_key(other_run, B, 2) == key
    changed = [
        bounds_key(TRACE, B, 3),  # capacity
        bounds_key(TRACE, 2, 2),  # block size
        bounds_key(TRACE[::-1], B, 2),  # order
        bounds_key([dataclasses.replace(TRACE[0], prompt_tokens=10), *TRACE[1:]], B, 2),  # a prompt's length
        bounds_key([dataclasses.replace(TRACE[0], hash_block_tokens=2), *TRACE[1:]], B, 2),  # the granularity
        bounds_key([dataclasses.replace(TRACE[0], prefix_hashes=(10, 11, 13)), *TRACE[1:]], B, 2),  # a hash
        bounds_key(TRACE[:-1], B, 2),  # one request fewer
    ]
    assert len({key, *changed}) == 1 + len(changed)


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # cut short
        lambda text: "\x00\xff not json",
        lambda text: "[]",
        lambda text: text.replace('"prefix_hit_rate_belady"', '"prefix_hit_rate_beladi"'),
        lambda text: json.dumps({**json.loads(text), "key": "0" * 64}),  # another key's file
        lambda text: json.dumps({**json.loads(text), "bounds": {"prefix_hit_rate_infinite": "0.5"}}),
    ],
)
def test_a_damaged_cache_file_is_ignored_and_written_again(tmp_path, computations, damage):
    cached_prefix_cache_bounds(TRACE, B, 2, cache_dir=tmp_path)
    path = cache_file(tmp_path, bounds_key(TRACE, B, 2))
    path.write_text(damage(path.read_text()))
    forget()
    assert cached_prefix_cache_bounds(TRACE, B, 2, cache_dir=tmp_path) == prefix_cache_bounds(TRACE, B, 2)
    assert computations == [(B, 2), (B, 2)]  # computed again
    assert json.loads(path.read_text())["bounds"] == prefix_cache_bounds(TRACE, B, 2)  # and repaired


def test_a_folder_that_cannot_be_written_only_costs_the_computation(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # the cache folder's place is taken by a file: mkdir fails
    assert cached_prefix_cache_bounds(TRACE, B, 2, cache_dir=blocked / "cache") == prefix_cache_bounds(TRACE, B, 2)


def test_a_trace_without_hashes_is_not_cached(tmp_path, computations):
    assert cached_prefix_cache_bounds(trace((), ()), B, 2, cache_dir=tmp_path) == {}
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="block_size_tokens must be positive"):
        cached_prefix_cache_bounds(TRACE, 0, 2, cache_dir=tmp_path)


# --- progress: each pass with its total --------------------------------------------------------------


def recording_progress(log: list):
    """A progress that records, per pass, its total, its description and the steps it was told of."""

    @contextlib.contextmanager
    def progress(total, description):
        steps = []
        yield steps.append
        log.append((description, total, sum(steps)))

    return progress


def test_every_pass_reports_its_total_and_reaches_it():
    requests = [req(i, 9 + i % 600, (i % 5, 7, 8), granule=4) for i in range(1000)]  # more than one tick
    log = []
    prefix_cache_bounds(requests, B, 2, progress=recording_progress(log))
    assert log == [
        ("prefix bounds 1/4: block keys", 1000, 1000),
        ("prefix bounds 2/4: ceiling", 1000, 1000),
        ("prefix bounds 3/4: LRU", 1000, 1000),
        ("prefix bounds 4/4: Belady", 2000, 2000),  # a backward pass, then the forward one
    ]
    # room for every block: no policy evicts, the last two passes are not needed
    log.clear()
    prefix_cache_bounds(requests, B, 10**6, progress=recording_progress(log))
    assert [description for description, _, _ in log] == ["prefix bounds 1/4: block keys", "prefix bounds 2/4: ceiling"]


def test_a_cached_result_shows_no_progress(tmp_path):
    cached_prefix_cache_bounds(TRACE, B, 2, cache_dir=tmp_path)
    forget()
    log = []
    cached_prefix_cache_bounds(TRACE, B, 2, cache_dir=tmp_path, progress=recording_progress(log))
    assert log == []
