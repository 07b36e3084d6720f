"""How good a prefix cache could be on a trace: hit-rate bounds computed offline from the requests.

Three token-level hit rates, each ``hit prompt tokens / all prompt tokens`` over every request of
the trace (a request whose workload gives no ``prefix_hashes`` counts in the denominator and never
hits):

- **infinite**: a cache that never evicts. A request hits the blocks whose key (see
  :func:`kvbench.core.prefix.block_keys`) an earlier request already had. It is the ceiling no
  capacity or policy can beat.
- **LRU** and **Belady** at a capacity of ``C`` blocks, in a simplified cache model:

  * requests are served one at a time in arrival order; each first *looks up* its prompt's blocks
    and hits the longest run of leading blocks found in the cache (as vLLM and the paged allocator
    do: a prefix hit stops at the first miss), then *inserts* every full block of its prompt;
  * a lookup covers at most ``prompt - 1`` tokens, as the allocator's does: the last prompt token
    is always computed (its logits give the first output token), so a block ending exactly at the
    prompt's end is inserted but can never be hit by an identical prompt;
  * when the cache is full, each inserted block takes one cached block's place (LRU evicts its
    least recently used block; Belady may instead let the arriving block go, below): the cache
    never holds more than ``C`` blocks;
  * ``C`` is the whole KV budget in blocks. In a real run the running requests' blocks occupy part
    of that budget, so these are upper bounds for a cache of that size, not predictions.

  LRU orders a request's blocks as vLLM's free queue does (a finished request's blocks are
  queued tail first, so its deepest block is evicted before its first one). Belady's rule, on a
  full cache, drops whichever of the cached blocks and the arriving one is looked up next furthest
  in the future (the deepest first among equals; a dropped arrival takes the rest of its request's
  chain with it). Keys are chained, so a block is looked up no later than any block after it: the
  cache always holds whole prefixes, block hits are prefix hits, and the rule, which is optimal for
  block hits (Belady's MIN, with the arrival allowed to go), gives the best hit rate any policy can
  reach at capacity ``C`` (the tests check it against an exhaustive search). O(n log n) in the
  number of block references: a heap of next-lookup times with lazy deletion.

On a long trace the bounds take seconds (Mooncake's conversation trace at 16-token blocks: about
12 s on one core), so :func:`cached_prefix_cache_bounds` computes them once per content: the
requests' prompt lengths and prefix hashes (with their granularity), the block size, the capacity
and this code, hashed. The bounds do depend on the block size even when it divides the hash
granularity (a lookup stops at ``prompt - 1`` tokens, and the capacity in blocks changes with it):
the tests show one trace whose bounds differ at 16 and 64 tokens, so nothing is shared across
block sizes.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import heapq
import json
import math
import os
import stat
import sys
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TypeVar

from kvbench.core.prefix import BlockKey, block_keys
from kvbench.core.request import Request, RequestList
from kvbench.io.atomic import write_json

#: a next lookup that never comes
_NEVER = math.inf

#: how a long pass reports progress: ``progress(total, description)`` is a context manager that
#: yields ``advance(n)`` (:func:`kvbench.app.progress.progress_bar` binds it to a terminal's bar)
Progress = Callable[[int, str], AbstractContextManager[Callable[[int], None]]]
#: requests between two progress updates: often enough for a bar, rare enough to cost nothing
_TICK = 256
_T = TypeVar("_T")


def _ignore(n: int) -> None:
    pass


def _no_progress(total: int, description: str) -> AbstractContextManager[Callable[[int], None]]:
    return contextlib.nullcontext(_ignore)


def _ticking(items: Sequence[_T], advance: Callable[[int], None]) -> Iterator[_T]:
    """``items`` in order, telling ``advance`` every ``_TICK`` of them (and the rest at the end)."""
    for i, item in enumerate(items, 1):
        yield item
        if i % _TICK == 0:
            advance(_TICK)
    if len(items) % _TICK:
        advance(len(items) % _TICK)


def _lookup_and_insert_keys(
    requests: Sequence[Request], block_size_tokens: int, advance: Callable[[int], None] = _ignore
) -> list[tuple[list[BlockKey], list[BlockKey]]]:
    """Per request: the keys it may hit (full blocks within its first ``prompt - 1`` tokens) and
    the keys it inserts (every full block of its prompt); the first list is a prefix of the second."""
    out = []
    for r in _ticking(requests, advance):
        inserted = block_keys(r.prompt_tokens, r.prefix_hashes, r.hash_block_tokens, block_size_tokens)
        hittable = max(r.prompt_tokens - 1, 0) // block_size_tokens
        out.append((inserted[:hittable], inserted))
    return out


def _leading_hits(keys: list[BlockKey], cache) -> int:
    """How many of ``keys`` in a row, from the first, are in ``cache``."""
    hits = 0
    for key in keys:
        if key not in cache:
            break
        hits += 1
    return hits


def _infinite_cache(
    refs: list[tuple[list[BlockKey], list[BlockKey]]], advance: Callable[[int], None] = _ignore
) -> tuple[list[int], set[BlockKey]]:
    """Blocks each request hits in a cache that keeps everything, and the keys it ends with (every
    distinct block of the trace)."""
    seen: set[BlockKey] = set()
    hits = []
    for lookup, inserted in _ticking(refs, advance):
        hits.append(_leading_hits(lookup, seen))
        seen.update(inserted)
    return hits, seen


def infinite_cache_hit_blocks(refs: list[tuple[list[BlockKey], list[BlockKey]]]) -> list[int]:
    """Blocks each request hits in a cache that keeps everything."""
    return _infinite_cache(refs)[0]


def lru_hit_blocks(
    refs: list[tuple[list[BlockKey], list[BlockKey]]], capacity_blocks: int, advance: Callable[[int], None] = _ignore
) -> list[int]:
    """Blocks each request hits in an LRU cache of ``capacity_blocks`` blocks."""
    cache: OrderedDict[BlockKey, None] = OrderedDict()  # least recently used first
    hits = []
    for lookup, inserted in _ticking(refs, advance):
        hits.append(_leading_hits(lookup, cache))
        if capacity_blocks <= 0:
            continue
        for key in inserted:
            if key in cache:
                cache.move_to_end(key)
                continue
            if len(cache) >= capacity_blocks:
                cache.popitem(last=False)
            cache[key] = None
        # the request's blocks become most recent tail first: its first block is evicted last
        for key in reversed(inserted):
            if key in cache:
                cache.move_to_end(key)
    return hits


def belady_hit_blocks(
    refs: list[tuple[list[BlockKey], list[BlockKey]]], capacity_blocks: int, advance: Callable[[int], None] = _ignore
) -> list[int]:
    """Blocks each request hits in a cache of ``capacity_blocks`` blocks run by Belady's rule: on a
    full cache, of the cached blocks and the one arriving, drop the one whose next lookup is furthest
    away (the deepest first among equals). A dropped arrival leaves the rest of its request's chain
    out too: those blocks cannot hit before it is cached again. ``advance`` is told of each request
    twice: once by the backward pass, once by the forward one."""
    # next_lookup[i][key]: index of the first request after i that looks key up (a backward pass)
    next_lookup: list[dict[BlockKey, float]] = [{} for _ in refs]
    upcoming: dict[BlockKey, float] = {}
    for i in _ticking(range(len(refs) - 1, -1, -1), advance):
        lookup, inserted = refs[i]
        next_lookup[i] = {key: upcoming.get(key, _NEVER) for key in inserted}
        for key in lookup:
            upcoming[key] = i
    cached: dict[BlockKey, float] = {}  # key -> its next lookup
    heap: list[tuple[float, int, BlockKey]] = []  # (-next lookup, -block end, key); stale entries skipped
    hits = []
    for i, (lookup, inserted) in enumerate(_ticking(refs, advance)):
        hits.append(_leading_hits(lookup, cached))
        if capacity_blocks <= 0:
            continue
        upcoming = next_lookup[i]
        # first move every cached block of this request to its next lookup, so that all recorded
        # next lookups lie after now (a block's is then never later than its descendants')
        for key in inserted:
            if key in cached:
                cached[key] = upcoming[key]
                heapq.heappush(heap, (-upcoming[key], -key[1], key))
        for key in inserted:
            if key in cached:
                continue
            nxt = upcoming[key]
            if len(cached) >= capacity_blocks:
                while cached.get(heap[0][2]) != -heap[0][0]:  # left by an earlier next lookup or eviction
                    heapq.heappop(heap)
                neg_next, neg_end, victim = heap[0]
                if (nxt, key[1]) >= (-neg_next, -neg_end):
                    break  # the arriving block is needed last: it goes, and its descendants with it
                heapq.heappop(heap)
                del cached[victim]
            cached[key] = nxt
            heapq.heappush(heap, (-nxt, -key[1], key))
    return hits


def _shared_prefix_tokens(requests: list[Request]) -> int:
    """The longest prompt prefix (tokens) that two requests share according to their hash ids; 0 if none."""
    covered: dict[int, int] = {}  # hash id -> fewest tokens it covers in any request holding it
    holders: Counter[int] = Counter()
    for r in requests:
        g = r.hash_block_tokens
        for index, hash_id in enumerate(dict.fromkeys(r.prefix_hashes)):
            holders[hash_id] += 1
            tokens = min((index + 1) * g, r.prompt_tokens)
            covered[hash_id] = min(covered.get(hash_id, tokens), tokens)
    return max((covered[h] for h, n in holders.items() if n > 1), default=0)


def any_prefix_hashes(requests: Sequence[Request]) -> bool:
    """Whether some request says what its prompt holds (prefix hashes): without it the trace has
    nothing to bound. A workload's request list answers from its column, without making every
    request (a 100,000-request trace without prompt content made 300,000 to learn that)."""
    if isinstance(requests, RequestList):
        return requests.any_prefix_hashes()
    return any(r.prefix_hashes for r in requests)


def prefix_cache_bounds(
    requests: list[Request], block_size_tokens: int, capacity_blocks: int, *, progress: Progress | None = None
) -> dict:
    """The trace's prefix-cache hit rates (fractions of all prompt tokens): ``prefix_hit_rate_infinite``
    (no eviction), ``prefix_hit_rate_lru_offline`` and ``prefix_hit_rate_belady`` (at
    ``capacity_blocks``), in the model of this module's docstring; and ``prefix_note`` when the
    ceiling is 0 although requests do share prompt prefixes, saying why. Empty when no request
    carries prefix hashes (nothing to say) or there are no prompt tokens. ``progress`` shows each
    pass over the requests (keys, ceiling, LRU, Belady), each with its total."""
    if block_size_tokens <= 0:
        raise ValueError(f"block_size_tokens must be positive, got {block_size_tokens}")
    if not any_prefix_hashes(requests):
        return {}
    total_tokens = sum(r.prompt_tokens for r in requests)
    if total_tokens <= 0:
        return {}
    phase = progress or _no_progress
    n = len(requests)
    with phase(n, "prefix bounds 1/4: block keys") as advance:
        refs = _lookup_and_insert_keys(requests, block_size_tokens, advance)
    rate = lambda hit_blocks: sum(hit_blocks) * block_size_tokens / total_tokens
    with phase(n, "prefix bounds 2/4: ceiling") as advance:
        # the infinite cache ends holding every block once: their count, without a second pass
        infinite, every_block = _infinite_cache(refs, advance)
    distinct_blocks = len(every_block)
    if sum(infinite) == 0 or capacity_blocks >= distinct_blocks:
        # nothing to hit, or room for every block: no policy ever evicts, all reach the ceiling
        # (a shortcut: long traces take seconds per policy)
        bounded = infinite if capacity_blocks > 0 else [0] * len(refs)
        lru, belady = bounded, bounded
    else:
        with phase(n, "prefix bounds 3/4: LRU") as advance:
            lru = lru_hit_blocks(refs, capacity_blocks, advance)
        with phase(2 * n, "prefix bounds 4/4: Belady") as advance:
            belady = belady_hit_blocks(refs, capacity_blocks, advance)
    out: dict[str, float | str] = {
        "prefix_hit_rate_infinite": rate(infinite),
        "prefix_hit_rate_lru_offline": rate(lru),
        "prefix_hit_rate_belady": rate(belady),
    }
    shared_tokens = _shared_prefix_tokens(requests)
    if sum(infinite) == 0 and shared_tokens > 0:
        keys = Counter(key for _, inserted in refs for key in inserted)
        if not any(n > 1 for n in keys.values()):
            out["prefix_note"] = (
                f"hit rate 0: prompts share at most {shared_tokens:,d} tokens, less than one "
                f"{block_size_tokens}-token block (only full blocks are cached)"
            )
        else:
            out["prefix_note"] = (
                f"hit rate 0: the only shared {block_size_tokens}-token blocks end at the prompt's last token, "
                "which is always computed"
            )
    return out


#: bumped when the cached files' layout changes (the code's own digest covers changes of the numbers)
_CACHE_FORMAT = 1
#: names of a cached result's values: the three rates, always together, and the optional note
_RATES = ("prefix_hit_rate_infinite", "prefix_hit_rate_lru_offline", "prefix_hit_rate_belady")
_NOTE = "prefix_note"
#: bounds computed in this process, by key (a sweep run by Hydra's basic launcher shares them
#: without reading a file); a few, so that a long Python session does not hoard them
_MEMO: OrderedDict[str, dict] = OrderedDict()
_MEMO_ENTRIES = 8


@functools.cache
def _code_digest() -> str:
    """The sha256 of the code that computes the bounds (this module and the block identities it
    reads): an edit to either changes every key, so no cached number outlives the code behind it."""
    from kvbench.core import prefix

    digest = hashlib.sha256()
    for module in (sys.modules[__name__], prefix):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def bounds_key(requests: Sequence[Request], block_size_tokens: int, capacity_blocks: int) -> str:
    """A content hash of everything the bounds depend on: each request's prompt length, hash
    granularity and prefix hashes, in order; the block size; the capacity in blocks; the code. Two
    runs with the same key get the same bounds, whatever their trace file, allocator or scheduler."""
    digest = hashlib.sha256(f"kvbench prefix bounds {_CACHE_FORMAT} {_code_digest()}\n".encode())
    digest.update(f"{block_size_tokens} {capacity_blocks} {len(requests)}\n".encode())
    for r in requests:
        digest.update(f"{r.prompt_tokens} {r.hash_block_tokens} {','.join(map(str, r.prefix_hashes))}\n".encode())
    return digest.hexdigest()


def cache_file(cache_dir: Path, key: str) -> Path:
    """Where the bounds of ``key`` are kept in ``cache_dir``."""
    return cache_dir / f"prefix-bounds-{key}.json"


def _valid(bounds: object) -> bool:
    """Whether ``bounds`` is what :func:`prefix_cache_bounds` returns: {} or the three rates as
    floats, with an optional note."""
    if not isinstance(bounds, dict) or not bounds:
        return bounds == {}
    rates_ok = all(type(bounds.get(name)) is float for name in _RATES)
    return rates_ok and set(bounds) <= {*_RATES, _NOTE} and isinstance(bounds.get(_NOTE, ""), str)


def _read_cached(path: Path, key: str) -> dict | None:
    """The bounds kept in ``path`` for ``key``; None when the file is absent, unreadable, damaged,
    or holds another key (then they are computed again and the file rewritten)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or not _valid(data.get("bounds")):
        return None
    return data["bounds"]


@contextlib.contextmanager
def _one_at_a_time(path: Path) -> Iterator[None]:
    """Held while a process computes the bounds kept in ``path``: another job of the sweep (a
    launcher's worker starting at the same moment) waits for them instead of computing them too.
    The kernel drops the lock however its holder ends, so a killed job never blocks the others. Best
    effort: where a lock cannot be taken (a network filesystem without ``flock``), each computes."""
    try:
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):  # never wait on a FIFO or a device left there
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock; the empty file stays, so that no waiter locks a removed one


def _remember(key: str, bounds: dict) -> None:
    _MEMO[key] = dict(bounds)
    _MEMO.move_to_end(key)
    while len(_MEMO) > _MEMO_ENTRIES:
        _MEMO.popitem(last=False)


def cached_prefix_cache_bounds(
    requests: list[Request],
    block_size_tokens: int,
    capacity_blocks: int,
    *,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> dict:
    """:func:`prefix_cache_bounds`, computed once per :func:`bounds_key`: kept in this process, and
    in ``cache_dir`` (a sweep's folder, which every job of the sweep reads, whichever process or
    machine runs it) as one small JSON file per key, written whole or not at all. A damaged or
    unreadable file is ignored and computed again; a folder that cannot be written only costs the
    next job the computation. JSON keeps every float exactly, so a cached result is bit-identical."""
    if block_size_tokens <= 0 or not any_prefix_hashes(requests):
        return prefix_cache_bounds(requests, block_size_tokens, capacity_blocks)  # an error, or {} at once
    key = bounds_key(requests, block_size_tokens, capacity_blocks)
    if key in _MEMO:
        _MEMO.move_to_end(key)
        return dict(_MEMO[key])
    if cache_dir is None:
        bounds = prefix_cache_bounds(requests, block_size_tokens, capacity_blocks, progress=progress)
    else:
        path = cache_file(cache_dir, key)
        bounds = _read_cached(path, key)
        if bounds is None:
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
            with _one_at_a_time(path):
                bounds = _read_cached(path, key)  # written meanwhile by the job this one waited for
                if bounds is None:
                    bounds = prefix_cache_bounds(requests, block_size_tokens, capacity_blocks, progress=progress)
                    _keep(path, key, bounds, block_size_tokens, capacity_blocks, len(requests))
    _remember(key, bounds)
    return dict(bounds)


def _keep(path: Path, key: str, bounds: dict, block_size_tokens: int, capacity_blocks: int, num_requests: int) -> None:
    """Write ``bounds`` into ``path``, whole or not at all (what they are: for a person reading it)."""
    record = {
        "key": key,
        "block_size_tokens": block_size_tokens,
        "capacity_blocks": capacity_blocks,
        "num_requests": num_requests,
        "bounds": bounds,
    }
    try:
        write_json(path, record)
    except OSError:
        pass  # only an optimization: the run has its numbers, the next job computes them again
