"""Conformance suite for allocator plugins: every allocator, built-in or third-party, must pass it.

Subclass :class:`AllocatorConformance` in a test module and override the ``allocator_factory``
fixture (parametrize it to test several configs)::

    from kvbench.memory.conformance import AllocatorConformance

    class TestMyAllocator(AllocatorConformance):
        @pytest.fixture(params=[8, 64])
        def allocator_factory(self, request):
            return lambda budget_bytes, kv_bytes_per_token: MyAllocator(
                MyConfig(block_size_tokens=request.param),
                budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token)

The random-operations test drives the allocator like an engine would (requests whose
``final_kv_tokens`` exceed :meth:`~kvbench.memory.allocator.Allocator.max_sequence_tokens` are never
admitted) and checks after every operation: the ledger sums to the budget, block tables of live
sequences overlap only in blocks whose reference count says they are shared, a ``False`` changes
nothing, and freeing everything gives back exactly the empty cache. :func:`run_operations` and
:func:`check_invariants` can be used without pytest classes too. Needs pytest and hypothesis.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.memory.allocator import Allocator, MemoryLedger, SeqShape

#: (budget_bytes, kv_bytes_per_token) -> a fresh allocator
AllocatorFactory = Callable[[int, int], Allocator]

#: a mid-sized request whose reservation decides what the ledger calls externally fragmented
PROBE_SHAPE = SeqShape(num_tokens=8, max_tokens=96, final_kv_tokens=60)

# One operation: ("allocate", prompt_tokens, output_tokens, extra_declared_tokens, keep_free_fraction),
# ("append", which_seq, count), ("fork", which_seq, child_output_tokens or None), ("free", which_seq).
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), st.integers(1, 160), st.integers(1, 160), st.integers(0, 64),
                  st.sampled_from([0.0, 0.0, 0.05, 0.5])),
        st.tuples(st.just("append"), st.integers(0, 31), st.integers(1, 40)),
        st.tuples(st.just("fork"), st.integers(0, 31), st.one_of(st.none(), st.integers(0, 80))),
        st.tuples(st.just("free"), st.integers(0, 31)),
    ),
    min_size=10,  # hypothesis favours tiny lists; short runs never reach a full cache
    max_size=50,
)


def check_ledger(alloc: Allocator, next_shape: SeqShape | None = None) -> MemoryLedger:
    """The ledger is non-negative everywhere and its six fields sum to the budget."""
    led = alloc.ledger(next_shape)
    assert led.budget_bytes == alloc.budget_bytes
    for field in ("token_bytes", "reserved_future_bytes", "internal_bytes", "external_bytes", "free_bytes"):
        assert getattr(led, field) >= 0, (field, led)
    assert led.total_bytes == alloc.budget_bytes, led
    return led


def check_invariants(
    alloc: Allocator, num_tokens: dict[int, int], final_tokens: dict[int, int], tables_cover_allocation: bool = True
) -> None:
    """Check ``alloc`` against the engine's view: ``num_tokens``/``final_tokens`` of each live sequence."""
    led = check_ledger(alloc)
    check_ledger(alloc, PROBE_SHAPE)
    kv_bytes = alloc.kv_bytes_per_token
    holders: Counter[int] = Counter()
    for seq_id, expected_tokens in num_tokens.items():
        assert alloc.num_tokens(seq_id) == expected_tokens
        table = alloc.block_table(seq_id)
        assert len(table) * alloc.block_size_tokens >= expected_tokens, "block table too short"
        assert len(set(table)) == len(table), "a block appears twice in one table"
        if alloc.contiguous and table:  # kernels read such a sequence as one contiguous range
            assert table == list(range(table[0], table[0] + len(table))), "contiguous table has gaps"
        holders.update(table)
    refcount = getattr(alloc, "refcount", None)
    for block_id, num_holders in holders.items():
        assert block_id >= 0
        if refcount is not None:
            assert refcount(block_id) == num_holders, f"block {block_id}: refcount != holders"
        else:
            assert num_holders == 1, f"block {block_id} is in {num_holders} tables"
    allocated_bytes = led.token_bytes + led.reserved_future_bytes + led.internal_bytes
    if tables_cover_allocation:
        assert len(holders) * alloc.block_size_tokens * kv_bytes == allocated_bytes
    total_tokens = sum(num_tokens.values())
    if refcount is None:
        assert led.token_bytes == total_tokens * kv_bytes
    else:  # shared blocks count once
        assert max(num_tokens.values(), default=0) * kv_bytes <= led.token_bytes <= total_tokens * kv_bytes
    future_tokens = sum(max(0, final_tokens[s] - n) for s, n in num_tokens.items())
    assert led.reserved_future_bytes <= future_tokens * kv_bytes


def _snapshot(alloc: Allocator, seq_ids: list[int]) -> tuple:
    return (
        alloc.ledger(),
        alloc.ledger(PROBE_SHAPE),
        alloc.can_fit(PROBE_SHAPE),
        [(alloc.num_tokens(s), alloc.block_table(s)) for s in seq_ids],
    )


def run_operations(alloc: Allocator, operations: list[tuple], tables_cover_allocation: bool = True) -> None:
    """Apply ``operations`` (see :data:`OPERATIONS`) as an engine would, checking after each one,
    then free everything and check that the cache is exactly as it was when empty."""
    empty = _snapshot(alloc, [])
    led = check_ledger(alloc)
    assert led.token_bytes == led.reserved_future_bytes == led.internal_bytes == 0, led
    num_tokens: dict[int, int] = {}
    final_tokens: dict[int, int] = {}
    next_seq_id = 0
    for op in operations:
        live = sorted(num_tokens)
        if op[0] == "allocate":
            _, prompt, output, extra, keep_fraction = op
            shape = SeqShape(prompt, prompt + output + extra, prompt + output - 1)
            if shape.final_kv_tokens > alloc.max_sequence_tokens(shape):
                continue  # the engine rejects such a request up front
            keep_free_bytes = int(keep_fraction * alloc.budget_bytes)
            before = _snapshot(alloc, live)
            expected = alloc.can_fit(shape, keep_free_bytes)
            assert _snapshot(alloc, live) == before, "can_fit changed something"
            ok = alloc.allocate(next_seq_id, shape, keep_free_bytes)
            assert ok == expected, "can_fit disagrees with allocate"
            if ok:
                num_tokens[next_seq_id] = prompt
                final_tokens[next_seq_id] = shape.final_kv_tokens
                next_seq_id += 1
            else:
                assert _snapshot(alloc, live) == before, "a refused allocate changed something"
        elif not live:
            continue
        elif op[0] == "append":
            seq_id = live[op[1] % len(live)]
            for _ in range(op[2]):
                before = (alloc.ledger(), alloc.ledger(PROBE_SHAPE), alloc.block_table(seq_id))
                if not alloc.append(seq_id):
                    after = (alloc.ledger(), alloc.ledger(PROBE_SHAPE), alloc.block_table(seq_id))
                    assert after == before, "a refused append changed something"
                    break
                num_tokens[seq_id] += 1
        elif op[0] == "fork":
            parent_id = live[op[1] % len(live)]
            child_final = None if op[2] is None else num_tokens[parent_id] + op[2]
            before = _snapshot(alloc, live)
            if alloc.fork(parent_id, next_seq_id, child_final):
                assert _snapshot(alloc, live)[3] == before[3], "fork changed a live sequence"
                num_tokens[next_seq_id] = num_tokens[parent_id]
                final_tokens[next_seq_id] = final_tokens[parent_id] if child_final is None else child_final
                next_seq_id += 1
            else:
                assert _snapshot(alloc, live) == before, "a refused fork changed something"
        else:
            seq_id = live[op[1] % len(live)]
            alloc.free(seq_id)
            del num_tokens[seq_id], final_tokens[seq_id]
            with pytest.raises(KeyError):
                alloc.free(seq_id)  # a second free is a bug, reported loudly
        check_invariants(alloc, num_tokens, final_tokens, tables_cover_allocation)
    for seq_id in list(num_tokens):
        alloc.free(seq_id)
    assert _snapshot(alloc, []) == empty, "freeing everything did not give back the empty cache"


class AllocatorConformance:
    """Tests every allocator must pass. Override :meth:`allocator_factory` (a fixture)."""

    #: hypothesis examples per config for the random-operations test (keep the suite fast)
    max_examples = 60
    #: budgets drawn, in tokens (requests are 1-160 prompt + 1-160 output tokens)
    min_budget_tokens = 128
    max_budget_tokens = 2048
    #: block tables list every slot the allocator holds (distinct blocks x block bytes == allocated)
    tables_cover_allocation = True

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
            run_operations(alloc, operations, self.tables_cover_allocation)

        run()

    def test_empty_cache_is_all_free(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(10_000_000, 1000)
        led = check_ledger(alloc)
        assert led.token_bytes == led.reserved_future_bytes == led.internal_bytes == 0
        assert alloc.free_bytes() == alloc.budget_bytes

    def test_zero_budget_holds_nothing(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(0, 1000)
        assert check_ledger(alloc, PROBE_SHAPE).total_bytes == 0
        shape = SeqShape(1, 2, 1)
        assert alloc.max_sequence_tokens(shape) == 0 or not alloc.allocate(1, shape)

    def test_free_of_unknown_sequence_raises(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(10_000_000, 1000)
        with pytest.raises(KeyError):
            alloc.free(12345)
        assert alloc.allocate(1, SeqShape(10, 100, 50))
        alloc.free(1)
        with pytest.raises(KeyError):
            alloc.free(1)

    def test_fill_then_free_everything(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(1_000_000, 100)
        empty = alloc.ledger(PROBE_SHAPE)
        shape = SeqShape(30, 120, 90)
        num_admitted = 0
        while alloc.allocate(num_admitted, shape):
            num_admitted += 1
            assert num_admitted <= alloc.budget_bytes // alloc.kv_bytes_per_token, "allocates forever"
        assert num_admitted >= 1
        check_ledger(alloc, PROBE_SHAPE)
        for seq_id in range(num_admitted):
            alloc.free(seq_id)
        assert alloc.ledger(PROBE_SHAPE) == empty

    def test_fork_then_append_to_child_leaves_parent_untouched(self, allocator_factory: AllocatorFactory) -> None:
        alloc = allocator_factory(1_000_000, 100)
        assert alloc.allocate(1, SeqShape(21, 200, 100))
        parent_table = alloc.block_table(1)
        assert alloc.fork(1, 2)
        assert alloc.num_tokens(2) == 21
        for _ in range(5):
            assert alloc.append(2)
        assert alloc.num_tokens(2) == 26
        assert alloc.num_tokens(1) == 21
        assert alloc.block_table(1) == parent_table
        check_invariants(alloc, {1: 21, 2: 26}, {1: 100, 2: 100}, self.tables_cover_allocation)
