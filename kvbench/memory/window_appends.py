"""How a sliding-window model's sequences grow (``hybrid_paged``'s appends), fast where it can be.

:class:`WindowGrowth` is the part of :class:`kvbench_plugins.allocators.hybrid_paged.HybridPagedAllocator`
that appends, kept here beside the pool (:mod:`kvbench.memory.group_pool`) and the block arithmetic
(:mod:`kvbench.memory.kv_group_blocks`) it uses:

- the ledger's token and reserved-future slots are running totals of per-sequence terms (the
  unfilled tail of each group's last block, and the part of it the sequence will still fill), so
  the ledger is O(1) while no block is shared;
- each sequence knows the length up to which its appends take and free no block (its last block
  is not full and no window reaches its first held block): ``append_each`` grows such sequences
  by a counter and two totals;
- with nothing shared or keyed, released blocks go back to the free pool and new ones come from it
  as list slices (:meth:`WindowGrowth._append_private`), and window groups of one window move in
  step (:meth:`WindowGrowth._append_in_step`); otherwise block by block, as holders and keys say.

It reads and writes the allocator's tables and totals (``_tables``, ``_num_tokens``,
``_final_kv_tokens``, ``_layout``, ``_quiet_until``, ``_num_tail_slots``, ``_num_future_slots``),
its group shape (``_windows``, ``_num_groups``, ``_window_groups``, ``_num_window_groups``,
``_window_tokens``, ``_is_window``, ``_block_size_tokens``, ``group_layout``), its ``pool`` (and the
pool's containers the hot paths read: ``_shared_refs``, ``_block_key``, ``_free_block_ids``,
``_held_per_column``), ``_pending_keys`` and ``_key_blocks``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.core.kv import KVCopy
from kvbench.memory.kv_group_blocks import GroupLayout, GroupTable
from kvbench.memory.window_projection import Slides


class WindowGrowth:
    """Appends of a sliding-window model's per-group block tables (see the module docstring)."""

    def _start_growth(self, layout: GroupLayout) -> None:
        """The state the appends keep, empty (the allocator's ``__init__`` calls it)."""
        windows = layout.windows
        self._is_window = tuple(bool(w) for w in windows)
        self._window_groups = tuple(g for g, w in enumerate(windows) if w)
        self._num_window_groups = len(self._window_groups)
        #: the window of every window group when they share one (Gemma-3, Mistral): their blocks
        #: then move in step (:meth:`_append_in_step`); 0 otherwise
        per_window = layout.groups_per_window
        self._window_tokens = per_window[0][0] if len(per_window) == 1 else 0
        self._tables: dict[int, list[GroupTable]] = {}
        self._num_tokens: dict[int, int] = {}
        self._final_kv_tokens: dict[int, int] = {}
        # The ledger's running totals, summed over sequences as if nothing were shared: per group
        # holding blocks, the last block's unfilled slots, and those the sequence will still fill
        self._num_tail_slots = self._num_future_slots = 0
        self._layout: dict[int, tuple[int, Slides]] = {}  # seq -> (its groups holding blocks, next frees)
        self._quiet_until: dict[int, int] = {}  # seq -> the length up to which appends take and free none
        self.num_cow_copies = 0
        #: blocks a window moved past, per sequence and group (freed, or never taken when a run of
        #: steps appended at once passed them): the same in both loops, whatever the run lengths
        self.num_window_slid_blocks = 0

    def _slots(self, num_tokens: int, final_tokens: int, num_filled: int) -> tuple[int, int]:
        """A sequence's terms of the running totals: the unfilled slots of its groups' last blocks,
        and the part of them it will still fill (up to its final length)."""
        tail = -num_tokens % self._block_size_tokens
        if not tail or not num_filled:
            return 0, 0
        remaining = final_tokens - num_tokens
        return num_filled * tail, num_filled * (tail if tail < remaining else max(remaining, 0))

    def _forget(self, seq_id: int) -> None:
        """Take the sequence's terms out of the totals: before its tables change or it goes."""
        tail, future = self._slots(self._num_tokens[seq_id], self._final_kv_tokens[seq_id], self._layout[seq_id][0])
        self._num_tail_slots -= tail
        self._num_future_slots -= future

    def _count(self, seq_id: int) -> None:
        """Put the sequence's terms into the totals (after its tables changed), and note how long
        its appends take, free and copy no block."""
        n = self._num_tokens[seq_id]
        size = self._block_size_tokens
        tables = self._tables[seq_id]
        num_filled = 0
        frees_at: dict[int, int] = {}
        for window, (first, blocks) in zip(self._windows, tables):
            if blocks:
                num_filled += 1
            if window:  # the window leaves block `first` once the length reaches window + (first + 1) B
                at = window + (first + 1) * size
                frees_at[at] = frees_at.get(at, 0) + 1
        tail, future = self._slots(n, self._final_kv_tokens[seq_id], num_filled)
        self._num_tail_slots += tail
        self._num_future_slots += future
        quiet_until = -(-n // size) * size  # its last block full
        if num_filled < len(tables):
            quiet_until = n  # a window group holding no block: every append goes the general way
        elif tail and self._shared_refs and any(blocks[-1] in self._shared_refs for _, blocks in tables):
            quiet_until = n  # a shared partly filled last block: the next append copies it
        if frees_at:
            quiet_until = min(quiet_until, min(frees_at) - 1)
        self._layout[seq_id] = (num_filled, tuple(frees_at.items()))
        self._quiet_until[seq_id] = quiet_until

    # --- prefix cache --------------------------------------------------------------------------------

    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Release the blocks the grown sequence's windows left, copy a shared partly filled last
        block, then take the new blocks; all or nothing."""
        n = self._num_tokens[seq_id]
        if n + num_tokens <= self._quiet_until[seq_id] and not (self._pending_keys and seq_id in self._pending_keys):
            # within every group's last block, no window leaving a held block: only the tails fill
            self._grow_terms(seq_id, n, n + num_tokens, self._num_groups, self._num_groups)
            return True
        if self._shared_refs or self._block_key:
            return self._append_shared(seq_id, num_tokens)
        return self._append_private(seq_id, n, n + num_tokens)

    def _append_private(self, seq_id: int, num_tokens: int, new_num_tokens: int) -> bool:
        """:meth:`append` with no block shared or keyed anywhere: released blocks go back to the
        free pool and new ones come from it as list slices; the sequence's terms and quiet length
        follow from its tables here."""
        num_filled, frees_at = self._layout[seq_id]
        if self._window_tokens and num_filled == self._num_groups and len(frees_at) == 1:
            return self._append_in_step(seq_id, num_tokens, new_num_tokens, frees_at[0][0])
        return self._append_by_group(seq_id, num_tokens, new_num_tokens)

    def _append_in_step(self, seq_id: int, num_tokens: int, new_num_tokens: int, frees_at: int) -> bool:
        """:meth:`_append_private` of a sequence whose window groups (all of one window) hold the
        same logical blocks, as appends keep them: they release and take alike, so the blocks
        follow from one window group's arithmetic, and the full groups take as many as the length
        needs."""
        size, window, num_windows = self._block_size_tokens, self._window_tokens, self._num_window_groups
        first = (frees_at - window) // size - 1  # the window groups' first held block
        end, held_end = -(-new_num_tokens // size), -(-num_tokens // size)  # (every table ends at the last block)
        new_first = (new_num_tokens - window) // size if new_num_tokens >= frees_at else first
        num_released = new_first - first if new_first < held_end else held_end - first
        window_taken = end - (held_end if held_end > new_first else new_first)
        full_taken = end - held_end
        num_full = self._num_groups - num_windows
        num_needed = num_full * full_taken + num_windows * window_taken
        if num_needed > self.pool.num_available() + num_windows * num_released:
            return False
        tables = self._tables[seq_id]
        if new_first != first:  # every window group releases before any group takes
            free = self._free_block_ids
            for g in self._window_groups:
                blocks = tables[g][1]
                if num_released == 1:
                    free.append(blocks.pop(0))
                elif num_released:
                    free.extend(blocks[:num_released])
                    del blocks[:num_released]
                tables[g] = (new_first, blocks)
            self.num_window_slid_blocks += num_windows * (new_first - first)
        if num_needed:
            taken = self.pool.take(num_needed)  # in pool order: group by group, as one-by-one takes
            if num_needed == len(tables):  # the usual: a block each (a window's block leaves at another step)
                for (_, blocks), block_id in zip(tables, taken):
                    blocks.append(block_id)
            else:
                used = 0
                for is_window, (_, blocks) in zip(self._is_window, tables):
                    num_taken = window_taken if is_window else full_taken
                    if num_taken:
                        blocks.extend(taken[used : used + num_taken])
                        used += num_taken
        held = self._held_per_column
        if num_full:
            held[0] += num_full * full_taken  # (the full groups' part comes first)
        held[-1] += num_windows * (window_taken - num_released)
        self._grow_terms(seq_id, num_tokens, new_num_tokens, self._num_groups, self._num_groups)
        frees_at = window + (new_first + 1) * size
        self._layout[seq_id] = (self._num_groups, ((frees_at, num_windows),))
        self._quiet_until[seq_id] = end * size if end * size < frees_at else frees_at - 1
        return True

    def _append_by_group(self, seq_id: int, num_tokens: int, new_num_tokens: int) -> bool:
        """:meth:`_append_private` group by group (windows of several sizes, or window groups apart
        after a truncation)."""
        size, windows = self._block_size_tokens, self._windows
        end = -(-new_num_tokens // size)
        tables = self._tables[seq_id]
        moves = []  # window groups whose window left held blocks: (group, new first block, blocks released)
        num_freed = num_needed = 0
        for g, (first, blocks) in enumerate(tables):
            window = windows[g]
            held_end = first + len(blocks)
            if window and new_num_tokens - window >= (first + 1) * size:  # the window left block `first`
                new_first = (new_num_tokens - window) // size
                num_released = min(new_first - first, len(blocks))
                num_freed += num_released
                moves.append((g, new_first, num_released))
                num_needed += end - (held_end if held_end > new_first else new_first)
            else:
                num_needed += end - held_end
        if num_needed > self.pool.num_available() + num_freed:
            return False
        free, held, column_of = self._free_block_ids, self._held_per_column, self.pool.column_of
        for g, new_first, num_released in moves:  # every group releases before any takes
            first, blocks = tables[g]
            if num_released:
                free.extend(blocks[:num_released])
                del blocks[:num_released]
                held[column_of[g]] -= num_released
            self.num_window_slid_blocks += new_first - first
            tables[g] = (new_first, blocks)
        taken = self.pool.take(num_needed)  # in pool order: group by group, as one-by-one takes
        used = num_filled = 0
        frees_at: dict[int, int] = {}
        for g, (first, blocks) in enumerate(tables):
            num_taken = end - first - len(blocks)
            if num_taken > 0:
                blocks.extend(taken[used : used + num_taken])
                held[column_of[g]] += num_taken
                used += num_taken
            if blocks:
                num_filled += 1
            if windows[g]:
                at = windows[g] + (first + 1) * size
                frees_at[at] = frees_at.get(at, 0) + 1
        self._grow_terms(seq_id, num_tokens, new_num_tokens, self._layout[seq_id][0], num_filled)
        self._layout[seq_id] = (num_filled, tuple(frees_at.items()))
        quiet_until = end * size if num_filled == self._num_groups else new_num_tokens
        self._quiet_until[seq_id] = min(quiet_until, min(frees_at) - 1) if frees_at else quiet_until
        return True

    def _grow_terms(
        self, seq_id: int, num_tokens: int, new_num_tokens: int, num_filled: int, new_num_filled: int
    ) -> None:
        """The sequence grown to ``new_num_tokens``: its terms of the totals move from what its
        ``num_filled`` groups holding blocks gave at ``num_tokens`` to what ``new_num_filled`` give."""
        final, size = self._final_kv_tokens[seq_id], self._block_size_tokens
        # (_slots, twice, inline: this runs at every append that takes or frees a block)
        tail, remaining = -num_tokens % size, final - num_tokens
        future = tail if tail < remaining else (remaining if remaining > 0 else 0)
        new_tail, remaining = -new_num_tokens % size, final - new_num_tokens
        new_future = new_tail if new_tail < remaining else (remaining if remaining > 0 else 0)
        self._num_tail_slots += new_num_filled * new_tail - num_filled * tail
        self._num_future_slots += new_num_filled * new_future - num_filled * future
        self._num_tokens[seq_id] = new_num_tokens

    def _append_shared(self, seq_id: int, num_tokens: int) -> bool:
        """:meth:`append` with shared or keyed blocks: block by block, as their holders and keys say."""
        freed, needed, copies = self.group_layout.append_plan(
            self._tables[seq_id], self._num_tokens[seq_id], num_tokens, self._shared_refs
        )
        if needed > self.pool.num_available() + freed:
            return False
        self._forget(seq_id)
        n = self._num_tokens[seq_id] + num_tokens
        end = -(-n // self._block_size_tokens)
        tables = self._tables[seq_id]
        starts, num_slid = self.group_layout.slide(tables, n, self.pool.release_for)  # (before any takes)
        self.num_window_slid_blocks += num_slid
        for g, (first, blocks) in enumerate(tables):
            if g in copies:
                (copy_id,) = self.pool.take_for(g, 1)
                self._pending_copies.append(KVCopy(blocks[-1], copy_id, 1, self.page_bytes))
                self.num_cow_copies += 1
                self.pool.release_for(blocks[-1], g)
                blocks[-1] = copy_id
            blocks.extend(self.pool.take_for(g, max(end - max(starts[g], first), 0)))
        self._num_tokens[seq_id] = n
        self._count(seq_id)
        if self._pending_keys and seq_id in self._pending_keys:
            self._key_blocks(seq_id)
        return True

    def append_each(self, seq_ids: Sequence[int], num_tokens: int) -> int:
        """``append(seq_id, num_tokens)`` for each in turn, in one pass: a sequence that stays within
        its quiet length (no block taken, freed or copied) only grows its count and the two totals
        (summed here, added once: integers, the same in any order); any other goes through
        :meth:`append`. With prompt keys pending (the prefix cache filling up) one by one."""
        if self._pending_keys:
            return super().append_each(seq_ids, num_tokens)
        # nothing shared or keyed now stays so (appends share nothing; with no key pending they key nothing)
        private = not (self._shared_refs or self._block_key)
        size = self._block_size_tokens
        counts, quiet_until, finals = self._num_tokens, self._quiet_until, self._final_kv_tokens
        future_delta = 0  # per group, over the quiet sequences
        num_quiet = done = 0
        for seq_id in seq_ids:
            n = counts[seq_id]
            new_n = n + num_tokens
            if new_n <= quiet_until[seq_id]:
                # _grow_terms: every group's last block keeps -n % B free slots (the sequence's
                # future up to its final length); num_tokens of them fill now
                tail = -n % size
                remaining = finals[seq_id] - n
                future = tail if tail < remaining else (remaining if remaining > 0 else 0)
                tail -= num_tokens
                remaining -= num_tokens
                future_delta += (tail if tail < remaining else (remaining if remaining > 0 else 0)) - future
                counts[seq_id] = new_n
                num_quiet += 1
            elif not (self._append_private(seq_id, n, new_n) if private else self.append(seq_id, num_tokens)):
                break
            done += 1
        num_groups = self._num_groups
        self._num_tail_slots -= num_groups * num_tokens * num_quiet
        self._num_future_slots += num_groups * future_delta
        return done
