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
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.memory.allocator import Allocator, Refusal, SeqShape
from kvbench.memory.ledger import LEDGER_FIELDS, MemoryLedger

#: (budget_bytes, kv_bytes_per_token) -> a fresh allocator
AllocatorFactory = Callable[[int, int], Allocator]

#: a mid-sized request whose reservation decides what the ledger calls externally fragmented
PROBE_SHAPE = SeqShape(num_tokens=8, s_max_tokens=96, final_kv_tokens=60)

# One operation:
#   ("allocate", prompt_tokens, output_tokens, extra_declared_tokens, keep_free_fraction, num_branches)
#   ("append", which_seq, num_tokens, tokens_per_call)     ("fork", which_seq, child_extra_tokens or None)
#   ("free", which_seq)   ("swap_out", which_seq)   ("swap_in", which_family, keep_free_fraction)
#   ("project", max_steps)   ("truncate", which_seq, tokens_to_append_then_take_back)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), st.integers(1, 160), st.integers(1, 160), st.integers(0, 64),
                  st.sampled_from([0.0, 0.0, 0.05, 0.5]), st.sampled_from([1, 1, 1, 2, 3])),
        st.tuples(st.just("append"), st.integers(0, 31), st.integers(1, 40), st.sampled_from([1, 7, 40])),
        st.tuples(st.just("fork"), st.integers(0, 31), st.one_of(st.none(), st.integers(0, 80))),
        st.tuples(st.just("free"), st.integers(0, 31)),
        st.tuples(st.just("swap_out"), st.integers(0, 31)),
        st.tuples(st.just("swap_in"), st.integers(0, 31), st.sampled_from([0.0, 0.05])),
        st.tuples(st.just("project"), st.integers(1, 60)),
        st.tuples(st.just("truncate"), st.integers(0, 31), st.integers(1, 20)),
    ),
    min_size=10,  # hypothesis favours tiny lists; short runs never reach a full cache
    max_size=50,
)  # fmt: skip


def check_ledger(alloc: Allocator, next_shape: SeqShape | None = None) -> MemoryLedger:
    """The ledger is non-negative everywhere and its parts sum to the budget."""
    led = alloc.ledger(next_shape)
    assert led.budget_bytes == alloc.budget_bytes
    for field in LEDGER_FIELDS:
        assert getattr(led, field) >= 0, (field, led)
    assert led.total_bytes == alloc.budget_bytes, led
    return led


def check_invariants(
    alloc: Allocator,
    num_tokens: dict[int, int],
    final_tokens: dict[int, int],
    tables_cover_allocation: bool = True,
) -> None:
    """Check ``alloc`` against the scheduler's view: ``num_tokens``/``final_tokens`` of each live
    sequence. ``tables_cover_allocation``: every allocated slot is in some block table (false while
    a contiguous family still holds ranges reserved for branches it has not forked)."""
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
    )


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


def run_operations(alloc: Allocator, operations: list[tuple]) -> None:
    """Apply ``operations`` (see :data:`OPERATIONS`) as a scheduler would, checking after each one,
    then free everything and check that the cache is exactly as it was when empty."""
    empty = _snapshot(alloc, [])
    led = check_ledger(alloc)
    assert led.token_bytes == led.reserved_future_bytes == led.internal_bytes == 0, led
    model = _Model()
    for op in operations:
        _apply(alloc, model, op)
        check_invariants(alloc, model.num_tokens, model.final, not model.spares_outstanding())
    for seq_id in model.live():
        alloc.free(seq_id)
    for members in model.swapped.values():  # each family fitted once, so it fits an empty cache
        seq_ids = [s for s, _, _ in members]
        assert alloc.swap_in(seq_ids) is not None, "a swapped family cannot come back into an empty cache"
        for seq_id in seq_ids:
            alloc.free(seq_id)
    assert _snapshot(alloc, []) == empty, "freeing everything did not give back the empty cache"


def _apply(alloc: Allocator, model: _Model, op: tuple) -> None:
    live = model.live()
    kind = op[0]
    if kind == "allocate":
        _, prompt, output, extra, keep_fraction, branches = op
        shape = SeqShape(prompt, prompt + output + extra, prompt + output - 1, branches)
        if not alloc.fits_in_empty(shape):
            return  # the engine rejects such a request up front
        keep_free_bytes = int(keep_fraction * alloc.budget_bytes)
        before = _snapshot(alloc, live)
        cached = alloc.allocate(model.next_seq_id, shape, keep_free_bytes)
        if cached is None:
            assert _snapshot(alloc, live) == before, "a refused allocate changed something"
            assert isinstance(alloc.refusal_reason(shape, keep_free_bytes), Refusal)
            return
        assert cached == 0  # no prefix caching yet
        seq_id = model.next_seq_id
        model.add(seq_id, prompt, shape.final_kv_tokens, seq_id)
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
        if alloc.append(seq_id, op[2]):
            alloc.drain_copies()
            alloc.truncate(seq_id, tokens)
            if before[2] == alloc.block_table(seq_id):  # no copy-on-write in between: exactly as before
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
    if projection.num_steps < max_steps:  # exact: the next step needs a refusal or a copy
        went_through = True
        for seq_id in seq_ids:
            if not alloc.append(seq_id, 1):
                went_through = False
                break
            model.num_tokens[seq_id] += 1
        assert not went_through or alloc.drain_copies(), "the projection stopped early"
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
        assert not many.append(1, one.max_sequence_tokens(shape))  # all or nothing
        assert one.ledger(PROBE_SHAPE) == many.ledger(PROBE_SHAPE)

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
