"""The naive allocator (lecture section 10.2): one contiguous slot of S_max tokens per sequence.

How every framework before 2023 did it: a sequence's KV is a tensor whose shape must be known up
front, so each sequence gets a slot sized for the longest sequence allowed (``s_max_tokens``) and
grows into it. Uniform slots mean no holes between allocations (the only external fragmentation is
the budget left over below one slot), but everything a sequence does not fill is internal
fragmentation: a 640-token chat in a 4,096-token slot wastes 84% of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench_plugins.allocators.contiguous import ContiguousAllocator

from kvbench import hookimpl
from kvbench.errors import require
from kvbench.memory.allocator import SeqShape
from kvbench.memory.block_pool import BlockPool


@dataclass
class NaiveConfig:
    #: slot size in tokens: every sequence reserves this many KV slots, and none may grow past it
    s_max_tokens: int = 4096

    def validate(self) -> None:
        require(
            isinstance(self.s_max_tokens, int) and self.s_max_tokens >= 1,
            "allocator.s_max_tokens",
            self.s_max_tokens,
            "use an integer >= 1",
        )


class NaiveAllocator(ContiguousAllocator):
    """Reserve-to-S_max: ``floor(budget / slot_bytes)`` slots handed out from a free-slot stack."""

    name = "naive"
    Config = NaiveConfig

    def __init__(self, config: NaiveConfig | None = None, **sizes: int) -> None:
        """``sizes``: ``budget_bytes`` and ``kv_bytes_per_token`` (and ``state_bytes_per_request``),
        as every allocator takes them."""
        super().__init__(config, **sizes)
        self.s_max_tokens = self.config.s_max_tokens
        # a slot holds S_max tokens' KV and, for a model with linear-attention layers, its state
        self.slot_bytes = (self.s_max_tokens + self.state_slots) * self.kv_bytes_per_token
        # the slots are a block pool's blocks of one slot each (never shared, never keyed): given
        # back ones are taken first (last in, first out), then never-used ones 0, 1, 2, ...
        self._slots = BlockPool(self.budget_bytes // self.slot_bytes, self.slot_bytes)
        # the budget left over below one slot can never hold a sequence: external, forever
        self._remainder_bytes = self.budget_bytes % self.slot_bytes
        self.num_slots = self._slots.num_blocks

    @property
    def block_size_tokens(self) -> int:
        return self.s_max_tokens

    def max_sequence_tokens(self, shape: SeqShape) -> int:
        """``s_max_tokens`` (0 when the budget holds no slot at all)."""
        return self.s_max_tokens if self.num_slots else 0

    def _fits_ranges_in_empty(self, range_slots: int, num_ranges: int) -> bool:
        return num_ranges <= self.num_slots

    def _range_tokens(self, shape: SeqShape) -> int:
        return self.s_max_tokens

    def _take(self, num_slots: int) -> int | None:
        return self._slots.take_one()

    def _give(self, start: int, num_slots: int) -> None:
        self._slots.unref(start)  # its one holder leaves: back on the free stack

    def _fragmented(self, num_slots: int) -> bool:
        return False  # uniform slots: any free slot fits any request

    def _free_and_external_bytes(self, next_shape: SeqShape | None) -> tuple[int, int]:
        """Every slot fits every admissible request, so ``next_shape`` changes nothing."""
        slots = self._slots  # (BlockPool.num_free, inline: this runs at every step's ledger)
        return (len(slots.free_block_ids) + slots.num_fresh) * self.slot_bytes, self._remainder_bytes


@hookimpl
def kvbench_register_allocators() -> list[type]:
    return [NaiveAllocator]
