"""The naive allocator (lecture section 10.2): one contiguous slot of S_max tokens per sequence.

How every framework before 2023 did it: a sequence's KV is a tensor whose shape must be known up
front, so each sequence gets a slot sized for the longest sequence allowed (``s_max_tokens``) and
grows into it. Uniform slots mean no holes between allocations (the only external fragmentation is
the budget left over below one slot), but everything a sequence does not fill is internal
fragmentation: a 640-token chat in a 4,096-token slot wastes 84% of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench import hookimpl
from kvbench.memory.allocator import MemoryLedger, SeqShape
from kvbench.errors import require
from kvbench_plugins.allocators.contiguous import ContiguousAllocator


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

    def __init__(self, config: NaiveConfig | None = None, *, budget_bytes: int, kv_bytes_per_token: int) -> None:
        super().__init__(config or NaiveConfig(), budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token)
        self.s_max_tokens = self.config.s_max_tokens
        self.slot_bytes = self.s_max_tokens * self.kv_bytes_per_token
        self.num_slots = self.budget_bytes // self.slot_bytes
        self._remainder_bytes = self.budget_bytes - self.num_slots * self.slot_bytes
        # stack: O(1) allocate/free; reversed so that a fresh allocator hands out slot 0 first
        self._free_slot_ids: list[int] = list(range(self.num_slots - 1, -1, -1))
        self._slot_ids: dict[int, int] = {}

    # --- sizing ----------------------------------------------------------------------------------

    @property
    def block_size_tokens(self) -> int:
        return self.s_max_tokens

    def max_sequence_tokens(self, shape: SeqShape) -> int:
        """``s_max_tokens`` (0 when the budget holds no slot at all)."""
        return self.s_max_tokens if self.num_slots else 0

    def reservation_tokens(self, shape: SeqShape) -> int:
        """Always one whole slot."""
        return self.s_max_tokens

    # --- verbs -----------------------------------------------------------------------------------

    def can_fit(self, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        """A free slot exists and the prompt fits in it (``keep_free_bytes`` is ignored)."""
        return bool(self._free_slot_ids) and shape.num_tokens <= self.s_max_tokens

    def allocate(self, seq_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        """Reserve a whole slot; the sequence's whole future is reserved, so no watermark applies."""
        if seq_id in self._slot_ids:
            raise ValueError(f"sequence {seq_id} is already allocated")
        if not self.can_fit(shape):
            return False
        self._place(seq_id, shape.num_tokens, shape.final_kv_tokens)
        return True

    def fork(self, parent_id: int, child_id: int, child_final_kv_tokens: int | None = None) -> bool:
        """Copy the parent's tokens into a new slot; ``False`` when no slot is free."""
        num_tokens = self._num_tokens[parent_id]
        if child_id in self._slot_ids:
            raise ValueError(f"sequence {child_id} is already allocated")
        if not self._free_slot_ids:
            return False
        final_tokens = self._final_tokens[parent_id] if child_final_kv_tokens is None else child_final_kv_tokens
        self._place(child_id, num_tokens, final_tokens)
        return True

    def free(self, seq_id: int) -> None:
        """Return the slot to the stack."""
        self._free_slot_ids.append(self._slot_ids.pop(seq_id))
        self._untrack(seq_id)

    # --- views -----------------------------------------------------------------------------------

    def block_table(self, seq_id: int) -> list[int]:
        """``[slot_id]``: one block of ``s_max_tokens``."""
        return [self._slot_ids[seq_id]]

    def ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        """O(1) from running totals; every slot fits every admissible request, so ``next_shape``
        does not change anything."""
        num_used_slots = self.num_slots - len(self._free_slot_ids)
        return self._ledger(
            allocated_slots=num_used_slots * self.s_max_tokens,
            external_bytes=self._remainder_bytes,
            free_bytes=len(self._free_slot_ids) * self.slot_bytes,
        )

    # --- internals -------------------------------------------------------------------------------

    def _place(self, seq_id: int, num_tokens: int, final_kv_tokens: int) -> None:
        self._slot_ids[seq_id] = self._free_slot_ids.pop()
        self._track(seq_id, num_tokens, final_kv_tokens, self.s_max_tokens)

    def _capacity_tokens(self, seq_id: int) -> int:
        return self.s_max_tokens


@hookimpl
def kvbench_register_allocators() -> list[type]:
    return [NaiveAllocator]
