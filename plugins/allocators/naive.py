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
from kvbench.allocator import Allocator, MemoryLedger, SeqShape
from kvbench.config import require


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


class NaiveAllocator(Allocator):
    """Reserve-to-S_max: ``floor(budget / slot_bytes)`` slots handed out from a free-slot stack."""

    name = "naive"
    Config = NaiveConfig
    uses_watermark = False  # the whole future is reserved at admission: no growth headroom needed
    contiguous = True  # one contiguous range per sequence
    #: uniform slots never leave a hole some request cannot use (kept for a uniform engine view)
    num_fragmentation_refusals = 0

    def __init__(self, config: NaiveConfig | None = None, *, budget_bytes: int, kv_bytes_per_token: int) -> None:
        super().__init__(config or NaiveConfig(), budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token)
        self.s_max_tokens = self.config.s_max_tokens
        self.slot_bytes = self.s_max_tokens * self.kv_bytes_per_token
        self.num_slots = self.budget_bytes // self.slot_bytes
        self._remainder_bytes = self.budget_bytes - self.num_slots * self.slot_bytes
        # stack: O(1) allocate/free; reversed so that a fresh allocator hands out slot 0 first
        self._free_slot_ids: list[int] = list(range(self.num_slots - 1, -1, -1))
        self._slot_ids: dict[int, int] = {}
        self._num_tokens: dict[int, int] = {}
        # final length capped at the slot: what the sequence will still fill counts as reserved future
        self._final_tokens: dict[int, int] = {}
        self._num_token_slots = 0
        self._num_future_slots = 0

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

    def append(self, seq_id: int) -> bool:
        """Count one more token; ``False`` once the slot is full (the sequence cannot outgrow S_max)."""
        num_tokens = self._num_tokens[seq_id]
        if num_tokens >= self.s_max_tokens:
            return False
        self._num_tokens[seq_id] = num_tokens + 1
        self._num_token_slots += 1
        if num_tokens < self._final_tokens[seq_id]:
            self._num_future_slots -= 1
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
        num_tokens = self._num_tokens.pop(seq_id)
        self._num_token_slots -= num_tokens
        self._num_future_slots -= max(0, self._final_tokens.pop(seq_id) - num_tokens)

    # --- views -----------------------------------------------------------------------------------

    def num_tokens(self, seq_id: int) -> int:
        return self._num_tokens[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        """``[slot_id]``: one block of ``s_max_tokens``."""
        return [self._slot_ids[seq_id]]

    def ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        """O(1) from running totals; every slot fits every admissible request, so ``next_shape``
        does not change anything."""
        num_used_slots = self.num_slots - len(self._free_slot_ids)
        return MemoryLedger.from_slots(
            budget_bytes=self.budget_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            allocated_slots=num_used_slots * self.s_max_tokens,
            token_slots=self._num_token_slots,
            future_slots=self._num_future_slots,
            external_bytes=self._remainder_bytes,
            free_bytes=len(self._free_slot_ids) * self.slot_bytes,
        )

    # --- internals -------------------------------------------------------------------------------

    def _place(self, seq_id: int, num_tokens: int, final_kv_tokens: int) -> None:
        self._slot_ids[seq_id] = self._free_slot_ids.pop()
        self._num_tokens[seq_id] = num_tokens
        final_tokens = min(final_kv_tokens, self.s_max_tokens)
        self._final_tokens[seq_id] = final_tokens
        self._num_token_slots += num_tokens
        self._num_future_slots += max(0, final_tokens - num_tokens)


@hookimpl
def kvbench_register_allocators() -> list[type]:
    return [NaiveAllocator]
