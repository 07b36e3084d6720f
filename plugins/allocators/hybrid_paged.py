"""Paged KV cache with hybrid groups (vLLM's hybrid KV cache manager): one block pool, one block
table per sequence per KV-cache group, blocks freed as they slide out of a window.

A model with sliding-window layers (:mod:`kvbench.specs.kv_groups`) has several KV-cache groups of
equally many layers, so one block of any group has the same bytes (``block_size_tokens`` tokens x
the group's layers x bytes per layer and token): every group draws from one shared pool. Per
sequence and group:

- a full group holds the ``ceil(n / B)`` blocks of all ``n`` tokens, as :mod:`paged` does;
- a window group of W tokens holds only the blocks overlapping the last W tokens
  ``[n - W, n)`` (what the next token's query reads), logical blocks ``(n - W) // B`` to
  ``(n - 1) // B``. A block whose tokens have all left the window is freed by the ``append`` that
  moves the window past it, before new blocks are taken (vLLM removes skipped blocks before
  allocating). Appending k tokens at once ends where k single appends end: a run of decode steps
  advanced in one call is exact. A prefill chunk is thereby held from its last token's window on;
  vLLM keeps a chunk's earlier blocks until the next step (one chunk's blocks at most per sequence).
- ``truncate`` (growth taken back from a preempted request) cannot bring back blocks that already
  left the window: the window then starts later than ``n - W`` until the sequence grows past it.

Accounting: a slot is one token of one group's block; ``slot_bytes`` is that group's bytes per
token (equal for all groups), and ``kv_bytes_per_token`` stays the whole model's (every group's
layers). The ledger counts the pool's blocks: token bytes are the filled slots of held blocks (a
window group's first block may keep up to B - 1 tokens that already left the window until all of
it has), reserved future the unfilled tail of each sequence's own last block per group, up to its
final length. ``group_bytes()`` says how the held bytes split between groups.

Fork shares every group's blocks by reference count; the first append into a shared, partly
filled last block copies it (copy-on-write), per group. Swap moves every distinct block once.

Prefix caching (``prefix_caching=true``): every group's full prompt blocks get keys (the group's
index and the block's prefix key), and a hit of ``p`` tokens needs, in every group, what that group
would hold at ``p``: a full group the blocks of ``[0, p)``, a window group those of
``[p - W, p)`` (vLLM's rule: a prefix is cached only if each group can serve it). Blocks nobody
holds keep their key on an LRU queue until evicted, as in :mod:`paged`.

Speed (``append`` and ``project_decode`` are the simulator's hot paths, as in :mod:`paged`):

- reference counts are kept only for blocks two or more sequences hold, so a sequence nobody
  shares with takes and gives back its blocks as list slices;
- the ledger's token and reserved-future slots are running totals of per-sequence terms (the
  unfilled tail of each group's last block, and the part of it the sequence will still fill), so
  ``ledger()`` is O(1) while no block is shared (with shared blocks it counts a shared tail once,
  by going over the tables);
- each sequence knows the length up to which its appends take and free no block (its last block
  is not full and no window reaches its first held block): ``append_each`` grows such sequences
  by a counter and two totals;
- ``project_decode`` is closed-form, as :mod:`paged`'s: a sequence takes a block in every group
  every B steps from a step its length fixes, and each window group frees one every B steps from
  the step its window first passes its first held block, so the blocks taken and freed per step
  follow from two small tables, and the ledger after every step from their running sums. Only a
  step where the blocks free before it do not cover every block it takes is checked sequence by
  sequence (its own frees, in order, may cover them). With shared or keyed blocks it steps
  through the run in plain integers instead.
"""

from __future__ import annotations

import copy
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
from kvbench_plugins.allocators.paged import SHORT_PROJECTION_STEPS, PagedConfig

from kvbench import hookimpl
from kvbench.core.ledger import LEDGER_FIELDS, MemoryLedger
from kvbench.core.prefix import block_keys
from kvbench.errors import ConfigError
from kvbench.memory.allocator import (
    NO_PROJECTION,
    Allocator,
    AllocatorCapabilities,
    DecodeProjection,
    Footprint,
    KVCopy,
    Refusal,
    SeqShape,
    Transfer,
)
from kvbench.specs.kv_groups import FULL, WINDOW, KVGroup

#: the paged allocator's options this one implements
SUPPORTED_OPTIONS = ("block_size_tokens", "prefix_caching")
#: a sequence's table in one group: (logical index of its first held block, the held block ids)
GroupTable = tuple[int, list[int]]
#: a sequence's window groups by when they next free a block: (the length at which the window
#: leaves the group's first held block, then one block every B tokens more; how many groups)
Slides = tuple[tuple[int, int], ...]


@dataclass
class _DecodePhases:
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


class HybridPagedAllocator(Allocator):
    """A shared block pool, per-group block tables, reference counts, windows that free blocks."""

    name = "hybrid_paged"
    Config = PagedConfig
    capabilities = AllocatorCapabilities(shares_blocks=True, can_swap=True, projects_decode=True)

    def __init__(
        self,
        config: PagedConfig | None = None,
        *,
        budget_bytes: int,
        kv_bytes_per_token: int,
        kv_groups: Sequence[KVGroup] = (),
    ) -> None:
        super().__init__(config or PagedConfig(), budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token)
        groups = tuple(kv_groups) or (KVGroup(FULL, 1),)
        if any(g.kind not in (FULL, WINDOW) for g in groups):
            raise ConfigError("allocator=paged holds full and sliding-window groups only, not a state group")
        if len({g.num_layers for g in groups}) != 1:
            raise ConfigError("allocator=paged needs KV groups of equally many layers (equal block bytes)")
        num_layers = sum(g.num_layers for g in groups)
        if self.kv_bytes_per_token * groups[0].num_layers % num_layers:
            raise ValueError("kv_bytes_per_token is not a whole number of bytes per group")
        self.kv_groups = groups
        self._windows = tuple(g.window_tokens for g in groups)  # 0: full attention
        self._num_groups = len(groups)
        self._block_size_tokens = self.config.block_size_tokens
        #: one group's bytes per token: a slot of any block
        self.slot_bytes = self.kv_bytes_per_token * groups[0].num_layers // num_layers
        #: one block of any group
        self.page_bytes = self._block_size_tokens * self.slot_bytes
        self.num_blocks = self.budget_bytes // self.page_bytes if self.page_bytes else 0
        self._remainder_bytes = self.budget_bytes - self.num_blocks * self.page_bytes
        self._free_block_ids: list[int] = []  # given back, taken last in first out
        self._num_fresh = self.num_blocks  # never used: handed out 0, 1, 2, ...
        # NOTE: as in paged, holders are counted only for blocks two or more sequences hold: a held
        # block not in here has one, so a sequence nobody shares with moves its blocks as slices
        self._shared_refs: dict[int, int] = {}
        self._num_extra_refs = 0  # holders beyond the first, summed over the shared blocks
        #: the ledger's per-group parts: (column name, the groups it sums), full then window groups
        self._group_columns = tuple(
            (f"{kind}_group_bytes", tuple(g for g, group in enumerate(groups) if group.kind == kind))
            for kind in (FULL, WINDOW)
            if any(group.kind == kind for group in groups)
        )
        #: per group, its part of the ledger; per part, the blocks its groups hold (a shared block once)
        self._column_of = tuple(
            next(c for c, (_, members) in enumerate(self._group_columns) if g in members) for g in range(len(groups))
        )
        self._held_per_column = [0] * len(self._group_columns)
        self._is_window = tuple(bool(w) for w in self._windows)
        #: (window tokens, how many window groups have it), for the block counts of a whole sequence
        self._groups_per_window = tuple(Counter(filter(None, self._windows)).items())
        self._window_groups = tuple(g for g, w in enumerate(self._windows) if w)
        self._num_window_groups = len(self._window_groups)
        #: the window of every window group when they share one (Gemma-3, Mistral): their blocks
        #: then move in step (:meth:`_append_in_step`); 0 otherwise
        self._window_tokens = self._groups_per_window[0][0] if len(self._groups_per_window) == 1 else 0
        self._tables: dict[int, list[GroupTable]] = {}
        self._num_tokens: dict[int, int] = {}
        self._final_kv_tokens: dict[int, int] = {}
        # The ledger's running totals, summed over sequences as if nothing were shared: per group
        # holding blocks, the last block's unfilled slots, and those the sequence will still fill
        self._num_tail_slots = 0
        self._num_future_slots = 0
        #: seq -> (its groups holding blocks, its window groups' next frees)
        self._layout: dict[int, tuple[int, Slides]] = {}
        #: seq -> the length up to which its appends take, free and copy no block
        self._quiet_until: dict[int, int] = {}
        self._swapped: dict[tuple[int, ...], tuple[list, dict[int, tuple]]] = {}
        self.num_cow_copies = 0
        #: blocks a window moved past, per sequence and group (freed, or never taken when a run of
        #: steps appended at once passed them): the same in both loops, whatever the run lengths
        self.num_window_slid_blocks = 0
        # the paged allocator's other options (generated-block keys, a host tier) are not built here
        for option in fields(PagedConfig):
            if option.name not in SUPPORTED_OPTIONS and getattr(self.config, option.name) != option.default:
                raise ConfigError(
                    f"allocator.{option.name}={getattr(self.config, option.name)!r} is not supported for a model "
                    f"with sliding-window layers (hybrid KV groups); leave it at {option.default!r}"
                )
        self._caching = bool(self.config.prefix_caching)
        self.capabilities = replace(
            type(self).capabilities,
            caches_prefixes=self._caching,
            # a window group frees the blocks its window moves past, decoding too
            frees_during_decode=any(self._windows),
        )
        self._cached_block_id: dict[tuple, int] = {}  # (group, prefix key) -> its one block
        self._block_key: dict[int, tuple] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._prompt_keys: dict[int, list] = {}  # seq -> its prompt's full-block prefix keys
        # seq -> its first prompt block not yet keyed, only while some are left (append then costs
        # a decoding sequence one failed lookup)
        self._pending_keys: dict[int, int] = {}
        self.num_evicted_blocks = 0

    # --- block arithmetic --------------------------------------------------------------------------

    @property
    def block_size_tokens(self) -> int:
        return self._block_size_tokens

    def _first_needed(self, window: int, num_tokens: int) -> int:
        """The first logical block a group needs at ``num_tokens`` tokens (0 for a full group)."""
        return (num_tokens - window) // self._block_size_tokens if window and num_tokens > window else 0

    def _blocks_held(self, num_tokens: int) -> int:
        """Blocks over every group of a sequence of ``num_tokens`` grown one append at a time."""
        size = self._block_size_tokens
        blocks = self._num_groups * -(-num_tokens // size)
        for window, num_groups in self._groups_per_window:  # less what each window has left
            if num_tokens > window:
                blocks -= num_groups * ((num_tokens - window) // size)
        return blocks

    def _most_blocks(self, final_tokens: int) -> int:
        """The most blocks a sequence holds at once on its way to ``final_tokens``: full groups grow
        with it, a window group grows up to its window and then repeats with period B, so the most
        is within the last B + 1 lengths."""
        return max(
            self._blocks_held(n) for n in range(max(1, final_tokens - self._block_size_tokens), final_tokens + 1)
        )

    def max_sequence_tokens(self, shape: SeqShape) -> int:
        """The longest sequence whose blocks, over every group, fit the whole pool; a model whose
        every layer is windowed holds any length once its windows fit (the shape's S_max then)."""
        if self._most_blocks(1) > self.num_blocks:
            return 0
        if all(self._windows):
            limit = max(shape.s_max_tokens, shape.final_kv_tokens)
            return limit if self._most_blocks(limit) <= self.num_blocks else 0
        low, high = 1, self.num_blocks * self._block_size_tokens
        while low < high:  # the most blocks held grows with the length once a full group is there
            mid = (low + high + 1) // 2
            if self._most_blocks(mid) <= self.num_blocks:
                low = mid
            else:
                high = mid - 1
        return low

    def fits_in_empty(self, shape: SeqShape) -> bool:
        """Every branch at its final length holds its own blocks; the prompt's full blocks of the
        full groups are shared (window groups counted per branch: a bound)."""
        shared = 0
        if shape.num_branches > 1:
            shared = sum(1 for w in self._windows if not w) * (shape.num_tokens // self._block_size_tokens)
        own = self._most_blocks(max(shape.final_kv_tokens, 1)) - shared
        return shared + shape.num_branches * own <= self.num_blocks

    def reservation_tokens(self, shape: SeqShape) -> int:
        """Whole-model token slots worth of the new blocks the allocation takes (what a refusal reports)."""
        new_blocks = self._new_blocks_for(shape, self._hits(shape) if self._caching else None)
        return -(-new_blocks * self.page_bytes // self.kv_bytes_per_token) if self.kv_bytes_per_token else 0

    # --- views -----------------------------------------------------------------------------------

    def num_tokens(self, seq_id: int) -> int:
        return self._num_tokens[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        """Every group's held blocks, group by group (each group's table is :meth:`group_block_tables`)."""
        return [block_id for _, blocks in self._tables[seq_id] for block_id in blocks]

    def group_block_tables(self, seq_id: int) -> list[GroupTable]:
        """Per group: the logical index of the first held block and the held block ids in order."""
        return [(first, list(blocks)) for first, blocks in self._tables[seq_id]]

    def refcount(self, block_id: int) -> int:
        """How many live sequences hold ``block_id``: a view for checks (a block with one holder is
        found by elimination, as in paged)."""
        holders = self._shared_refs.get(block_id)
        if holders:
            return holders
        never_used = block_id >= self.num_blocks - self._num_fresh
        return 0 if never_used or block_id in self._evictable or block_id in self._free_block_ids else 1

    def num_shared_blocks(self) -> int:
        return len(self._shared_refs)

    def shared_bytes_saved(self) -> int:
        """O(1): a running count of the holders beyond the first of every shared block."""
        return self._num_extra_refs * self.page_bytes

    def num_cached_tokens(self, shape: SeqShape) -> int:
        return len(self._hits(shape)[0]) * self._block_size_tokens if self._caching else 0

    def cached_block_ids(self) -> list[int]:
        return list(self._evictable)

    def block_key(self, block_id: int):
        return self._block_key.get(block_id)

    def group_bytes(self) -> list[int]:
        """Bytes of the blocks each group holds now (a block shared by several sequences once)."""
        held: list[set[int]] = [set() for _ in self.kv_groups]
        for tables in self._tables.values():
            for blocks_of_group, (_, blocks) in zip(held, tables):
                blocks_of_group.update(blocks)
        return [len(blocks) * self.page_bytes for blocks in held]

    def _ledger_groups(self, held_per_column: Sequence[int]) -> tuple[tuple[str, int], ...]:
        """The ledger's per-group parts for these held-block counts: the bytes held by the full
        groups and by the window groups (together, the ledger's allocated bytes)."""
        page = self.page_bytes
        return tuple((name, held * page) for (name, _), held in zip(self._group_columns, held_per_column))

    def ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        """O(1) from running totals while no block is shared; otherwise a shared partly filled last
        block counts its unfilled slots once, and as nobody's future."""
        num_held = sum(self._held_per_column)
        if self._shared_refs:
            token_slots, future_slots = self._shared_slots(num_held)
        else:
            token_slots = num_held * self._block_size_tokens - self._num_tail_slots
            future_slots = self._num_future_slots
        return MemoryLedger.from_slots(
            budget_bytes=self.budget_bytes,
            kv_bytes_per_token=self.slot_bytes,
            allocated_slots=num_held * self._block_size_tokens,
            token_slots=token_slots,
            future_slots=future_slots,
            external_bytes=self._remainder_bytes,
            free_bytes=(len(self._free_block_ids) + self._num_fresh) * self.page_bytes,
            cached_bytes=len(self._evictable) * self.page_bytes,
            group_bytes=self._ledger_groups(self._held_per_column),
        )

    def _shared_slots(self, num_held: int) -> tuple[int, int]:
        """(token slots, reserved future slots) over every table, each partly filled last block
        once (the shared tail of a fork is the same block in several tables)."""
        size = self._block_size_tokens
        shared = self._shared_refs
        future_slots = 0
        partial: dict[int, int] = {}  # partly filled last blocks -> unfilled slots (once if shared)
        for seq_id, tables in self._tables.items():
            n = self._num_tokens[seq_id]
            tail = -n % size
            if not tail:
                continue
            remaining = self._final_kv_tokens[seq_id] - n
            for _, blocks in tables:
                if not blocks:
                    continue
                last = blocks[-1]
                partial[last] = tail
                if remaining > 0 and last not in shared:
                    future_slots += tail if tail < remaining else remaining
        return num_held * size - sum(partial.values()), future_slots

    def unallocated_bytes(self) -> int:
        """O(1): the free, cached and remainder bytes."""
        return self._num_available() * self.page_bytes + self._remainder_bytes

    def largest_hole_bytes(self) -> int:
        return self._num_available() * self.page_bytes

    def footprint(self, seq_ids: Sequence[int]) -> Footprint:
        holders = Counter(b for s in seq_ids for b in self.block_table(s))
        shared = self._shared_refs
        num_held = sum(1 for b, n in holders.items() if shared.get(b, 1) == n)
        num_blocks = len(holders)
        return Footprint(num_held * self.page_bytes, Transfer(num_blocks * self.page_bytes, num_blocks))

    # --- the pool ----------------------------------------------------------------------------------

    def _num_available(self) -> int:
        return len(self._free_block_ids) + self._num_fresh + len(self._evictable)

    def _can_take(self, num_blocks: int, keep_free_bytes: int = 0) -> bool:
        left = self._num_available() - num_blocks
        return left >= 0 and left * self.page_bytes >= keep_free_bytes

    def _take(self, num_blocks: int, group: int) -> list[int]:
        """Blocks for ``group``, from the pool (:meth:`_pop_blocks`)."""
        self._held_per_column[self._column_of[group]] += num_blocks
        return self._pop_blocks(num_blocks)

    def _pop_blocks(self, num_blocks: int) -> list[int]:
        """Blocks out of the pool: given back first (last in first out, as one-by-one pops give
        them), then never-used ones, then evicted cached ones."""
        free = self._free_block_ids
        if num_blocks <= len(free):
            if not num_blocks:
                return []
            taken = free[-num_blocks:]
            del free[-num_blocks:]
            taken.reverse()
        else:
            taken = free[::-1]
            free.clear()
            num_new = min(num_blocks - len(taken), self._num_fresh)
            first_fresh = self.num_blocks - self._num_fresh
            taken.extend(range(first_fresh, first_fresh + num_new))
            self._num_fresh -= num_new
            for _ in range(num_blocks - len(taken)):
                block_id, _ = self._evictable.popitem(last=False)  # the least recently used
                del self._cached_block_id[self._block_key.pop(block_id)]
                self.num_evicted_blocks += 1
                taken.append(block_id)
        return taken

    def _release(self, block_id: int, group: int) -> None:
        """One holder fewer; a block nobody holds goes to the LRU queue (keyed) or the free pool."""
        shared = self._shared_refs
        holders = shared.get(block_id)
        if holders:
            if holders == 2:
                del shared[block_id]
            else:
                shared[block_id] = holders - 1
            self._num_extra_refs -= 1
            return
        self._held_per_column[self._column_of[group]] -= 1
        if block_id in self._block_key:
            self._evictable[block_id] = None
        else:
            self._free_block_ids.append(block_id)

    def _release_all(self, block_ids: list[int], group: int) -> None:
        """:meth:`_release` of each in the order given; with nothing shared or keyed, as one slice."""
        if self._shared_refs or self._block_key:
            for block_id in block_ids:
                self._release(block_id, group)
        else:
            self._free_block_ids.extend(block_ids)
            self._held_per_column[self._column_of[group]] -= len(block_ids)

    def _reference(self, block_id: int, group: int) -> None:
        """One more holder for a hit block: an evictable one is held again, by ``group``."""
        if block_id in self._evictable:
            del self._evictable[block_id]
            self._held_per_column[self._column_of[group]] += 1
        else:
            self._shared_refs[block_id] = self._shared_refs.get(block_id, 1) + 1
            self._num_extra_refs += 1

    # --- the ledger's per-sequence terms -------------------------------------------------------------

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

    def _hits(self, shape: SeqShape) -> tuple[list[int], list[list[int]]]:
        """The longest hit (in blocks) every group can serve, as (its logical blocks, each group's
        hit blocks from the group's first needed block at the allocation's length)."""
        if not self._caching:
            return [], [[] for _ in self._windows]
        prompt = shape.num_tokens if shape.prompt_tokens is None else shape.prompt_tokens
        keys = block_keys(prompt, shape.prefix_hashes, shape.hash_block_tokens, self._block_size_tokens)
        max_blocks = min(len(keys), min(prompt, shape.num_tokens - 1) // self._block_size_tokens)
        cached = self._cached_block_id
        # per group, the cached run ending at each logical block
        runs = []
        limit = max_blocks
        for g, window in enumerate(self._windows):
            run, out = 0, []
            for index in range(max_blocks):
                run = run + 1 if (g, keys[index]) in cached else 0
                out.append(run)
                if not window and not run:
                    limit = min(limit, index)
                    break
            runs.append(out)
        size = self._block_size_tokens
        num_hit = 0
        for h in range(limit, 0, -1):  # the longest hit every window group can serve too
            ok = True
            for g, window in enumerate(self._windows):
                if window:
                    needed = h - self._first_needed(window, h * size)
                    if runs[g][h - 1] < needed:
                        ok = False
                        break
            if ok:
                num_hit = h
                break
        per_group = []
        for g, window in enumerate(self._windows):
            first = self._first_needed(window, shape.num_tokens)
            per_group.append([cached[(g, keys[i])] for i in range(first, num_hit)])
        return keys[:num_hit], per_group

    def _new_blocks_for(self, shape: SeqShape, hits) -> int:
        """New blocks (and evictable hits taken back) an allocation of ``shape`` takes."""
        end = -(-shape.num_tokens // self._block_size_tokens)
        need = sum(end - self._first_needed(w, shape.num_tokens) for w in self._windows)
        if hits is None:
            return need
        _, per_group = hits
        held = sum(len(b) for b in per_group)
        revived = sum(1 for b in per_group for block_id in b if block_id in self._evictable)
        return need - held + revived

    def _key_blocks(self, seq_id: int) -> None:
        """Give the sequence's newly full prompt blocks their keys in every group that holds them
        (a key held elsewhere stays there; a block already out of a window gets none)."""
        keys = self._prompt_keys[seq_id]
        start = self._pending_keys[seq_id]
        full_blocks = min(len(keys), self._num_tokens[seq_id] // self._block_size_tokens)
        for g, (first, blocks) in enumerate(self._tables[seq_id]):
            for index in range(max(start, first), min(full_blocks, first + len(blocks))):
                key, block_id = (g, keys[index]), blocks[index - first]
                if key not in self._cached_block_id and block_id not in self._block_key:
                    self._cached_block_id[key] = block_id
                    self._block_key[block_id] = key
        if full_blocks == len(keys):
            del self._pending_keys[seq_id]
        elif full_blocks > start:
            self._pending_keys[seq_id] = full_blocks

    # --- verbs -----------------------------------------------------------------------------------

    def can_allocate(self, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        return self._can_take(
            self._new_blocks_for(shape, self._hits(shape) if self._caching else None), keep_free_bytes
        )

    def refusal_reason(self, shape: SeqShape, keep_free_bytes: int = 0) -> Refusal:
        need = self._new_blocks_for(shape, self._hits(shape) if self._caching else None)
        return Refusal.NO_MEMORY if need > self._num_available() else Refusal.WATERMARK

    def can_readmit_branches(self, prompt_tokens: int, branch_tokens: Sequence[int], keep_free_bytes: int = 0) -> bool:
        shared = sum(1 for w in self._windows if not w) * (prompt_tokens // self._block_size_tokens)
        blocks = shared + sum(self._blocks_held(t) - shared + len(self._windows) for t in branch_tokens)
        return self.unallocated_bytes() - keep_free_bytes >= blocks * self.page_bytes

    def allocate(self, seq_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> int | None:
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        hits = self._hits(shape) if self._caching else None
        if not self._can_take(self._new_blocks_for(shape, hits), keep_free_bytes):
            return None
        n = shape.num_tokens
        end = -(-n // self._block_size_tokens)
        tables = []
        if hits is not None:
            for g, per_group in enumerate(hits[1]):
                for block_id in per_group:  # before taking new blocks: an eviction must not take a hit
                    self._reference(block_id, g)
        for g, window in enumerate(self._windows):
            first = self._first_needed(window, n)
            hit_blocks = hits[1][g] if hits is not None else []
            tables.append((first, hit_blocks + self._take(end - first - len(hit_blocks), g)))
        self._tables[seq_id] = tables
        self._num_tokens[seq_id] = n
        self._final_kv_tokens[seq_id] = shape.final_kv_tokens
        self._count(seq_id)
        if hits is None:
            return 0
        prompt = n if shape.prompt_tokens is None else shape.prompt_tokens
        keys = block_keys(prompt, shape.prefix_hashes, shape.hash_block_tokens, self._block_size_tokens)
        if len(keys) > len(hits[0]):
            self._prompt_keys[seq_id] = keys
            self._pending_keys[seq_id] = len(hits[0])
            self._key_blocks(seq_id)
        return len(hits[0]) * self._block_size_tokens

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
        if num_needed > self._num_available() + num_windows * num_released:
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
            taken = self._pop_blocks(num_needed)  # in pool order: group by group, as one-by-one takes
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
        if num_needed > self._num_available() + num_freed:
            return False
        free, held, column_of = self._free_block_ids, self._held_per_column, self._column_of
        for g, new_first, num_released in moves:  # every group releases before any takes
            first, blocks = tables[g]
            if num_released:
                free.extend(blocks[:num_released])
                del blocks[:num_released]
                held[column_of[g]] -= num_released
            self.num_window_slid_blocks += new_first - first
            tables[g] = (new_first, blocks)
        taken = self._pop_blocks(num_needed)  # in pool order: group by group, as one-by-one takes
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

    def _append_plan(self, seq_id: int, num_tokens: int) -> tuple[int, int, list[int]]:
        """What appending does to each group: (blocks released that nobody else holds, blocks
        needed, the groups whose shared partly filled last block must be copied first)."""
        n = self._num_tokens[seq_id]
        new_n = n + num_tokens
        size = self._block_size_tokens
        end = -(-new_n // size)
        shared = self._shared_refs
        freed, needed, copies = 0, 0, []
        for g, (first, blocks) in enumerate(self._tables[seq_id]):
            new_first = max(first, self._first_needed(self._windows[g], new_n))
            held_end = first + len(blocks)
            for index in range(first, min(new_first, held_end)):
                if blocks[index - first] not in shared:
                    freed += 1
            keep_from = max(new_first, first)
            if n % size and held_end - 1 >= keep_from and blocks[-1] in shared:
                copies.append(g)
                needed += 1
            needed += end - max(held_end, new_first)
        return freed, needed, copies

    def _append_shared(self, seq_id: int, num_tokens: int) -> bool:
        """:meth:`append` with shared or keyed blocks: block by block, as their holders and keys say."""
        freed, needed, copies = self._append_plan(seq_id, num_tokens)
        if needed > self._num_available() + freed:
            return False
        self._forget(seq_id)
        n = self._num_tokens[seq_id] + num_tokens
        end = -(-n // self._block_size_tokens)
        tables = self._tables[seq_id]
        starts = []
        for g, (first, blocks) in enumerate(tables):  # every group releases before any takes
            new_first = max(first, self._first_needed(self._windows[g], n))
            drop = min(new_first - first, len(blocks))
            for block_id in blocks[:drop]:
                self._release(block_id, g)
            del blocks[:drop]
            self.num_window_slid_blocks += new_first - first
            starts.append(first + drop + len(blocks) if blocks else new_first)
            tables[g] = (new_first, blocks)
        for g, (first, blocks) in enumerate(tables):
            if g in copies:
                (copy_id,) = self._take(1, g)
                self._pending_copies.append(KVCopy(blocks[-1], copy_id, 1, self.page_bytes))
                self.num_cow_copies += 1
                self._release(blocks[-1], g)
                blocks[-1] = copy_id
            blocks.extend(self._take(max(end - max(starts[g], first), 0), g))
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

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        n = self._num_tokens[seq_id]
        if num_tokens == n:
            return
        size = self._block_size_tokens
        end = -(-num_tokens // size)
        tables = self._tables[seq_id]
        cut_partial = bool(num_tokens % size)
        shared = self._shared_refs
        for first, blocks in tables:
            keep = max(end - first, 0)
            dropped = blocks[keep:] + (blocks[keep - 1 : keep] if cut_partial and keep else [])
            if not 0 <= num_tokens < n or any(b in shared for b in dropped):
                raise ValueError(f"cannot truncate sequence {seq_id} from {n} to {num_tokens} tokens")
        self._forget(seq_id)
        for g, (first, blocks) in enumerate(tables):
            keep = max(end - first, 0)
            if cut_partial and keep:
                self._drop_key(blocks[keep - 1])
            for block_id in reversed(blocks[keep:]):
                self._drop_key(block_id)
                self._release(block_id, g)
            del blocks[keep:]
            # a window group whose every block left keeps its place (it starts at the next block)
            tables[g] = (first if blocks else min(first, end), blocks)
        self._num_tokens[seq_id] = num_tokens
        self._count(seq_id)
        keys = self._prompt_keys.get(seq_id)
        if keys is not None:  # blocks refilled later are keyed again
            first_unkeyed = min(self._pending_keys.get(seq_id, len(keys)), num_tokens // size)
            if first_unkeyed < len(keys):
                self._pending_keys[seq_id] = first_unkeyed

    def _drop_key(self, block_id: int) -> None:
        key = self._block_key.pop(block_id, None)
        if key is not None:
            del self._cached_block_id[key]

    def fork(self, parent_id: int, child_id: int, child_final_kv_tokens: int | None = None) -> None:
        if child_id in self._tables:
            self.free(child_id)
        tables = self._tables[parent_id]
        shared = self._shared_refs
        for _, blocks in tables:
            for block_id in blocks:
                shared[block_id] = shared.get(block_id, 1) + 1
            self._num_extra_refs += len(blocks)
        self._tables[child_id] = [(first, list(blocks)) for first, blocks in tables]
        self._num_tokens[child_id] = self._num_tokens[parent_id]
        self._final_kv_tokens[child_id] = (
            self._final_kv_tokens[parent_id] if child_final_kv_tokens is None else child_final_kv_tokens
        )
        self._count(child_id)
        self._forget(parent_id)  # its tail is shared now: its next append copies it
        self._count(parent_id)

    def free(self, seq_id: int) -> None:
        tables = self._tables[seq_id]  # (a KeyError for an unknown sequence, before anything changes)
        self._forget(seq_id)
        del self._tables[seq_id], self._num_tokens[seq_id], self._final_kv_tokens[seq_id]
        del self._layout[seq_id], self._quiet_until[seq_id]
        self._prompt_keys.pop(seq_id, None)
        self._pending_keys.pop(seq_id, None)
        for g, (_, blocks) in enumerate(tables):
            self._release_all(blocks[::-1], g)  # a prefix's tail is evicted before its head

    def swap_out(self, seq_ids: Sequence[int]) -> Transfer:
        family = tuple(seq_ids)
        if self._shared_refs:  # a block held outside the set stays: only a prefix-cache hit may be
            holders = Counter(b for s in family for _, blocks in self._tables[s] for b in blocks)
            shared, keyed = self._shared_refs, self._block_key
            if any(shared.get(b, 1) > n and b not in keyed for b, n in holders.items()):
                raise RuntimeError(f"swap_out of {family}: a block is shared with a sequence outside the set")
        positions: dict[int, int] = {}
        structure = []
        for seq_id in family:
            tables = [
                (first, [positions.setdefault(b, len(positions)) for b in blocks])
                for first, blocks in self._tables[seq_id]
            ]
            structure.append((seq_id, tables, self._num_tokens[seq_id], self._final_kv_tokens[seq_id]))
        keys = {p: self._block_key[b] for b, p in positions.items() if b in self._block_key}
        prompt_keys = {s: (self._prompt_keys[s], self._pending_keys.get(s)) for s in family if s in self._prompt_keys}
        for seq_id in family:
            self.free(seq_id)
        self._swapped[family] = (structure, (keys, prompt_keys))
        return Transfer(len(positions) * self.page_bytes, len(positions))

    def swap_in(self, seq_ids: Sequence[int], keep_free_bytes: int = 0) -> Transfer | None:
        family = tuple(seq_ids)
        structure, (keys, prompt_keys) = self._swapped[family]
        num_blocks = 1 + max((p for _, tables, _, _ in structure for _, b in tables for p in b), default=-1)
        if not self._can_take(num_blocks, keep_free_bytes):
            return None
        del self._swapped[family]
        group_of_position = {p: g for _, tables, _, _ in structure for g, (_, b) in enumerate(tables) for p in b}
        blocks = [self._take(1, group_of_position[p])[0] for p in range(num_blocks)]
        holders = Counter(p for _, tables, _, _ in structure for _, b in tables for p in b)
        for p, n in holders.items():
            if n > 1:
                self._shared_refs[blocks[p]] = n
                self._num_extra_refs += n - 1
        for seq_id, tables, num_tokens, final in structure:
            self._tables[seq_id] = [(first, [blocks[p] for p in b]) for first, b in tables]
            self._num_tokens[seq_id] = num_tokens
            self._final_kv_tokens[seq_id] = final
        for seq_id, _, _, _ in structure:  # once every table is back: which tails are shared is known
            self._count(seq_id)
        for p, key in keys.items():  # a key nobody took meanwhile serves hits again
            if key not in self._cached_block_id:
                self._cached_block_id[key] = blocks[p]
                self._block_key[blocks[p]] = key
        for seq_id, (keys_of_seq, pending) in prompt_keys.items():
            self._prompt_keys[seq_id] = keys_of_seq
            if pending is not None:
                self._pending_keys[seq_id] = pending
        return Transfer(num_blocks * self.page_bytes, num_blocks)

    # --- decode projection -----------------------------------------------------------------------

    def project_decode(
        self, seq_ids: Sequence[int], max_steps: int, next_shape: SeqShape | None = None
    ) -> DecodeProjection:
        """Exact: in closed form while no block is shared or keyed and every group of every
        sequence holds a block (the module docstring), otherwise step by step. Stops at the first
        step some append could not make (or, in closed form, at the first that would take a
        sequence past its final length); a partly filled shared last block (a copy on the next
        append) stops it at 0 steps."""
        if not seq_ids or max_steps <= 0:
            return NO_PROJECTION
        if self._pending_keys and any(seq_id in self._pending_keys for seq_id in seq_ids):
            return self._simulate_decode(seq_ids, max_steps, next_shape)
        if not (self._shared_refs or self._block_key):
            phases = self._decode_phases(seq_ids, max_steps)
            if phases is not None:
                if phases.max_steps <= 0:
                    return NO_PROJECTION
                led = self.ledger(next_shape)
                if phases.max_steps <= SHORT_PROJECTION_STEPS:  # plain arithmetic costs less than arrays
                    return self._project_short(phases, led)
                return self._project_long(phases, led)
        return self._project_stepwise(seq_ids, max_steps, next_shape)

    def _decode_phases(self, seq_ids: Sequence[int], max_steps: int) -> _DecodePhases | None:
        """The sequences' steps that take and free blocks, from their lengths and their windows'
        next frees; None when a window group of one holds no block (the step-by-step way then)."""
        size, num_groups = self._block_size_tokens, self._num_groups
        take_counts = [0] * size
        free_starts: dict[int, int] = {}
        final_waste: dict[int, int] = {}
        limit = max_steps
        tokens, finals, layout = self._num_tokens, self._final_kv_tokens, self._layout
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
        return _DecodePhases(seq_ids, take_counts, free_starts, final_waste, limit)

    def _step_fits(self, seq_ids: Sequence[int], step: int, num_available: int) -> bool:
        """Whether decode step ``step`` of the run goes through with ``num_available`` blocks before
        it: sequence by sequence in order, its windows' freed blocks first, then a block per group
        if its last one is full (what ``append`` does)."""
        size, num_groups = self._block_size_tokens, self._num_groups
        tokens, layout = self._num_tokens, self._layout
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

    def _span_columns(self, led: MemoryLedger, num_seqs: int, steps, taken, freed, wasted) -> dict:
        """The ledger after each step, from its state now and, per step, the running sums of
        sequences that took a block in every group (``taken``), window-group blocks freed
        (``freed``, full blocks: their tokens leave) and final blocks' never-filled slots per group
        (``wasted``). Integers (or int64 arrays) throughout: exact in any order."""
        size, slot, page, num_groups = self._block_size_tokens, self.slot_bytes, self.page_bytes, self._num_groups
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
        for (name, members), (_, held_bytes) in zip(self._group_columns, led.group_bytes):
            window = name == f"{WINDOW}_group_bytes"  # only window groups free blocks
            columns[name] = held_bytes + page * (len(members) * taken - (freed if window else 0))
        return columns

    def _project_short(self, phases: _DecodePhases, led: MemoryLedger) -> DecodeProjection:
        """:meth:`project_decode` in closed form over a few steps, in plain integers (the values
        :meth:`_span_columns` gives the long form, as lists), carried from step to step."""
        size, num_groups, max_steps = self._block_size_tokens, self._num_groups, phases.max_steps
        frees = [0] * (max_steps + 1)
        for start, num in phases.free_starts.items():
            for step in range(start, max_steps + 1, size):
                frees[step] += num
        take_counts, final_waste = phases.take_counts, phases.final_waste
        slot, page = self.slot_bytes, self.page_bytes
        num_available = self._num_available()
        # per step: every sequence's new token in every group; a block taken adds B slots to the
        # tails (future), a block freed takes B filled slots away; a final block's never-filled
        # slots turn from future to internal
        step_slots = num_groups * len(phases.seq_ids)
        token_bytes, future_bytes, internal_bytes = led.token_bytes, led.reserved_future_bytes, led.internal_bytes
        free_bytes = led.free_bytes
        columns = [(name, len(members), name == f"{WINDOW}_group_bytes") for name, members in self._group_columns]
        held = [value for _, value in led.group_bytes]
        token, future, internal, free = [], [], [], []
        held_columns: list[list[int]] = [[] for _ in columns]
        for step in range(1, max_steps + 1):
            num_taking = take_counts[(step - 1) % size]
            blocks_taken, blocks_freed = num_groups * num_taking, frees[step]
            if num_available < blocks_taken and not self._step_fits(phases.seq_ids, step, num_available):
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

    def _project_long(self, phases: _DecodePhases, led: MemoryLedger) -> DecodeProjection:
        """:meth:`project_decode` in closed form over many steps, as int64 arrays."""
        size, num_groups, max_steps = self._block_size_tokens, self._num_groups, phases.max_steps
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
        available_after = self._num_available() - num_groups * taken + freed
        available_before = np.concatenate(([self._num_available()], available_after[:-1]))
        num_steps = max_steps
        # a step whose takes the blocks free before it do not cover: its own frees may (in order)
        for index in np.flatnonzero(available_before < num_groups * num_taking).tolist():
            if not self._step_fits(phases.seq_ids, index + 1, int(available_before[index])):
                num_steps = index
                break
        if not num_steps:
            return NO_PROJECTION
        waste = np.zeros(max_steps + 2, dtype=np.int64)
        for step, slots in phases.final_waste.items():
            waste[min(step, max_steps + 1)] += slots
        wasted = np.cumsum(waste)[1 : max_steps + 1]
        cut = slice(0, num_steps)
        ledgers = self._span_columns(led, len(phases.seq_ids), steps[cut], taken[cut], freed[cut], wasted[cut])
        ledgers["cached_bytes"] = np.full(num_steps, led.cached_bytes, dtype=np.int64)
        ledgers["external_bytes"] = np.full(num_steps, led.external_bytes, dtype=np.int64)
        return DecodeProjection(num_steps, ledgers)

    def _project_stepwise(
        self, seq_ids: Sequence[int], max_steps: int, next_shape: SeqShape | None
    ) -> DecodeProjection:
        """:meth:`project_decode` with shared or keyed blocks (or a window group holding none),
        step by step in plain integers, on a copy of the few numbers an append changes: per step and
        sequence in order, the blocks its windows leave are released (one nobody else holds goes to
        the free pool, or to the LRU queue when keyed), then a block is taken per group whose last
        block is full. Stops at the first step some append could not make, or where a window would
        release a shared block (what sharing saves changes there); a partly filled shared last block
        (a copy on the next append) stops it at 0 steps."""
        size = self._block_size_tokens
        shared, keyed = self._shared_refs, self._block_key
        state = []  # per sequence: [tokens, final, [[window, first, held ids (None: taken in the span)]]]
        for seq_id in seq_ids:
            n = self._num_tokens[seq_id]
            groups = []
            for g, (first, blocks) in enumerate(self._tables[seq_id]):
                if n % size and blocks and shared.get(blocks[-1], 1) > 1:
                    return NO_PROJECTION
                groups.append([self._windows[g], first, list(blocks)])
            state.append([n, self._final_kv_tokens[seq_id], groups])
        led = self.ledger(next_shape)
        slot = self.slot_bytes or 1
        truly_free, cached = len(self._free_block_ids) + self._num_fresh, len(self._evictable)
        allocated = sum(self._held_per_column)
        token_slots, future_slots = led.token_bytes // slot, led.reserved_future_bytes // slot
        held_per_column, column_of = list(self._held_per_column), self._column_of
        columns: dict[str, list[int]] = {name: [] for name in ("token", "future", "internal", "free", "cached")}
        group_columns: dict[str, list[int]] = {name: [] for name, _ in self._group_columns}
        for _ in range(max_steps):
            # one step on copies: a step that cannot be taken whole leaves the state as it was
            free_, cached_, alloc_, token_, future_ = truly_free, cached, allocated, token_slots, future_slots
            held_ = list(held_per_column)
            new_state = []
            ok = True
            for n, final, groups in state:
                new_n = n + 1
                end = -(-new_n // size)
                new_groups = []
                num_new = 0
                shares_change = False
                for g, (window, first, blocks) in enumerate(groups):
                    new_first = max(first, self._first_needed(window, new_n))
                    drop = min(new_first - first, len(blocks))
                    for block_id in blocks[:drop]:
                        if block_id is not None and block_id in shared:
                            # a shared block loses a holder: what sharing saves changes, which a
                            # run of steps reports once (its first step's), so the run ends here
                            shares_change = True
                            continue
                        alloc_ -= 1
                        held_[column_of[g]] -= 1
                        token_ -= size  # a block that left a window is full
                        if block_id is not None and block_id in keyed:
                            cached_ += 1
                        else:
                            free_ += 1
                    kept = blocks[drop:]
                    start = new_first + len(kept)
                    if end > start:
                        num_new += end - start
                        held_[column_of[g]] += end - start
                        kept = kept + [None] * (end - start)
                    new_groups.append([window, new_first, kept])
                if shares_change or num_new > free_ + cached_:
                    ok = False
                    break
                from_free = num_new if num_new < free_ else free_
                free_ -= from_free
                cached_ -= num_new - from_free
                alloc_ += num_new
                # the new token in every group holding a block (a window group truncated past its
                # window holds none until the sequence reaches it again)
                filled_before = sum(1 for _, _, blocks in groups if blocks)
                filled_after = sum(1 for _, _, blocks in new_groups if blocks)
                token_ += filled_after
                # its own last block's unfilled slots up to its final length are its future
                before = min(-n % size, max(final - n, 0))
                after = min(-new_n % size, max(final - new_n, 0))
                future_ += after * filled_after - before * filled_before
                new_state.append([new_n, final, new_groups])
            if not ok:
                break
            state, held_per_column = new_state, held_
            truly_free, cached, allocated, token_slots, future_slots = free_, cached_, alloc_, token_, future_
            columns["token"].append(token_slots * slot)
            columns["future"].append(future_slots * slot)
            columns["internal"].append((allocated * size - token_slots - future_slots) * slot)
            columns["free"].append(truly_free * self.page_bytes)
            columns["cached"].append(cached * self.page_bytes)
            for name, value in self._ledger_groups(held_per_column):
                group_columns[name].append(value)
        num_steps = len(columns["token"])
        if not num_steps:
            return NO_PROJECTION
        return DecodeProjection(
            num_steps,
            {
                "token_bytes": columns["token"],
                "reserved_future_bytes": columns["future"],
                "internal_bytes": columns["internal"],
                "external_bytes": [led.external_bytes] * num_steps,
                "free_bytes": columns["free"],
                "cached_bytes": columns["cached"],
                **group_columns,
            },
        )

    def _simulate_decode(self, seq_ids: Sequence[int], max_steps: int, next_shape: SeqShape | None) -> DecodeProjection:
        """:meth:`project_decode` for sequences still keying prompt blocks (a full block may take a
        key an eviction in the span just freed): the steps taken on a copy of the allocator."""
        twin = copy.deepcopy(self)
        columns: dict[str, list[int]] = {name: [] for name in LEDGER_FIELDS}
        columns.update((name, []) for name, _ in self._group_columns)
        for _ in range(max_steps):
            if not all(twin.append(seq_id, 1) for seq_id in seq_ids) or twin.drain_copies():
                break
            led = twin.ledger(next_shape)
            for name in LEDGER_FIELDS:
                columns[name].append(getattr(led, name))
            for name, value in led.group_bytes:
                columns[name].append(value)
        num_steps = len(columns["token_bytes"])
        return DecodeProjection(num_steps, columns) if num_steps else NO_PROJECTION


@hookimpl
def kvbench_register_allocators() -> list[type]:
    return [HybridPagedAllocator]
