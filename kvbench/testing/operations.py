"""Random allocator operations, applied as a scheduler would, each checked as it is made
(:func:`run_operations`): the hypothesis strategies that draw them and the model of the
sequences the allocator was handed."""

from __future__ import annotations

import copy

import pytest
from hypothesis import strategies as st

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.core.prefix import block_keys
from kvbench.memory.allocator import Allocator, Refusal, SeqShape
from kvbench.testing.cache_checks import cache_queue, check_cache, key_map
from kvbench.testing.invariants import PROBE_SHAPE, check_invariants, check_ledger, is_grouped, snapshot

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


def run_operations(
    alloc: Allocator, operations: list[tuple], granule_tokens: int = 8, shared_granules: tuple[int, ...] = (0, 1, 4, 40)
) -> None:
    """Apply ``operations`` (see :data:`OPERATIONS`, :data:`CACHING_OPERATIONS`) as a scheduler
    would, checking after each one, then free everything and check that the cache is exactly as it
    was when empty (a caching allocator: that nothing is held and every block is free or cached).
    ``granule_tokens`` and ``shared_granules`` (tokens per hash granule, and how many granules
    each prefix of the pool shares) shape the prompts of caching operations."""
    caching = alloc.capabilities.caches_prefixes
    empty = snapshot(alloc, [])
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
        assert snapshot(alloc, []) == empty, "freeing everything did not give back the empty cache"
        return
    check_cache(alloc, {})
    led = check_ledger(alloc)
    assert led.allocated_bytes == 0, "freeing everything left blocks held"
    assert led.free_bytes + led.cached_bytes == empty[0].free_bytes, "a block was lost: free + cached != all"
    if is_grouped(alloc):
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
    assert snapshot(alloc, []) == empty, "freeing everything did not give back the empty cache"


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
            keys_before = key_map(alloc) if alloc.capabilities.caches_prefixes else {}
        keep_free_bytes = int(keep_fraction * alloc.budget_bytes)
        before = snapshot(alloc, live)
        said = alloc.num_cached_tokens(shape)
        assert snapshot(alloc, live) == before, "num_cached_tokens changed something"
        cached = alloc.allocate(model.next_seq_id, shape, keep_free_bytes)
        if cached is None:
            assert snapshot(alloc, live) == before, "a refused allocate changed something"
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
        before = snapshot(alloc, live)
        transfer = alloc.swap_in([s for s, _, _ in members], int(op[2] * alloc.budget_bytes))
        if transfer is None:
            assert snapshot(alloc, live) == before, "a refused swap_in changed something"
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
    assert snapshot(alloc, live) == snapshot(twin, live), "append_each left another state than the appends"
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
    if is_grouped(alloc):  # every group's hit blocks are its cached ones, keyed (group, prefix key)
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
