"""The allocator invariants the conformance suites check after every operation: the ledger sums to
the budget, block tables and reference counts agree, a grouped allocator's tables follow its
windows (:mod:`kvbench.testing.allocators` says what each suite runs)."""

from __future__ import annotations

from collections import Counter

from kvbench.core.ledger import LEDGER_FIELDS, MemoryLedger
from kvbench.memory.allocator import Allocator, SeqShape

#: a mid-sized request whose reservation decides what the ledger calls externally fragmented
PROBE_SHAPE = SeqShape(num_tokens=8, s_max_tokens=96, final_kv_tokens=60)


def check_ledger(alloc: Allocator, next_shape: SeqShape | None = None) -> MemoryLedger:
    """The ledger is non-negative everywhere and its parts sum to the budget; its split by KV-cache
    group (a model with several) is non-negative and sums to its allocated bytes."""
    led = alloc.ledger(next_shape)
    assert led.budget_bytes == alloc.budget_bytes
    for field in LEDGER_FIELDS:
        assert getattr(led, field) >= 0, (field, led)
    assert led.total_bytes == alloc.budget_bytes, led
    assert led.state_bytes % max(1, alloc.state_bytes_per_request) == 0 and (
        alloc.state_bytes_per_request or not led.state_bytes
    ), f"the state part is not a whole number of states: {led}"
    if led.group_bytes:
        assert all(value >= 0 for _, value in led.group_bytes), led
        assert sum(value for _, value in led.group_bytes) == led.allocated_bytes, led
    return led


def is_grouped(alloc: Allocator) -> bool:
    """Whether ``alloc`` keeps one block table per KV-cache group (a model with window layers)."""
    return hasattr(alloc, "group_block_tables")


def check_states(alloc: Allocator, num_tokens: dict[int, int]) -> None:
    """Every live sequence holds exactly one state (none leaked, none freed twice)."""
    led = alloc.ledger()
    assert led.state_bytes == len(num_tokens) * alloc.state_bytes_per_request, (
        f"{led.state_bytes} state bytes for {len(num_tokens)} live sequences of {alloc.state_bytes_per_request}"
    )


def block_bytes_of(alloc: Allocator) -> int:
    return alloc.page_bytes if is_grouped(alloc) else alloc.block_size_tokens * alloc.kv_bytes_per_token


def check_group_invariants(alloc: Allocator, num_tokens: dict[int, int], final_tokens: dict[int, int]) -> None:
    """A grouped allocator: per sequence and group, the table ends at the last block, starts at
    block 0 (full group) or no earlier than the window's first block, holds each block once; a
    block is in one group only; refcounts are holders; the ledger's allocated bytes are the distinct
    blocks held, its token bytes between the largest sequence's held slots and all of them."""
    led = check_ledger(alloc)
    check_ledger(alloc, PROBE_SHAPE)
    check_states(alloc, num_tokens)
    size, page, slot = alloc.block_size_tokens, alloc.page_bytes, alloc.page_bytes // alloc.block_size_tokens
    holders: Counter[int] = Counter()
    group_of: dict[int, int] = {}
    held_slots = {}
    for seq_id, n in num_tokens.items():
        assert alloc.num_tokens(seq_id) == n
        tables = alloc.group_block_tables(seq_id)
        assert len(tables) == len(alloc.kv_groups)
        slots = 0
        for g, (group, (first, blocks)) in enumerate(zip(alloc.kv_groups, tables)):
            assert len(set(blocks)) == len(blocks), "a block appears twice in one table"
            if blocks:
                assert first + len(blocks) == -(-n // size), "a group's table does not end at the last block"
            if group.window_tokens:
                assert first >= max(0, n - group.window_tokens) // size, "a block outside the window is held"
            else:
                assert first == 0 and len(blocks) * size >= n, "a full group's table is too short"
            for block_id in blocks:
                assert group_of.setdefault(block_id, g) == g, f"block {block_id} is in two groups"
            slots += sum(min(size, n - index * size) for index in range(first, first + len(blocks)))
            holders.update(blocks)
        held_slots[seq_id] = slots
        assert alloc.block_table(seq_id) == [b for _, blocks in tables for b in blocks]
    for block_id, num_holders in holders.items():
        assert block_id >= 0 and alloc.refcount(block_id) == num_holders, f"block {block_id}: refcount != holders"
    states = alloc.state_held_bytes()
    assert len(holders) * page + states == led.allocated_bytes
    per_group = Counter(group_of.values())
    assert alloc.group_bytes() == [per_group[g] * page for g in range(len(alloc.kv_groups))], (
        "group bytes != held blocks"
    )
    by_kind = Counter()
    for g, group in enumerate(alloc.kv_groups):
        by_kind[f"{group.kind}_group_bytes"] += per_group[g] * page
    if alloc.state_bytes_per_request:  # the blocks holding states (live, spare, rounded up)
        by_kind["state_group_bytes"] = states
    assert dict(led.group_bytes) == dict(by_kind), "the ledger's group split != each kind's held blocks"
    assert alloc.shared_bytes_saved() == sum(n - 1 for n in holders.values()) * page
    assert alloc.num_shared_blocks() == sum(n > 1 for n in holders.values())
    assert max(held_slots.values(), default=0) * slot <= led.token_bytes <= sum(held_slots.values()) * slot
    future = sum(max(0, final_tokens[s] - n) for s, n in num_tokens.items()) * len(alloc.kv_groups)
    assert led.reserved_future_bytes <= future * slot + states  # (a fan-out's spare states are future too)


def check_invariants(
    alloc: Allocator,
    num_tokens: dict[int, int],
    final_tokens: dict[int, int],
    tables_cover_allocation: bool = True,
) -> None:
    """Check ``alloc`` against the scheduler's view: ``num_tokens``/``final_tokens`` of each live
    sequence. ``tables_cover_allocation``: every allocated slot is in some block table (false while
    a contiguous family still holds ranges reserved for branches it has not forked)."""
    if is_grouped(alloc):
        check_group_invariants(alloc, num_tokens, final_tokens)
        return
    led = check_ledger(alloc)
    check_ledger(alloc, PROBE_SHAPE)
    check_states(alloc, num_tokens)
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
        assert len(holders) * alloc.block_size_tokens * kv_bytes + alloc.state_held_bytes() == led.allocated_bytes
    # what sharing saves: every table entry beyond a block's first holder, counted once per holder
    block_bytes = alloc.block_size_tokens * kv_bytes
    extra_holders = sum(n - 1 for n in holders.values())
    assert alloc.shared_bytes_saved() == extra_holders * block_bytes, "shared_bytes_saved != extra holders"
    assert alloc.num_shared_blocks() == sum(n > 1 for n in holders.values()), "num_shared_blocks != shared"
    total_tokens = sum(num_tokens.values())
    if caps.shares_blocks:  # shared blocks count once
        assert max(num_tokens.values(), default=0) * kv_bytes <= led.token_bytes <= total_tokens * kv_bytes
    else:
        assert led.token_bytes == total_tokens * kv_bytes
    if tables_cover_allocation:
        future_tokens = sum(max(0, final_tokens[s] - n) for s, n in num_tokens.items())
        assert led.reserved_future_bytes <= future_tokens * kv_bytes


def snapshot(alloc: Allocator, seq_ids: list[int]) -> tuple:
    return (
        alloc.ledger(),
        alloc.ledger(PROBE_SHAPE),
        alloc.refusal_reason(PROBE_SHAPE),
        [(alloc.num_tokens(s), alloc.block_table(s)) for s in seq_ids],
        alloc.cached_block_ids() if alloc.capabilities.caches_prefixes else None,
    )
