"""A run of decode steps of a sliding-window model's block tables (``hybrid_paged``) with shared or
keyed blocks (or a window group holding none), exact, step by step in plain integers, on a copy of
the few numbers an append changes (:mod:`kvbench.memory.window_projection` is the closed form).

Per step and sequence in order, the blocks its windows leave are released (one nobody else holds
goes to the free pool, or to the eviction queue when keyed), then a block is taken per group whose
last block is full. The run stops at the first step some append could not make, or where a window
would release a shared block (what sharing saves changes there: a run reports its first step's). Sequences still keying prompt blocks (a full block may take a key an eviction in the span
just freed) are projected by :func:`simulate_decode` instead.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from kvbench.core.kv import NO_PROJECTION, DecodeProjection, SeqShape
from kvbench.core.ledger import LEDGER_FIELDS, MemoryLedger
from kvbench.memory.allocator import Allocator
from kvbench.memory.group_pool import GroupBlockPool
from kvbench.memory.kv_group_blocks import GroupLayout, GroupTable


def project_stepwise(
    seqs: Sequence[tuple[int, int, Sequence[GroupTable]]],
    max_steps: int,
    ledger: Callable[[], MemoryLedger],
    layout: GroupLayout,
    pool: GroupBlockPool,
    slot_bytes: int,
) -> DecodeProjection:
    """The ledger after each of up to ``max_steps`` steps of ``seqs`` (each: tokens, final length,
    its group tables), from ``ledger()`` (the ledger now), over ``pool``'s blocks (one group's
    bytes per token: ``slot_bytes``). A partly filled shared last block (a copy on the next
    append) stops it at 0 steps."""
    size, page_bytes = layout.block_size_tokens, pool.block_bytes
    shared, keyed = pool.shared_refs, pool.key_of
    state = []  # per sequence: [tokens, final, [[window, first, held ids (None: taken in the span)]]]
    for n, final, tables in seqs:
        groups = []
        for g, (first, blocks) in enumerate(tables):
            if n % size and blocks and shared.get(blocks[-1], 1) > 1:
                return NO_PROJECTION
            groups.append([layout.windows[g], first, list(blocks)])
        state.append([n, final, groups])
    led = ledger()
    slot = slot_bytes or 1
    truly_free, cached = pool.num_free(), pool.num_cached()
    allocated = sum(pool.held_per_column)
    token_slots, future_slots = led.token_bytes // slot, led.reserved_future_bytes // slot
    held_per_column, column_of = list(pool.held_per_column), pool.column_of
    columns: dict[str, list[int]] = {name: [] for name in ("token", "future", "internal", "free", "cached")}
    group_columns: dict[str, list[int]] = {name: [] for name, _ in pool.group_columns}
    for _ in range(max_steps):
        # one step on copies: a step that cannot be taken whole leaves the state as it was
        free_, cached_, alloc_, token_, future_ = truly_free, cached, allocated, token_slots, future_slots
        held_ = list(held_per_column)
        new_state = []
        ok = True
        for n, final, groups in state:
            new_n = n + 1
            end = -(-new_n // size)
            new_groups = []
            num_new = 0
            shares_change = False
            for g, (window, first, blocks) in enumerate(groups):
                new_first = max(first, layout.first_needed(window, new_n))
                drop = min(new_first - first, len(blocks))
                for block_id in blocks[:drop]:
                    if block_id is not None and block_id in shared:
                        # a shared block loses a holder: what sharing saves changes, which a
                        # run of steps reports once (its first step's), so the run ends here
                        shares_change = True
                        continue
                    alloc_ -= 1
                    held_[column_of[g]] -= 1
                    token_ -= size  # a block that left a window is full
                    if block_id is not None and block_id in keyed:
                        cached_ += 1
                    else:
                        free_ += 1
                kept = blocks[drop:]
                start = new_first + len(kept)
                if end > start:
                    num_new += end - start
                    held_[column_of[g]] += end - start
                    kept = kept + [None] * (end - start)
                new_groups.append([window, new_first, kept])
            if shares_change or num_new > free_ + cached_:
                ok = False
                break
            from_free = num_new if num_new < free_ else free_
            free_ -= from_free
            cached_ -= num_new - from_free
            alloc_ += num_new
            # the new token in every group holding a block (a window group truncated past its
            # window holds none until the sequence reaches it again)
            filled_before = sum(1 for _, _, blocks in groups if blocks)
            filled_after = sum(1 for _, _, blocks in new_groups if blocks)
            token_ += filled_after
            # its own last block's unfilled slots up to its final length are its future
            before = min(-n % size, max(final - n, 0))
            after = min(-new_n % size, max(final - new_n, 0))
            future_ += after * filled_after - before * filled_before
            new_state.append([new_n, final, new_groups])
        if not ok:
            break
        state, held_per_column = new_state, held_
        truly_free, cached, allocated, token_slots, future_slots = free_, cached_, alloc_, token_, future_
        columns["token"].append(token_slots * slot)
        columns["future"].append(future_slots * slot)
        columns["internal"].append((allocated * size - token_slots - future_slots) * slot)
        columns["free"].append(truly_free * page_bytes)
        columns["cached"].append(cached * page_bytes)
        for name, value in pool.group_bytes(held_per_column):
            group_columns[name].append(value)
    num_steps = len(columns["token"])
    if not num_steps:
        return NO_PROJECTION
    return DecodeProjection(
        num_steps,
        {
            "token_bytes": columns["token"],
            "reserved_future_bytes": columns["future"],
            "internal_bytes": columns["internal"],
            "external_bytes": [led.external_bytes] * num_steps,
            "free_bytes": columns["free"],
            "cached_bytes": columns["cached"],
            **group_columns,
        },
    )


def simulate_decode(
    allocator: Allocator,
    seq_ids: Sequence[int],
    max_steps: int,
    next_shape: SeqShape | None,
    group_columns: Sequence[str],
) -> DecodeProjection:
    """The decode steps taken one by one on a copy of ``allocator``, up to the first that an append
    refuses or that makes a copy; its ledger after each (``group_columns``: its per-group parts)."""
    twin = copy.deepcopy(allocator)
    columns: dict[str, list[int]] = {name: [] for name in LEDGER_FIELDS}
    columns.update((name, []) for name in group_columns)
    for _ in range(max_steps):
        if not all(twin.append(seq_id, 1) for seq_id in seq_ids) or twin.drain_copies():
            break
        led = twin.ledger(next_shape)
        for name in LEDGER_FIELDS:
            columns[name].append(getattr(led, name))
        for name, value in led.group_bytes:
            columns[name].append(value)
    num_steps = len(columns["token_bytes"])
    return DecodeProjection(num_steps, columns) if num_steps else NO_PROJECTION
