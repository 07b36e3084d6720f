"""A run of decode steps over a block pool, in closed form: what ``project_decode`` answers for an
allocator whose sequences each take one block of ``block_size_tokens`` every time their last one
fills (``paged``).

A sequence with ``s`` free slots in its own last block takes a new block at steps
``s + 1, s + 1 + B, ...``, so the blocks taken per step repeat with period B and follow from a
histogram of ``s`` (``counts``). Before its final block a sequence's tail is all reserved future;
from the step that takes its final block on (``final_steps``), that block's never-filled slots
(``final_waste``) are internal. New blocks come from truly free ones first, then by evicting cached
ones; the run stops before the first step whose blocks the pool does not have.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.core.kv import DecodeProjection
from kvbench.core.ledger import MemoryLedger

#: a projection this many steps long or shorter is computed step by step in plain integers: below
#: about this length a dozen numpy calls cost more than the arithmetic they vectorize (the usual
#: run between two arrivals is a few dozen steps)
SHORT_PROJECTION_STEPS = 48


@dataclass(frozen=True)
class BlockGrowth:
    """How a batch of decoding sequences takes blocks, step by step (see the module docstring)."""

    num_seqs: int
    #: sequences by free slots left in their own last block (index ``s``: ``s`` slots left)
    counts: list[int]
    #: per sequence that takes its final block within reach: the step that takes it ...
    final_steps: list[int]
    #: ... and that block's slots it never fills
    final_waste: list[int]

    @classmethod
    def of(
        cls, seq_ids: Sequence[int], num_tokens: Mapping[int, int], finals: Mapping[int, int], block_size_tokens: int
    ) -> BlockGrowth:
        """The growth of sequences ``seq_ids`` (their tokens now and final lengths), each in blocks
        of its own."""
        size = block_size_tokens
        counts = [0] * size
        final_steps, final_waste = [], []
        for seq_id in seq_ids:
            tokens, final = num_tokens[seq_id], finals[seq_id]
            counts[-tokens % size] += 1
            final_block_start = size * ((final - 1) // size)
            if tokens <= final_block_start:  # its final block is taken at this step
                final_steps.append(final_block_start - tokens + 1)
                final_waste.append(-final % size)
        return cls(len(seq_ids), counts, final_steps, final_waste)


def project_blocks(
    growth: BlockGrowth,
    max_steps: int,
    led: MemoryLedger,
    *,
    kv_bytes_per_token: int,
    block_size_tokens: int,
    num_available_blocks: int,
    num_free_blocks: int,
    short_steps: int = SHORT_PROJECTION_STEPS,
) -> DecodeProjection:
    """The ledger after each of up to ``max_steps`` steps, from ``led`` (the ledger now), with
    ``num_available_blocks`` (free and evictable) and ``num_free_blocks`` (truly free) blocks;
    up to ``short_steps`` steps are computed in plain integers, more in arrays."""
    if max_steps <= short_steps:  # a few steps: plain arithmetic costs less than arrays
        return _project_short(
            growth, max_steps, led, kv_bytes_per_token, block_size_tokens, num_available_blocks, num_free_blocks
        )
    size, kv = block_size_tokens, kv_bytes_per_token
    block_bytes = size * kv
    steps = np.arange(1, max_steps + 1, dtype=np.int64)
    new_blocks = np.cumsum(np.array(growth.counts, dtype=np.int64)[(steps - 1) % size])
    num_steps = int(np.searchsorted(new_blocks, num_available_blocks, side="right"))
    steps, new_slots = steps[:num_steps], new_blocks[:num_steps] * size
    waste = np.zeros(num_steps + 2, dtype=np.int64)
    if growth.final_steps:
        np.add.at(waste, np.minimum(growth.final_steps, num_steps + 1), growth.final_waste)
    internal_slots = np.cumsum(waste)[1 : num_steps + 1]
    token_slots = growth.num_seqs * steps
    # new blocks come from truly free ones first, then by evicting cached ones
    from_free = np.minimum(new_blocks[:num_steps], num_free_blocks)
    return DecodeProjection(
        num_steps,
        {
            "token_bytes": led.token_bytes + kv * token_slots,
            "reserved_future_bytes": led.reserved_future_bytes + kv * (new_slots - token_slots - internal_slots),
            "internal_bytes": led.internal_bytes + kv * internal_slots,
            "external_bytes": np.full(num_steps, led.external_bytes, dtype=np.int64),
            "free_bytes": led.free_bytes - block_bytes * from_free,
            "cached_bytes": led.cached_bytes - block_bytes * (new_blocks[:num_steps] - from_free),
            "state_bytes": np.full(num_steps, led.state_bytes, dtype=np.int64),  # decoding keeps each state
        },
    )


def _project_short(
    growth: BlockGrowth,
    max_steps: int,
    led: MemoryLedger,
    kv: int,
    size: int,
    num_available: int,
    truly_free: int,
) -> DecodeProjection:
    """:func:`project_blocks` step by step in plain integers (the same values, as lists).

    Each part is carried from one step to the next by what changes (integers: exact in any
    order): a step adds ``num_seqs`` tokens, which come out of the reserved future; a new block
    adds its slots to the future and leaves the free (or cached) blocks; a sequence taking its
    final block turns that block's never-filled slots from future into internal."""
    block_bytes = size * kv
    waste_at: dict[int, int] = {}
    for step, waste in zip(growth.final_steps, growth.final_waste):
        waste_at[step] = waste_at.get(step, 0) + waste
    token, future, internal, free, cached = [], [], [], [], []
    token_bytes, future_bytes, internal_bytes = led.token_bytes, led.reserved_future_bytes, led.internal_bytes
    free_bytes, cached_bytes = led.free_bytes, led.cached_bytes
    step_bytes, block_slot_bytes = kv * growth.num_seqs, kv * size
    new_blocks = 0
    for step, taken in zip(range(1, max_steps + 1), itertools.cycle(growth.counts)):
        if taken:  # sequences whose last block filled up take a new one
            new_blocks += taken
            if new_blocks > num_available:
                break
            future_bytes += block_slot_bytes * taken
            # truly free blocks first, then cached ones (evicted)
            from_free = new_blocks if new_blocks < truly_free else truly_free
            free_bytes = led.free_bytes - block_bytes * from_free
            cached_bytes = led.cached_bytes - block_bytes * (new_blocks - from_free)
        token_bytes += step_bytes
        future_bytes -= step_bytes
        if step in waste_at:
            internal_bytes += kv * waste_at[step]
            future_bytes -= kv * waste_at[step]
        token.append(token_bytes)
        future.append(future_bytes)
        internal.append(internal_bytes)
        free.append(free_bytes)
        cached.append(cached_bytes)
    return DecodeProjection(
        len(token),
        {
            "token_bytes": token,
            "reserved_future_bytes": future,
            "internal_bytes": internal,
            "external_bytes": [led.external_bytes] * len(token),
            "free_bytes": free,
            "cached_bytes": cached,
            "state_bytes": [led.state_bytes] * len(token),  # decoding keeps each state
        },
    )
