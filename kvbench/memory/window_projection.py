"""A run of decode steps of a sliding-window model's block tables (``hybrid_paged``) in closed form,
while no block is shared or keyed and every group of every sequence holds a block.

A sequence takes a block in every group every B steps from a step its length fixes, and each window
group frees one every B steps from the step its window first passes its first held block, so the
blocks taken and freed per step follow from two small tables (:class:`DecodePhases`), and the
ledger after every step from their running sums (plain integers up to a few dozen steps, int64
arrays beyond). Only a step where the blocks free before it do not cover every block it takes is
checked sequence by sequence (its own frees, in order, may cover them). Anything else is
:mod:`kvbench.memory.window_stepwise`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.core.kv import NO_PROJECTION, DecodeProjection
from kvbench.core.ledger import MemoryLedger
from kvbench.memory.group_pool import GroupBlockPool
from kvbench.specs.kv_groups import WINDOW

#: a sequence's window groups by when they next free a block: (the length at which the window
#: leaves the group's first held block, then one block every B tokens more; how many groups)
Slides = tuple[tuple[int, int], ...]


@dataclass
class DecodePhases:
    """What a closed-form projection needs of the decoding sequences (no block shared or keyed)."""

    seq_ids: Sequence[int]
    #: sequences by free slots ``s`` left in their last block: each takes a block in every group
    #: at steps ``s + 1``, ``s + 1 + B``, ...
    take_counts: list[int]
    #: step -> window-group blocks freed first at that step, and again every B steps after
    free_starts: dict[int, int]
    #: step -> never-filled slots (per group) of the final blocks taken at that step: future until
    #: then, internal from then on
    final_waste: dict[int, int]
    #: the steps: at most the caller's, and no sequence grows past its final length
    max_steps: int


class WindowSpan:
    """The decoding sequences of one projection, and what the closed form reads of the allocator:
    each sequence's tokens, final length and ``seq_layout`` (its groups holding a block, its
    window groups' next frees)."""

    def __init__(
        self,
        seq_ids: Sequence[int],
        tokens: Mapping[int, int],
        finals: Mapping[int, int],
        seq_layout: Mapping[int, tuple[int, Slides]],
        pool: GroupBlockPool,
        block_size_tokens: int,
        num_groups: int,
        slot_bytes: int,
    ) -> None:
        self.seq_ids, self.tokens, self.finals, self.seq_layout = seq_ids, tokens, finals, seq_layout
        self.size, self.num_groups, self.slot_bytes = block_size_tokens, num_groups, slot_bytes
        self.page_bytes, self.group_columns = pool.block_bytes, pool.group_columns
        self.num_available = pool.num_available()

    def project(self, max_steps: int, ledger: Callable[[], MemoryLedger], short_steps: int) -> DecodeProjection | None:
        """The projection over up to ``max_steps`` steps from ``ledger()`` (the ledger now), in plain
        integers up to ``short_steps`` steps; None when a window group of one holds no block."""
        phases = self.phases(max_steps)
        if phases is None:
            return None
        if phases.max_steps <= 0:
            return NO_PROJECTION
        if phases.max_steps <= short_steps:  # plain arithmetic costs less than arrays
            return self.project_short(phases, ledger())
        return self.project_long(phases, ledger())

    def phases(self, max_steps: int) -> DecodePhases | None:
        """The sequences' steps that take and free blocks, from their lengths and their windows'
        next frees; None when a window group of one holds no block (the step-by-step way then)."""
        size, num_groups = self.size, self.num_groups
        take_counts = [0] * size
        free_starts: dict[int, int] = {}
        final_waste: dict[int, int] = {}
        limit = max_steps
        tokens, finals, layout = self.tokens, self.finals, self.seq_layout
        seq_ids = self.seq_ids
        for seq_id in seq_ids:
            n = tokens[seq_id]
            final = finals[seq_id]
            num_filled, frees_at = layout[seq_id]
            if num_filled < num_groups:
                return None
            take_counts[-n % size] += 1
            for at, num in frees_at:
                step = at - n
                if step <= max_steps:
                    free_starts[step] = free_starts.get(step, 0) + num
            # the final block's never-filled slots are future until the step that takes it
            final_start = size * ((final - 1) // size)
            if n <= final_start:
                step = final_start - n + 1
                final_waste[step] = final_waste.get(step, 0) + (-final % size)
            if final - n < limit:  # (the engine's runs end before a sequence finishes)
                limit = final - n
        return DecodePhases(seq_ids, take_counts, free_starts, final_waste, limit)

    def step_fits(self, seq_ids: Sequence[int], step: int, num_available: int) -> bool:
        """Whether decode step ``step`` of the run goes through with ``num_available`` blocks before
        it: sequence by sequence in order, its windows' freed blocks first, then a block per group
        if its last one is full (what ``append`` does)."""
        size, num_groups = self.size, self.num_groups
        tokens, layout = self.tokens, self.seq_layout
        for seq_id in seq_ids:
            length = tokens[seq_id] + step
            for at, num in layout[seq_id][1]:
                if length >= at and (length - at) % size == 0:
                    num_available += num
            if (length - 1) % size == 0:
                if num_available < num_groups:
                    return False
                num_available -= num_groups
        return True

    def span_columns(self, led: MemoryLedger, num_seqs: int, steps, taken, freed, wasted) -> dict:
        """The ledger after each step, from its state now and, per step, the running sums of
        sequences that took a block in every group (``taken``), window-group blocks freed
        (``freed``, full blocks: their tokens leave) and final blocks' never-filled slots per group
        (``wasted``). Integers (or int64 arrays) throughout: exact in any order."""
        size, slot, page, num_groups = self.size, self.slot_bytes, self.page_bytes, self.num_groups
        token_slots = num_groups * num_seqs * steps - size * freed  # a token per sequence and group
        # each group's last-block tails: a step fills one slot, a block taken adds B
        future_slots = num_groups * (size * taken - num_seqs * steps - wasted)
        held_slots = size * (num_groups * taken - freed)
        columns = {
            "token_bytes": led.token_bytes + slot * token_slots,
            "reserved_future_bytes": led.reserved_future_bytes + slot * future_slots,
            "internal_bytes": led.internal_bytes + slot * (held_slots - token_slots - future_slots),
            "free_bytes": led.free_bytes + page * (freed - num_groups * taken),  # (no cached block: nothing keyed)
        }
        for (name, members), (_, held_bytes) in zip(self.group_columns, led.group_bytes):
            window = name == f"{WINDOW}_group_bytes"  # only window groups free blocks
            columns[name] = held_bytes + page * (len(members) * taken - (freed if window else 0))
        return columns

    def project_short(self, phases: DecodePhases, led: MemoryLedger) -> DecodeProjection:
        """the projection in closed form over a few steps, in plain integers (the values
        :meth:`span_columns` gives the long form, as lists), carried from step to step."""
        size, num_groups, max_steps = self.size, self.num_groups, phases.max_steps
        frees = [0] * (max_steps + 1)
        for start, num in phases.free_starts.items():
            for step in range(start, max_steps + 1, size):
                frees[step] += num
        take_counts, final_waste = phases.take_counts, phases.final_waste
        slot, page = self.slot_bytes, self.page_bytes
        num_available = self.num_available
        # per step: every sequence's new token in every group; a block taken adds B slots to the
        # tails (future), a block freed takes B filled slots away; a final block's never-filled
        # slots turn from future to internal
        step_slots = num_groups * len(phases.seq_ids)
        token_bytes, future_bytes, internal_bytes = led.token_bytes, led.reserved_future_bytes, led.internal_bytes
        free_bytes = led.free_bytes
        columns = [(name, len(members), name == f"{WINDOW}_group_bytes") for name, members in self.group_columns]
        held = [value for _, value in led.group_bytes]
        token, future, internal, free = [], [], [], []
        held_columns: list[list[int]] = [[] for _ in columns]
        for step in range(1, max_steps + 1):
            num_taking = take_counts[(step - 1) % size]
            blocks_taken, blocks_freed = num_groups * num_taking, frees[step]
            if num_available < blocks_taken and not self.step_fits(phases.seq_ids, step, num_available):
                break
            num_available += blocks_freed - blocks_taken
            token_bytes += slot * (step_slots - size * blocks_freed)
            future_delta = slot * (size * blocks_taken - step_slots - num_groups * final_waste.get(step, 0))
            future_bytes += future_delta
            # held slots change by B x (taken - freed); tokens and future as above
            internal_bytes += (
                slot * size * (blocks_taken - blocks_freed) - slot * (step_slots - size * blocks_freed) - future_delta
            )
            free_bytes += page * (blocks_freed - blocks_taken)
            token.append(token_bytes)
            future.append(future_bytes)
            internal.append(internal_bytes)
            free.append(free_bytes)
            for c, (_, num_members, window) in enumerate(columns):
                held[c] += page * (num_members * num_taking - (blocks_freed if window else 0))
                held_columns[c].append(held[c])
        num_steps = len(token)
        if not num_steps:
            return NO_PROJECTION
        return DecodeProjection(
            num_steps,
            {
                "token_bytes": token,
                "reserved_future_bytes": future,
                "internal_bytes": internal,
                "external_bytes": [led.external_bytes] * num_steps,
                "free_bytes": free,
                "cached_bytes": [led.cached_bytes] * num_steps,
                **{name: values for (name, _, _), values in zip(columns, held_columns)},
            },
        )

    def project_long(self, phases: DecodePhases, led: MemoryLedger) -> DecodeProjection:
        """the projection in closed form over many steps, as int64 arrays."""
        size, num_groups, max_steps = self.size, self.num_groups, phases.max_steps
        steps = np.arange(1, max_steps + 1, dtype=np.int64)
        num_taking = np.array(phases.take_counts, dtype=np.int64)[(steps - 1) % size]
        # blocks freed first at a step and every B steps after: a running sum along each residue
        num_rows = -(-max_steps // size)
        starts = np.zeros(num_rows * size, dtype=np.int64)
        for start, num in phases.free_starts.items():
            if start <= max_steps:
                starts[start - 1] += num
        frees = starts.reshape(num_rows, size).cumsum(axis=0).ravel()[:max_steps]
        taken, freed = np.cumsum(num_taking), np.cumsum(frees)
        available_after = self.num_available - num_groups * taken + freed
        available_before = np.concatenate(([self.num_available], available_after[:-1]))
        num_steps = max_steps
        # a step whose takes the blocks free before it do not cover: its own frees may (in order)
        for index in np.flatnonzero(available_before < num_groups * num_taking).tolist():
            if not self.step_fits(phases.seq_ids, index + 1, int(available_before[index])):
                num_steps = index
                break
        if not num_steps:
            return NO_PROJECTION
        waste = np.zeros(max_steps + 2, dtype=np.int64)
        for step, slots in phases.final_waste.items():
            waste[min(step, max_steps + 1)] += slots
        wasted = np.cumsum(waste)[1 : max_steps + 1]
        cut = slice(0, num_steps)
        ledgers = self.span_columns(led, len(phases.seq_ids), steps[cut], taken[cut], freed[cut], wasted[cut])
        ledgers["cached_bytes"] = np.full(num_steps, led.cached_bytes, dtype=np.int64)
        ledgers["external_bytes"] = np.full(num_steps, led.external_bytes, dtype=np.int64)
        return DecodeProjection(num_steps, ledgers)
