"""Token accounting shared by the allocators that give each sequence one contiguous reservation.

``naive`` (uniform S_max slots) and ``per_request`` (request-sized ranges) differ only in where a
reservation goes and how big it is; how a sequence fills it (tokens held, slots it will still
fill, slots it never will) is the same bookkeeping, kept here as running totals so that
``append`` and ``ledger`` stay O(1).
"""

from __future__ import annotations

from abc import abstractmethod

from kvbench.memory.allocator import Allocator, MemoryLedger


class ContiguousAllocator(Allocator):
    """Base class (not a plugin): subclasses place reservations and report their capacity."""

    uses_watermark = False  # the whole future is reserved at admission: no growth headroom needed
    contiguous = True  # one contiguous range per sequence

    def __init__(self, config, *, budget_bytes: int, kv_bytes_per_token: int) -> None:
        super().__init__(config, budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token)
        self._num_tokens: dict[int, int] = {}
        # final length capped at the reservation: what the sequence will still fill is reserved future
        self._final_tokens: dict[int, int] = {}
        self._num_token_slots = 0
        self._num_future_slots = 0

    @abstractmethod
    def _capacity_tokens(self, seq_id: int) -> int:
        """Slots reserved for ``seq_id``."""

    def _track(self, seq_id: int, num_tokens: int, final_kv_tokens: int, capacity_tokens: int) -> None:
        """Start accounting for a sequence just placed in a reservation of ``capacity_tokens``."""
        final_tokens = min(final_kv_tokens, capacity_tokens)
        self._num_tokens[seq_id] = num_tokens
        self._final_tokens[seq_id] = final_tokens
        self._num_token_slots += num_tokens
        self._num_future_slots += max(0, final_tokens - num_tokens)

    def _untrack(self, seq_id: int) -> None:
        num_tokens = self._num_tokens.pop(seq_id)
        self._num_token_slots -= num_tokens
        self._num_future_slots -= max(0, self._final_tokens.pop(seq_id) - num_tokens)

    def append(self, seq_id: int) -> bool:
        """Count one more token; ``False`` only once the sequence has filled its reservation."""
        num_tokens = self._num_tokens[seq_id]
        if num_tokens >= self._capacity_tokens(seq_id):
            return False
        self._num_tokens[seq_id] = num_tokens + 1
        self._num_token_slots += 1
        if num_tokens < self._final_tokens[seq_id]:
            self._num_future_slots -= 1
        return True

    def num_tokens(self, seq_id: int) -> int:
        return self._num_tokens[seq_id]

    def _ledger(self, allocated_slots: int, external_bytes: int, free_bytes: int) -> MemoryLedger:
        return MemoryLedger.from_slots(
            budget_bytes=self.budget_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            allocated_slots=allocated_slots,
            token_slots=self._num_token_slots,
            future_slots=self._num_future_slots,
            external_bytes=external_bytes,
            free_bytes=free_bytes,
        )
