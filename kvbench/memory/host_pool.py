"""Host memory for swapped-out KV: a fixed pool, as vLLM's ``swap_space``.

Each swapped-out request holds the bytes of its transfer until it is swapped back in. When a
victim does not fit, the scheduler recomputes it instead and counts the fallback.
"""

from __future__ import annotations


class HostSwapPool:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        #: the most bytes held at once over the run
        self.peak_bytes = 0
        self._held: dict[int, int] = {}

    def reserve(self, owner_id: int, num_bytes: int) -> bool:
        """Hold ``num_bytes`` for ``owner_id``; ``False`` (changing nothing) when they do not fit."""
        if owner_id in self._held:
            raise ValueError(f"request {owner_id} already holds swap space")
        if self.used_bytes + num_bytes > self.capacity_bytes:
            return False
        self._held[owner_id] = num_bytes
        self.used_bytes += num_bytes
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return True

    def release(self, owner_id: int) -> int:
        """Give back what ``owner_id`` held (``KeyError`` if nothing)."""
        num_bytes = self._held.pop(owner_id)
        self.used_bytes -= num_bytes
        return num_bytes
