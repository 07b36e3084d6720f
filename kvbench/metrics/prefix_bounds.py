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
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, OrderedDict
from collections.abc import Iterable

from kvbench.core.prefix import BlockKey, block_keys
from kvbench.core.request import Request

#: a next lookup that never comes
_NEVER = math.inf


def _lookup_and_insert_keys(
    requests: Iterable[Request], block_size_tokens: int
) -> list[tuple[list[BlockKey], list[BlockKey]]]:
    """Per request: the keys it may hit (full blocks within its first ``prompt - 1`` tokens) and
    the keys it inserts (every full block of its prompt); the first list is a prefix of the second."""
    out = []
    for r in requests:
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


def infinite_cache_hit_blocks(refs: list[tuple[list[BlockKey], list[BlockKey]]]) -> list[int]:
    """Blocks each request hits in a cache that keeps everything."""
    seen: set[BlockKey] = set()
    hits = []
    for lookup, inserted in refs:
        hits.append(_leading_hits(lookup, seen))
        seen.update(inserted)
    return hits


def lru_hit_blocks(refs: list[tuple[list[BlockKey], list[BlockKey]]], capacity_blocks: int) -> list[int]:
    """Blocks each request hits in an LRU cache of ``capacity_blocks`` blocks."""
    cache: OrderedDict[BlockKey, None] = OrderedDict()  # least recently used first
    hits = []
    for lookup, inserted in refs:
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


def belady_hit_blocks(refs: list[tuple[list[BlockKey], list[BlockKey]]], capacity_blocks: int) -> list[int]:
    """Blocks each request hits in a cache of ``capacity_blocks`` blocks run by Belady's rule: on a
    full cache, of the cached blocks and the one arriving, drop the one whose next lookup is furthest
    away (the deepest first among equals). A dropped arrival leaves the rest of its request's chain
    out too: those blocks cannot hit before it is cached again."""
    # next_lookup[i][key]: index of the first request after i that looks key up (a backward pass)
    next_lookup: list[dict[BlockKey, float]] = [{} for _ in refs]
    upcoming: dict[BlockKey, float] = {}
    for i in range(len(refs) - 1, -1, -1):
        lookup, inserted = refs[i]
        next_lookup[i] = {key: upcoming.get(key, _NEVER) for key in inserted}
        for key in lookup:
            upcoming[key] = i
    cached: dict[BlockKey, float] = {}  # key -> its next lookup
    heap: list[tuple[float, int, BlockKey]] = []  # (-next lookup, -block end, key); stale entries skipped
    hits = []
    for i, (lookup, inserted) in enumerate(refs):
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


def prefix_cache_bounds(requests: list[Request], block_size_tokens: int, capacity_blocks: int) -> dict:
    """The trace's prefix-cache hit rates (fractions of all prompt tokens): ``prefix_hit_rate_infinite``
    (no eviction), ``prefix_hit_rate_lru_offline`` and ``prefix_hit_rate_belady`` (at
    ``capacity_blocks``), in the model of this module's docstring; and ``prefix_note`` when the
    ceiling is 0 although requests do share prompt prefixes, saying why. Empty when no request
    carries prefix hashes (nothing to say) or there are no prompt tokens."""
    if block_size_tokens <= 0:
        raise ValueError(f"block_size_tokens must be positive, got {block_size_tokens}")
    total_tokens = sum(r.prompt_tokens for r in requests)
    if total_tokens <= 0 or not any(r.prefix_hashes for r in requests):
        return {}
    refs = _lookup_and_insert_keys(requests, block_size_tokens)
    rate = lambda hit_blocks: sum(hit_blocks) * block_size_tokens / total_tokens
    infinite = infinite_cache_hit_blocks(refs)
    distinct_blocks = len({key for _, inserted in refs for key in inserted})
    if sum(infinite) == 0 or capacity_blocks >= distinct_blocks:
        # nothing to hit, or room for every block: no policy ever evicts, all reach the ceiling
        # (a shortcut: long traces take seconds per policy)
        bounded = infinite if capacity_blocks > 0 else [0] * len(refs)
        lru, belady = bounded, bounded
    else:
        lru, belady = lru_hit_blocks(refs, capacity_blocks), belady_hit_blocks(refs, capacity_blocks)
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
