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
"""

from __future__ import annotations

import copy
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import fields, replace

from kvbench_plugins.allocators.paged import PagedConfig

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
        self._block_size_tokens = self.config.block_size_tokens
        #: one group's bytes per token: a slot of any block
        self.slot_bytes = self.kv_bytes_per_token * groups[0].num_layers // num_layers
        #: one block of any group
        self.page_bytes = self._block_size_tokens * self.slot_bytes
        self.num_blocks = self.budget_bytes // self.page_bytes if self.page_bytes else 0
        self._remainder_bytes = self.budget_bytes - self.num_blocks * self.page_bytes
        self._free_block_ids: list[int] = []  # given back, taken last in first out
        self._num_fresh = self.num_blocks  # never used: handed out 0, 1, 2, ...
        self._refs: dict[int, int] = {}  # every held block -> its holders
        #: every block a group took -> that group (kept while the block is cached, for a revival)
        self._group_of: dict[int, int] = {}
        #: per group, the blocks it holds (the keys of _refs, split by group): the ledger's group bytes
        self._held_per_group = [0] * len(groups)
        #: the ledger's per-group parts: (column name, the groups it sums), full then window groups
        self._group_columns = tuple(
            (f"{kind}_group_bytes", tuple(g for g, group in enumerate(groups) if group.kind == kind))
            for kind in (FULL, WINDOW)
            if any(group.kind == kind for group in groups)
        )
        self._tables: dict[int, list[GroupTable]] = {}
        self._num_tokens: dict[int, int] = {}
        self._final_kv_tokens: dict[int, int] = {}
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
        end = -(-num_tokens // self._block_size_tokens)
        return sum(end - self._first_needed(w, num_tokens) for w in self._windows)

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
        return self._refs.get(block_id, 0)

    def num_shared_blocks(self) -> int:
        return sum(1 for n in self._refs.values() if n > 1)

    def shared_bytes_saved(self) -> int:
        return sum(n - 1 for n in self._refs.values()) * self.page_bytes

    def num_cached_tokens(self, shape: SeqShape) -> int:
        return len(self._hits(shape)[0]) * self._block_size_tokens if self._caching else 0

    def cached_block_ids(self) -> list[int]:
        return list(self._evictable)

    def block_key(self, block_id: int):
        return self._block_key.get(block_id)

    def group_bytes(self) -> list[int]:
        """Bytes of the blocks each group holds now (a block shared by several sequences once)."""
        return [n * self.page_bytes for n in self._held_per_group]

    def _ledger_groups(self, held_per_group: Sequence[int]) -> tuple[tuple[str, int], ...]:
        """The ledger's per-group parts for these held-block counts: the bytes held by the full
        groups and by the window groups (together, the ledger's allocated bytes)."""
        return tuple(
            (name, sum(held_per_group[g] for g in members) * self.page_bytes) for name, members in self._group_columns
        )

    def ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        num_free = len(self._free_block_ids) + self._num_fresh
        num_cached = len(self._evictable)
        size = self._block_size_tokens
        token_slots = len(self._refs) * size
        future_slots = 0
        partial: dict[int, int] = {}  # partly filled last blocks -> unfilled slots (once if shared)
        for seq_id, tables in self._tables.items():
            n = self._num_tokens[seq_id]
            tail = -n % size
            if not tail:
                continue
            remaining = self._final_kv_tokens[seq_id] - n
            for _, blocks in tables:
                last = blocks[-1]
                partial[last] = tail
                if remaining > 0 and self._refs[last] == 1:
                    future_slots += tail if tail < remaining else remaining
        token_slots -= sum(partial.values())
        return MemoryLedger.from_slots(
            budget_bytes=self.budget_bytes,
            kv_bytes_per_token=self.slot_bytes,
            allocated_slots=len(self._refs) * size,
            token_slots=token_slots,
            future_slots=future_slots,
            external_bytes=self._remainder_bytes,
            free_bytes=num_free * self.page_bytes,
            cached_bytes=num_cached * self.page_bytes,
            group_bytes=self._ledger_groups(self._held_per_group),
        )

    def largest_hole_bytes(self) -> int:
        return self._num_available() * self.page_bytes

    def footprint(self, seq_ids: Sequence[int]) -> Footprint:
        holders = Counter(b for s in seq_ids for b in self.block_table(s))
        num_held = sum(1 for b, n in holders.items() if self._refs[b] == n)
        num_blocks = len(holders)
        return Footprint(num_held * self.page_bytes, Transfer(num_blocks * self.page_bytes, num_blocks))

    # --- the pool ----------------------------------------------------------------------------------

    def _num_available(self) -> int:
        return len(self._free_block_ids) + self._num_fresh + len(self._evictable)

    def _can_take(self, num_blocks: int, keep_free_bytes: int = 0) -> bool:
        left = self._num_available() - num_blocks
        return left >= 0 and left * self.page_bytes >= keep_free_bytes

    def _take(self, num_blocks: int, group: int) -> list[int]:
        """Blocks for ``group``: given back first (last in first out), then never-used ones, then
        evicted cached ones."""
        taken = []
        for _ in range(num_blocks):
            if self._free_block_ids:
                block_id = self._free_block_ids.pop()
            elif self._num_fresh:
                block_id = self.num_blocks - self._num_fresh
                self._num_fresh -= 1
            else:
                block_id, _ = self._evictable.popitem(last=False)
                key = self._block_key.pop(block_id)
                del self._cached_block_id[key]
                self.num_evicted_blocks += 1
            self._refs[block_id] = 1
            self._group_of[block_id] = group
            taken.append(block_id)
        self._held_per_group[group] += num_blocks
        return taken

    def _release(self, block_id: int) -> bool:
        """One holder fewer; a block nobody holds goes to the LRU queue (keyed) or the free pool
        (and the answer is True)."""
        holders = self._refs[block_id] - 1
        if holders:
            self._refs[block_id] = holders
            return False
        del self._refs[block_id]
        self._held_per_group[self._group_of[block_id]] -= 1
        if block_id in self._block_key:
            self._evictable[block_id] = None
        else:
            self._free_block_ids.append(block_id)
        return True

    def _reference(self, block_id: int) -> None:
        if block_id in self._evictable:
            del self._evictable[block_id]
            self._refs[block_id] = 1
            self._held_per_group[self._group_of[block_id]] += 1
        else:
            self._refs[block_id] += 1

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
            for per_group in hits[1]:
                for block_id in per_group:  # before taking new blocks: an eviction must not take a hit
                    self._reference(block_id)
        for g, window in enumerate(self._windows):
            first = self._first_needed(window, n)
            hit_blocks = hits[1][g] if hits is not None else []
            tables.append((first, hit_blocks + self._take(end - first - len(hit_blocks), g)))
        self._tables[seq_id] = tables
        self._num_tokens[seq_id] = n
        self._final_kv_tokens[seq_id] = shape.final_kv_tokens
        if hits is None:
            return 0
        prompt = n if shape.prompt_tokens is None else shape.prompt_tokens
        keys = block_keys(prompt, shape.prefix_hashes, shape.hash_block_tokens, self._block_size_tokens)
        if len(keys) > len(hits[0]):
            self._prompt_keys[seq_id] = keys
            self._pending_keys[seq_id] = len(hits[0])
            self._key_blocks(seq_id)
        return len(hits[0]) * self._block_size_tokens

    def _append_plan(self, seq_id: int, num_tokens: int) -> tuple[int, int, list[int]]:
        """What appending does to each group: (blocks released that nobody else holds, blocks
        needed, the groups whose shared partly filled last block must be copied first)."""
        n = self._num_tokens[seq_id]
        new_n = n + num_tokens
        size = self._block_size_tokens
        end = -(-new_n // size)
        freed, needed, copies = 0, 0, []
        for g, (first, blocks) in enumerate(self._tables[seq_id]):
            new_first = max(first, self._first_needed(self._windows[g], new_n))
            held_end = first + len(blocks)
            for index in range(first, min(new_first, held_end)):
                if self._refs[blocks[index - first]] == 1:
                    freed += 1
            keep_from = max(new_first, first)
            if n % size and held_end - 1 >= keep_from and self._refs[blocks[-1]] > 1:
                copies.append(g)
                needed += 1
            needed += end - max(held_end, new_first)
        return freed, needed, copies

    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Release the blocks the grown sequence's windows left, copy a shared partly filled last
        block, then take the new blocks; all or nothing."""
        freed, needed, copies = self._append_plan(seq_id, num_tokens)
        if needed > self._num_available() + freed:
            return False
        n = self._num_tokens[seq_id] + num_tokens
        end = -(-n // self._block_size_tokens)
        tables = self._tables[seq_id]
        starts = []
        for g, (first, blocks) in enumerate(tables):  # every group releases before any takes
            new_first = max(first, self._first_needed(self._windows[g], n))
            drop = min(new_first - first, len(blocks))
            for block_id in blocks[:drop]:
                self._release(block_id)
            del blocks[:drop]
            self.num_window_slid_blocks += new_first - first
            starts.append(first + drop + len(blocks) if blocks else new_first)
            tables[g] = (new_first, blocks)
        for g, (first, blocks) in enumerate(tables):
            if g in copies:
                (copy_id,) = self._take(1, g)
                self._pending_copies.append(KVCopy(blocks[-1], copy_id, 1, self.page_bytes))
                self.num_cow_copies += 1
                self._release(blocks[-1])
                blocks[-1] = copy_id
            blocks.extend(self._take(end - max(starts[g], first), g))
        self._num_tokens[seq_id] = n
        if self._pending_keys and seq_id in self._pending_keys:
            self._key_blocks(seq_id)
        return True

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        n = self._num_tokens[seq_id]
        if num_tokens == n:
            return
        size = self._block_size_tokens
        end = -(-num_tokens // size)
        tables = self._tables[seq_id]
        cut_partial = bool(num_tokens % size)
        for first, blocks in tables:
            keep = max(end - first, 0)
            dropped = blocks[keep:] + (blocks[keep - 1 : keep] if cut_partial and keep else [])
            if not 0 <= num_tokens < n or any(self._refs[b] > 1 for b in dropped):
                raise ValueError(f"cannot truncate sequence {seq_id} from {n} to {num_tokens} tokens")
        for g, (first, blocks) in enumerate(tables):
            keep = max(end - first, 0)
            if cut_partial and keep:
                self._drop_key(blocks[keep - 1])
            for block_id in reversed(blocks[keep:]):
                self._drop_key(block_id)
                self._release(block_id)
            del blocks[keep:]
            # a window group whose every block left keeps its place (it starts at the next block)
            tables[g] = (first if blocks else min(first, end), blocks)
        self._num_tokens[seq_id] = num_tokens
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
        for _, blocks in tables:
            for block_id in blocks:
                self._refs[block_id] += 1
        self._tables[child_id] = [(first, list(blocks)) for first, blocks in tables]
        self._num_tokens[child_id] = self._num_tokens[parent_id]
        self._final_kv_tokens[child_id] = (
            self._final_kv_tokens[parent_id] if child_final_kv_tokens is None else child_final_kv_tokens
        )

    def free(self, seq_id: int) -> None:
        tables = self._tables.pop(seq_id)
        del self._num_tokens[seq_id]
        del self._final_kv_tokens[seq_id]
        self._prompt_keys.pop(seq_id, None)
        self._pending_keys.pop(seq_id, None)
        for _, blocks in tables:
            for block_id in reversed(blocks):  # a prefix's tail is evicted before its head
                self._release(block_id)

    def swap_out(self, seq_ids: Sequence[int]) -> Transfer:
        family = tuple(seq_ids)
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
        if any(b in self._refs and b not in self._block_key for b in positions):
            raise RuntimeError(f"swap_out of {family}: a block is shared with a sequence outside the set")
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
            self._refs[blocks[p]] = n
        for seq_id, tables, num_tokens, final in structure:
            self._tables[seq_id] = [(first, [blocks[p] for p in b]) for first, b in tables]
            self._num_tokens[seq_id] = num_tokens
            self._final_kv_tokens[seq_id] = final
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
        """Exact, step by step in plain integers, on a copy of the few numbers an append changes:
        per step and sequence in order, the blocks its windows leave are released (a shared one
        loses a holder; one nobody holds goes to the free pool, or to the LRU queue when keyed),
        then a block is taken per group whose last block is full. Stops at the first step some
        append could not make; a partly filled shared last block (a copy on the next append)
        stops it at 0 steps."""
        if not seq_ids or max_steps <= 0:
            return NO_PROJECTION
        if self._pending_keys and any(seq_id in self._pending_keys for seq_id in seq_ids):
            return self._simulate_decode(seq_ids, max_steps, next_shape)
        size = self._block_size_tokens
        refs, keyed = self._refs, self._block_key
        state = []  # per sequence: [tokens, final, [[window, first, held ids (None: taken in the span)]]]
        for seq_id in seq_ids:
            n = self._num_tokens[seq_id]
            groups = []
            for g, (first, blocks) in enumerate(self._tables[seq_id]):
                if n % size and blocks and refs[blocks[-1]] > 1:
                    return NO_PROJECTION
                groups.append([self._windows[g], first, list(blocks)])
            state.append([n, self._final_kv_tokens[seq_id], groups])
        led = self.ledger(next_shape)
        slot = self.slot_bytes or 1
        truly_free, cached, allocated = len(self._free_block_ids) + self._num_fresh, len(self._evictable), len(refs)
        token_slots, future_slots = led.token_bytes // slot, led.reserved_future_bytes // slot
        held_per_group = list(self._held_per_group)
        holders: dict[int, int] = {}  # known blocks' holders as the span releases them
        columns: dict[str, list[int]] = {name: [] for name in ("token", "future", "internal", "free", "cached")}
        group_columns: dict[str, list[int]] = {name: [] for name, _ in self._group_columns}
        for _ in range(max_steps):
            # one step on copies: a step that cannot be taken whole leaves the state as it was
            free_, cached_, alloc_, token_, future_ = truly_free, cached, allocated, token_slots, future_slots
            held_ = list(held_per_group)
            step_holders = dict(holders)
            new_state = []
            ok = True
            for n, final, groups in state:
                new_n = n + 1
                end = -(-new_n // size)
                new_groups = []
                num_new = 0
                for g, (window, first, blocks) in enumerate(groups):
                    new_first = max(first, self._first_needed(window, new_n))
                    drop = min(new_first - first, len(blocks))
                    for block_id in blocks[:drop]:
                        left = (1 if block_id is None else step_holders.get(block_id, refs[block_id])) - 1
                        if block_id is not None:
                            step_holders[block_id] = left
                        if left:
                            continue
                        alloc_ -= 1
                        held_[g] -= 1
                        token_ -= size  # a block that left a window is full
                        if block_id is not None and block_id in keyed:
                            cached_ += 1
                        else:
                            free_ += 1
                    kept = blocks[drop:]
                    start = new_first + len(kept)
                    if end > start:
                        num_new += end - start
                        held_[g] += end - start
                        kept = kept + [None] * (end - start)
                    new_groups.append([window, new_first, kept])
                if num_new > free_ + cached_:
                    ok = False
                    break
                from_free = num_new if num_new < free_ else free_
                free_ -= from_free
                cached_ -= num_new - from_free
                alloc_ += num_new
                token_ += len(groups)  # the new token in every group
                # its own last block's unfilled slots up to its final length are its future
                before = min(-n % size, max(final - n, 0))
                after = min(-new_n % size, max(final - new_n, 0))
                future_ += (after - before) * len(groups)
                new_state.append([new_n, final, new_groups])
            if not ok:
                break
            state, holders, held_per_group = new_state, step_holders, held_
            truly_free, cached, allocated, token_slots, future_slots = free_, cached_, alloc_, token_, future_
            columns["token"].append(token_slots * slot)
            columns["future"].append(future_slots * slot)
            columns["internal"].append((allocated * size - token_slots - future_slots) * slot)
            columns["free"].append(truly_free * self.page_bytes)
            columns["cached"].append(cached * self.page_bytes)
            for name, value in self._ledger_groups(held_per_group):
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
