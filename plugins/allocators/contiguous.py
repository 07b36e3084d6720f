"""What every allocator that gives each sequence ONE contiguous reservation has in common.

``naive`` (uniform S_max slots) and ``per_request`` (request-sized ranges) differ only in where a
range goes and how big it is. How a sequence fills its range, how a fan-out reserves its
branches, how a fork copies, how a swap moves a range out and back, and the running totals that
keep ``append`` and ``ledger`` O(1) are the same, and live here.

A request that forks into ``n`` branches reserves ``n`` ranges at admission (the vLLM paper's
contiguous baselines cannot share a prompt): the ``n - 1`` spare ranges wait, counted as reserved
future, until the fork copies the parent's tokens into them.

A model with per-request state (linear-attention layers) gets it inside each range, after the
sequence's KV: ``state_slots`` more slots, the state rounded up to the subclass's unit
(:meth:`ContiguousAllocator._state_unit_tokens`), as a static cache keeps a batch slot's state
beside its KV. A spare range's state is reserved future until the fork copies the parent's state in
with its tokens (each branch then has its own); a swap moves it with the tokens.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import numpy as np

from kvbench.core.kv import DecodeProjection, Footprint, KVCopy, Refusal, SeqShape, Transfer
from kvbench.core.ledger import MemoryLedger
from kvbench.memory.allocator import Allocator, AllocatorCapabilities


class ContiguousAllocator(Allocator):
    """Base class (not a plugin): subclasses place ranges (:meth:`_take`, :meth:`_give`) and size them."""

    capabilities = AllocatorCapabilities(
        reserves_future=True, contiguous_layout=True, shares_blocks=False, can_swap=True, projects_decode=True
    )

    def __init__(
        self, config=None, *, budget_bytes: int, kv_bytes_per_token: int, state_bytes_per_request: int = 0
    ) -> None:
        """``config``: the subclass's ``Config`` (None: its defaults)."""
        config = type(self).Config() if config is None else config
        super().__init__(
            config,
            budget_bytes=budget_bytes,
            kv_bytes_per_token=kv_bytes_per_token,
            state_bytes_per_request=state_bytes_per_request,
        )
        #: slots after a range's KV that hold its sequence's state (0: the model keeps none)
        self.state_slots = 0
        if self.state_bytes_per_request:
            unit = self._state_unit_tokens()
            self.state_slots = -(-self.state_bytes_per_request // (unit * self.kv_bytes_per_token)) * unit
        self._start: dict[int, int] = {}  # seq -> first block of its range
        self._capacity: dict[int, int] = {}  # seq -> slots reserved
        self._num_tokens: dict[int, int] = {}
        self._final: dict[int, int] = {}  # final length, capped at the range (what it will fill)
        self._root: dict[int, int] = {}  # seq -> the sequence its family was admitted as
        self._spares: dict[int, list[tuple[int, int]]] = {}  # root -> [(start, capacity)] not yet forked into
        self._spare_final: dict[int, int] = {}
        self._swapped: dict[int, tuple] = {}
        self._num_allocated_slots = 0
        self._num_token_slots = 0
        self._num_future_slots = 0
        self._num_states = 0  # live sequences (each holds a state)
        self._num_spare_states = 0  # spare ranges (each reserves a state)

    # --- what subclasses provide ------------------------------------------------------------------

    @abstractmethod
    def _range_tokens(self, shape: SeqShape) -> int:
        """Slots one range of this shape reserves."""

    @abstractmethod
    def _take(self, num_slots: int) -> int | None:
        """Place a range of ``num_slots`` slots; its first block id, or None when no hole holds it."""

    @abstractmethod
    def _give(self, start: int, num_slots: int) -> None:
        """Return a range taken by :meth:`_take`."""

    @abstractmethod
    def _free_and_external_bytes(self, next_shape: SeqShape | None) -> tuple[int, int]:
        """(usable free bytes, externally fragmented bytes) for the ledger."""

    @abstractmethod
    def _fragmented(self, num_slots: int) -> bool:
        """Whether ``num_slots`` free slots exist in total although no hole holds them."""

    def _state_unit_tokens(self) -> int:
        """The slots a state is rounded up to a multiple of (a subclass placing granules: its granule)."""
        return 1

    # --- sizing ----------------------------------------------------------------------------------

    def reservation_tokens(self, shape: SeqShape) -> int:
        """Slots :meth:`allocate` takes: one range per branch (its state included)."""
        return (self._range_tokens(shape) + self.state_slots) * shape.num_branches

    def fits_in_empty(self, shape: SeqShape) -> bool:
        """All branches' ranges fit the empty address space at once, and a range holds the final length."""
        one = self.max_sequence_tokens(shape)
        return shape.final_kv_tokens <= one and self._fits_ranges_in_empty(one + self.state_slots, shape.num_branches)

    def _fits_ranges_in_empty(self, range_slots: int, num_ranges: int) -> bool:
        """Whether ``num_ranges`` ranges of ``range_slots`` (states included) fit the empty space."""
        return range_slots * num_ranges * self.kv_bytes_per_token <= self.budget_bytes

    # --- verbs -----------------------------------------------------------------------------------

    def allocate(self, seq_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> int | None:
        """Reserve one range per branch, all or nothing (``keep_free_bytes`` is ignored: the whole
        future is reserved, so there is no growth to keep headroom for)."""
        if seq_id in self._capacity or seq_id in self._swapped:
            raise ValueError(f"sequence {seq_id} is already allocated")
        num_slots = self._range_tokens(shape)
        if shape.num_tokens > num_slots:
            return None
        ranges = self._take_ranges(num_slots + self.state_slots, shape.num_branches)
        if ranges is None:
            return None
        ranges = [(start, num_slots) for start, _ in ranges]  # each range's KV (its state follows)
        start, capacity = ranges[0]
        self._track(seq_id, start, capacity, shape.num_tokens, shape.final_kv_tokens, root=seq_id)
        if len(ranges) > 1:
            self._spares[seq_id] = ranges[1:]
            self._spare_final[seq_id] = shape.final_kv_tokens
            for _, spare_capacity in ranges[1:]:
                self._num_allocated_slots += spare_capacity
                self._num_future_slots += min(shape.final_kv_tokens, spare_capacity)
                self._num_spare_states += 1
        return 0

    def refusal_reason(self, shape: SeqShape, keep_free_bytes: int = 0) -> Refusal:
        needed = (self._range_tokens(shape) + self.state_slots) * shape.num_branches
        return Refusal.FRAGMENTED if self._fragmented(needed) else Refusal.NO_MEMORY

    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Count more tokens; ``False`` only once the sequence would overflow its range."""
        tokens = self._num_tokens[seq_id]
        if tokens + num_tokens > self._capacity[seq_id]:
            return False
        self._num_tokens[seq_id] = tokens + num_tokens
        self._num_token_slots += num_tokens
        self._num_future_slots -= min(num_tokens, max(0, self._final[seq_id] - tokens))
        return True

    def append_each(self, seq_ids: Sequence[int], num_tokens: int) -> int:
        """``append(seq_id, num_tokens)`` for each in turn, in one pass: the counts change per
        sequence, the totals (integers) once. A subclass with its own ``append`` appends one by one."""
        if type(self).append is not ContiguousAllocator.append:
            return super().append_each(seq_ids, num_tokens)
        counts, capacity, final = self._num_tokens, self._capacity, self._final
        used_future = 0  # of the reserved future: up to each sequence's final length
        done = 0
        for seq_id in seq_ids:
            tokens = counts[seq_id]
            if tokens + num_tokens > capacity[seq_id]:
                break
            counts[seq_id] = tokens + num_tokens
            left = final[seq_id] - tokens
            if left > 0:
                used_future += num_tokens if num_tokens < left else left
            done += 1
        self._num_token_slots += num_tokens * done
        self._num_future_slots -= used_future
        return done

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Uncount tokens; the range stays reserved."""
        tokens = self._num_tokens[seq_id]
        if not 0 <= num_tokens <= tokens:
            raise ValueError(f"cannot truncate sequence {seq_id} from {tokens} to {num_tokens} tokens")
        final = self._final[seq_id]
        self._num_tokens[seq_id] = num_tokens
        self._num_token_slots -= tokens - num_tokens
        self._num_future_slots += max(0, final - num_tokens) - max(0, final - tokens)

    def fork(self, parent_id: int, child_id: int, child_final_kv_tokens: int | None = None) -> None:
        """Copy the parent's tokens into the child's range: a spare of the family for a new child,
        or the child's own range when it already exists (its tokens are replaced)."""
        tokens = self._num_tokens[parent_id]
        final = self._final[parent_id] if child_final_kv_tokens is None else child_final_kv_tokens
        if child_id in self._capacity:
            if tokens > self._capacity[child_id]:
                raise ValueError(f"sequence {child_id}'s range cannot hold {tokens} tokens of {parent_id}")
            root = self._root[child_id]
            start, capacity = self._start[child_id], self._capacity[child_id]
            self._untrack(child_id)
        else:
            root = self._root[parent_id]
            spares = self._spares.get(root)
            if not spares:
                raise RuntimeError(f"fork of {parent_id}: its family reserved no branch for {child_id}")
            start, capacity = spares.pop(0)  # branches in address order
            if not spares:
                del self._spares[root]
            self._num_allocated_slots -= capacity
            self._num_future_slots -= min(self._spare_final[root], capacity)
            self._num_spare_states -= 1
            if root not in self._spares:
                del self._spare_final[root]
        self._track(child_id, start, capacity, tokens, final, root=root)
        if tokens or self.state_bytes_per_request:  # the parent's tokens and its state (each branch its own)
            blocks = -(-tokens // self.block_size_tokens)
            copy_bytes = tokens * self.kv_bytes_per_token + self.state_bytes_per_request
            self._pending_copies.append(KVCopy(self._start[parent_id], start, blocks, copy_bytes))

    def free(self, seq_id: int) -> None:
        """Give the range back (and any branch ranges its family never forked into)."""
        start, capacity = self._start[seq_id], self._capacity[seq_id]
        self._untrack(seq_id)
        self._give(start, capacity + self.state_slots)
        self._release_spares(seq_id)

    def swap_out(self, seq_ids: Sequence[int]) -> Transfer:
        """Copy each sequence's tokens to the host (one run each) and give its range back."""
        num_bytes = num_runs = 0
        for seq_id in seq_ids:
            tokens = self._num_tokens[seq_id]
            spares = self._spares.get(seq_id, [])
            record = (
                tokens,
                self._final[seq_id],
                self._capacity[seq_id],
                self._root[seq_id],
                [capacity for _, capacity in spares],
                self._spare_final.get(seq_id),
            )
            self.free(seq_id)
            self._swapped[seq_id] = record
            num_bytes += tokens * self.kv_bytes_per_token + self.state_bytes_per_request  # the state moves too
            num_runs += 1 if tokens or self.state_bytes_per_request else 0
        return Transfer(num_bytes, num_runs)

    def swap_in(self, seq_ids: Sequence[int], keep_free_bytes: int = 0) -> Transfer | None:
        """Reserve every range again (all or nothing) and copy the tokens back."""
        taken: list[tuple[int, int]] = []
        for seq_id in seq_ids:
            _, _, capacity, _, spare_capacities, _ = self._swapped[seq_id]
            for num_slots in (capacity, *spare_capacities):
                start = self._take(num_slots + self.state_slots)
                if start is None:
                    for s, c in reversed(taken):
                        self._give(s, c + self.state_slots)
                    return None
                taken.append((start, num_slots))
        num_bytes = num_runs = 0
        ranges = iter(taken)
        for seq_id in seq_ids:
            tokens, final, capacity, root, spare_capacities, spare_final = self._swapped.pop(seq_id)
            start, _ = next(ranges)
            self._track(seq_id, start, capacity, tokens, final, root=root)
            spares = [next(ranges) for _ in spare_capacities]
            if spares:
                self._spares[seq_id] = spares
                self._spare_final[seq_id] = spare_final
                for _, spare_capacity in spares:
                    self._num_allocated_slots += spare_capacity
                    self._num_future_slots += min(spare_final, spare_capacity)
                    self._num_spare_states += 1
            num_bytes += tokens * self.kv_bytes_per_token + self.state_bytes_per_request
            num_runs += 1 if tokens or self.state_bytes_per_request else 0
        return Transfer(num_bytes, num_runs)

    # --- views -----------------------------------------------------------------------------------

    def num_tokens(self, seq_id: int) -> int:
        return self._num_tokens[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        """Every block of the sequence's range, in address order."""
        start = self._start[seq_id]
        return list(range(start, start + self._capacity[seq_id] // self.block_size_tokens))

    def ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        free_bytes, external_bytes = self._free_and_external_bytes(next_shape)
        # live states are the state part, spare ones reserved future, the rounding of both internal
        # (all zero for a model without per-request state)
        one_state = self.state_bytes_per_request if self.state_slots else 0
        return MemoryLedger.from_slots(
            budget_bytes=self.budget_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            allocated_slots=self._num_allocated_slots,
            token_slots=self._num_token_slots,
            future_slots=self._num_future_slots,
            external_bytes=external_bytes,
            free_bytes=free_bytes,
            state_bytes=self._num_states * one_state,
            state_future_bytes=self._num_spare_states * one_state,
            state_held_bytes=self.state_held_bytes(),
        )

    def state_held_bytes(self) -> int:
        return (self._num_states + self._num_spare_states) * self.state_slots * self.kv_bytes_per_token

    def footprint(self, seq_ids: Sequence[int]) -> Footprint:
        state = self.state_slots
        held = sum(self._capacity[s] + state + sum(c + state for _, c in self._spares.get(s, ())) for s in seq_ids)
        tokens = [self._num_tokens[s] for s in seq_ids]
        state_bytes = self.state_bytes_per_request
        moved = sum(tokens) * self.kv_bytes_per_token + len(tokens) * state_bytes
        return Footprint(held * self.kv_bytes_per_token, Transfer(moved, sum(1 for t in tokens if t or state_bytes)))

    def project_decode(
        self, seq_ids: Sequence[int], max_steps: int, next_shape: SeqShape | None = None
    ) -> DecodeProjection:
        """Growth never takes memory until a range is full, and every step turns one reserved slot
        per sequence into a token slot (no sequence passes its final length within ``max_steps``)."""
        if not seq_ids or max_steps <= 0:
            return DecodeProjection(0, {})
        slack = min(self._capacity[s] - self._num_tokens[s] for s in seq_ids)
        num_steps = min(max_steps, slack)
        led = self.ledger(next_shape)
        step_bytes = len(seq_ids) * self.kv_bytes_per_token * np.arange(1, num_steps + 1, dtype=np.int64)
        ledgers = {
            "token_bytes": led.token_bytes + step_bytes,
            "reserved_future_bytes": led.reserved_future_bytes - step_bytes,
        }
        for name in ("internal_bytes", "external_bytes", "free_bytes", "cached_bytes", "state_bytes"):
            ledgers[name] = np.full(num_steps, getattr(led, name), dtype=np.int64)
        return DecodeProjection(num_steps, ledgers)

    # --- internals -------------------------------------------------------------------------------

    def _take_ranges(self, num_slots: int, count: int) -> list[tuple[int, int]] | None:
        taken: list[tuple[int, int]] = []
        for _ in range(count):
            start = self._take(num_slots)
            if start is None:
                for s, c in reversed(taken):  # undo in reverse so the holes merge back exactly
                    self._give(s, c)
                return None
            taken.append((start, num_slots))
        return taken

    def _track(self, seq_id: int, start: int, capacity: int, num_tokens: int, final_kv_tokens: int, root: int) -> None:
        final = min(final_kv_tokens, capacity)
        self._start[seq_id] = start
        self._capacity[seq_id] = capacity
        self._num_tokens[seq_id] = num_tokens
        self._final[seq_id] = final
        self._root[seq_id] = root
        self._num_states += 1
        self._num_allocated_slots += capacity
        self._num_token_slots += num_tokens
        self._num_future_slots += max(0, final - num_tokens)

    def _untrack(self, seq_id: int) -> None:
        tokens = self._num_tokens.pop(seq_id)
        capacity = self._capacity.pop(seq_id)
        del self._start[seq_id], self._root[seq_id]
        self._num_states -= 1
        self._num_allocated_slots -= capacity
        self._num_token_slots -= tokens
        self._num_future_slots -= max(0, self._final.pop(seq_id) - tokens)

    def _release_spares(self, root: int) -> None:
        spares = self._spares.pop(root, None)
        if not spares:
            return
        final = self._spare_final.pop(root)
        for start, capacity in reversed(spares):
            self._num_allocated_slots -= capacity
            self._num_future_slots -= min(final, capacity)
            self._num_spare_states -= 1
            self._give(start, capacity + self.state_slots)
