"""Per-request contiguous reservations (the Orca baselines of the vLLM paper; lecture Exercise 2).

Each sequence reserves ONE contiguous range of a real address space, sized by its own request
(``reserve``): its declared S_max, the next power of two of its true length, or exactly its true
length (an oracle). Variable sizes bring external fragmentation back: retiring sequences leaves
holes, and a request can be refused while the free bytes, added up, would hold it. This allocator
makes that observable: such a refusal is classified ``fragmented`` (:meth:`refusal_reason`).

The address space is counted in granules of ``granule_tokens`` slots. ``first_fit``/``best_fit``
keep free holes in a sorted list and coalesce neighbours on free; ``buddy`` is the classic binary
buddy system, over as many top-level power-of-two blocks as the budget holds.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from kvbench_plugins.allocators.contiguous import ContiguousAllocator

from kvbench import hookimpl
from kvbench.errors import require
from kvbench.memory.allocator import SeqShape

RESERVE_POLICIES = ("declared", "pow2", "oracle")
PLACEMENTS = ("first_fit", "best_fit", "buddy")


@dataclass
class PerRequestConfig:
    #: how many slots a request reserves: declared (its S_max, what Orca can know), pow2 (the prompt
    #: plus the next power of two of the output, the vLLM paper's Orca (Pow2)), oracle (exactly
    #: prompt + output)
    reserve: str = "declared"
    #: where a reservation goes: first_fit, best_fit (smallest hole that fits) or buddy
    placement: str = "first_fit"
    #: allocation unit in tokens (a power of two); reservations are rounded up to it
    granule_tokens: int = 16

    def validate(self) -> None:
        require(
            self.reserve in RESERVE_POLICIES,
            "allocator.reserve",
            self.reserve,
            f"choose one of {', '.join(RESERVE_POLICIES)}",
        )
        require(
            self.placement in PLACEMENTS,
            "allocator.placement",
            self.placement,
            f"choose one of {', '.join(PLACEMENTS)}",
        )
        size = self.granule_tokens
        require(
            isinstance(size, int) and size >= 1 and size & (size - 1) == 0,
            "allocator.granule_tokens",
            size,
            "use a power of two >= 1",
        )


class _HoleList:
    """Free holes as a sorted list of starts plus start -> size; O(#holes) search, coalescing free."""

    def __init__(self, num_granules: int, best_fit: bool) -> None:
        self._starts: list[int] = [0] if num_granules else []
        self._sizes: dict[int, int] = {0: num_granules} if num_granules else {}
        self._best_fit = best_fit

    def find(self, num_granules: int) -> int | None:
        chosen, chosen_size = None, None
        for start in self._starts:
            size = self._sizes[start]
            if size >= num_granules and (chosen_size is None or size < chosen_size):
                chosen, chosen_size = start, size
                if not self._best_fit or size == num_granules:
                    break
        return chosen

    def take(self, num_granules: int) -> int | None:
        start = self.find(num_granules)
        if start is None:
            return None
        index = bisect_left(self._starts, start)
        size = self._sizes.pop(start)
        if size == num_granules:
            del self._starts[index]
        else:  # the hole shrinks from the front and keeps its place in the order
            self._starts[index] = start + num_granules
            self._sizes[start + num_granules] = size - num_granules
        return start

    def give(self, start: int, num_granules: int) -> None:
        index = bisect_left(self._starts, start)
        if index < len(self._starts) and self._starts[index] == start + num_granules:
            num_granules += self._sizes.pop(self._starts[index])
            del self._starts[index]
        if index and self._starts[index - 1] + self._sizes[self._starts[index - 1]] == start:
            self._sizes[self._starts[index - 1]] += num_granules
        else:
            self._starts.insert(index, start)
            self._sizes[start] = num_granules

    def largest(self) -> int:
        return max(self._sizes.values(), default=0)

    def granules_below(self, num_granules: int) -> int:
        return sum(size for size in self._sizes.values() if size < num_granules)


class _BuddyArena:
    """Binary buddy system over the whole budget: one free set per order, split and merge.

    The budget of ``num_granules`` is cut into as many top-level blocks as it holds, one per bit of
    ``num_granules`` from the largest down (983 granules: 512 + 256 + 128 + 64 + 16 + 4 + 2 + 1),
    each aligned to its own size. A block never merges past the top-level block it lies in. What
    no reservation can use is then the top-level blocks smaller than it, not half of the budget.
    """

    def __init__(self, num_granules: int) -> None:
        self.max_order = num_granules.bit_length() - 1  # -1: no arena at all
        self._free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        #: start of each top-level block -> its order, in address order
        self._tops: list[tuple[int, int]] = []
        start = 0
        for order in range(self.max_order, -1, -1):
            if num_granules >> order & 1:
                self._free[order].add(start)
                self._tops.append((start, order))
                start += 1 << order

    def take(self, num_granules: int) -> int | None:
        order = (num_granules - 1).bit_length()
        found = next((j for j in range(order, self.max_order + 1) if self._free[j]), None)
        if found is None:
            return None
        start = min(self._free[found])  # lowest address: deterministic, keeps the top end whole
        self._free[found].remove(start)
        while found > order:  # split: keep the lower half, free the upper buddy
            found -= 1
            self._free[found].add(start + (1 << found))
        return start

    def give(self, start: int, num_granules: int) -> None:
        order = (num_granules - 1).bit_length()
        top_order = self._top_order(start)
        while order < top_order and (buddy := start ^ (1 << order)) in self._free[order]:
            self._free[order].remove(buddy)  # merge with the free buddy
            start = min(start, buddy)
            order += 1
        self._free[order].add(start)

    def largest(self) -> int:
        return next((1 << j for j in range(self.max_order, -1, -1) if self._free[j]), 0)

    def granules_below(self, num_granules: int) -> int:
        order = (num_granules - 1).bit_length()
        return sum(len(self._free[j]) << j for j in range(min(order, self.max_order + 1)))

    def _top_order(self, start: int) -> int:
        """The order of the top-level block holding granule ``start``."""
        for top_start, order in self._tops:
            if top_start <= start < top_start + (1 << order):
                return order
        raise ValueError(f"granule {start} is outside the arena")


class PerRequestAllocator(ContiguousAllocator):
    """One contiguous, request-sized range per sequence; holes and refusals are real."""

    name = "per_request"
    Config = PerRequestConfig

    def __init__(
        self,
        config: PerRequestConfig | None = None,
        *,
        budget_bytes: int,
        kv_bytes_per_token: int,
        state_bytes_per_request: int = 0,
    ) -> None:
        super().__init__(
            config or PerRequestConfig(),
            budget_bytes=budget_bytes,
            kv_bytes_per_token=kv_bytes_per_token,
            state_bytes_per_request=state_bytes_per_request,
        )
        self.granule_tokens = self.config.granule_tokens
        self.granule_bytes = self.granule_tokens * self.kv_bytes_per_token
        self.num_granules = self.budget_bytes // self.granule_bytes
        self._is_buddy = self.config.placement == "buddy"
        if self._is_buddy:
            self._holes: _HoleList | _BuddyArena = _BuddyArena(self.num_granules)
        else:
            self._holes = _HoleList(self.num_granules, best_fit=self.config.placement == "best_fit")
        self._remainder_bytes = self.budget_bytes - self.num_granules * self.granule_bytes
        self._num_free_granules = self.num_granules

    # --- sizing ----------------------------------------------------------------------------------

    @property
    def block_size_tokens(self) -> int:
        return self.granule_tokens

    def reservation_granules(self, shape: SeqShape) -> int:
        """Granules one range of ``shape`` takes under the ``reserve`` policy."""
        reserve = self.config.reserve
        if reserve == "declared":
            tokens = shape.s_max_tokens
        elif reserve == "pow2":  # the output over-reserved by at most 2x (the paper: 25 -> 32)
            prompt = min(
                shape.num_tokens if shape.prompt_tokens is None else shape.prompt_tokens, shape.final_kv_tokens
            )
            output = shape.final_kv_tokens + 1 - prompt
            tokens = prompt + (1 << (output - 1).bit_length())
        else:
            tokens = shape.final_kv_tokens + 1
        granules = max(1, -(-max(tokens, shape.num_tokens) // self.granule_tokens))
        if not self._is_buddy:
            return granules
        # a buddy block is a power of two with the state's granules in it: the KV gets the rest
        state = self.state_slots // self.granule_tokens
        return (1 << (granules + state - 1).bit_length()) - state

    def max_sequence_tokens(self, shape: SeqShape) -> int:
        """The reservation's slots if it fits the empty address space, else 0 (never admissible)."""
        granules = self.reservation_granules(shape)
        fits = granules + self.state_slots // self.granule_tokens <= self.num_granules
        return granules * self.granule_tokens if fits else 0

    def _fits_ranges_in_empty(self, range_slots: int, num_ranges: int) -> bool:
        # equal ranges tile an empty space (for buddy, equal power-of-two blocks tile the arena)
        return range_slots // self.granule_tokens * num_ranges <= self.num_granules

    def largest_hole_bytes(self) -> int:
        """The largest contiguous free range (for buddy: the largest free block)."""
        return self._holes.largest() * self.granule_bytes

    # --- placement -------------------------------------------------------------------------------

    def _state_unit_tokens(self) -> int:
        return self.config.granule_tokens  # a state takes whole granules, after its range's KV

    def _range_tokens(self, shape: SeqShape) -> int:
        return self.reservation_granules(shape) * self.granule_tokens

    def _take(self, num_slots: int) -> int | None:
        granules = num_slots // self.granule_tokens
        start = self._holes.take(granules) if granules <= self.num_granules else None
        if start is not None:
            self._num_free_granules -= granules
        return start

    def _give(self, start: int, num_slots: int) -> None:
        granules = num_slots // self.granule_tokens
        self._holes.give(start, granules)
        self._num_free_granules += granules

    def _fragmented(self, num_slots: int) -> bool:
        """Enough free granules in total, but no hole holds a range of ``num_slots``."""
        granules = num_slots // self.granule_tokens
        return self._num_free_granules >= granules and self._holes.largest() < granules

    def _free_and_external_bytes(self, next_shape: SeqShape | None) -> tuple[int, int]:
        """Free holes smaller than ``next_shape``'s range are external; O(#holes) with a
        ``next_shape``, O(1) without."""
        range_granules = 0 if next_shape is None else self.reservation_granules(next_shape)
        range_granules += self.state_slots // self.granule_tokens  # the range holds the state too
        hole_granules = 0 if next_shape is None else self._holes.granules_below(range_granules)
        free_bytes = (self._num_free_granules - hole_granules) * self.granule_bytes
        return free_bytes, self._remainder_bytes + hole_granules * self.granule_bytes


@hookimpl
def kvbench_register_allocators() -> list[type]:
    return [PerRequestAllocator]
