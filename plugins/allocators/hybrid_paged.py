"""Paged KV cache with hybrid groups (vLLM's hybrid KV cache manager): one block pool, one block
table per sequence per KV-cache group, blocks freed as they slide out of a window.

A model with sliding-window layers (:mod:`kvbench.specs.kv_groups`) has several KV-cache groups of
equally many layers, so one block of any group has the same bytes: every group draws from one
:class:`~kvbench.memory.group_pool.GroupBlockPool`. Which blocks each group holds (a full group
all ``ceil(n / B)``, a window group of W tokens those overlapping ``[n - W, n)``), what a prefix
hit needs and what an append frees are :mod:`kvbench.memory.kv_group_blocks`; the appends, which
free what a window left before taking new blocks (as vLLM), :mod:`kvbench.memory.window_appends`.
``truncate`` cannot bring back blocks that already left a window.

Accounting: a slot is one token of one group's block (``slot_bytes``; ``kv_bytes_per_token`` stays
the whole model's). Token bytes are the filled slots of held blocks, reserved future the unfilled
tail of each sequence's own last block per group, up to its final length; ``group_bytes()`` splits
the held bytes by group. Fork shares every group's blocks (copy-on-write per group); swap moves
every distinct block once. With ``prefix_caching`` every group's full prompt blocks get keys (the
group's index and the prefix key), one block per key; a hit of ``p`` tokens needs in every group
what it would hold at ``p`` (vLLM's rule). A host tier keeps evicted blocks' keys, and
:meth:`HybridPagedAllocator.reload_from_host` brings back what a longer hit needs in every group.
``project_decode`` is closed-form while nothing is shared or keyed
(:mod:`kvbench.memory.window_projection`), step by step otherwise (:mod:`kvbench.memory.window_stepwise`).

A model with linear-attention layers (Qwen3.5) has state groups beside its full ones: each
sequence's state takes whole blocks of the same pool, one state per state group, taken at
admission, freed with the sequence, moved by a swap and copied by a fork
(:mod:`kvbench.memory.state_blocks`). ``kv_groups`` are then the groups with block tables (full and
window), ``state_groups`` the others. A prefix cache cannot serve such a model (a hit would need the
linear layers' state at the prefix's end, which is not kept): refused in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvbench import hookimpl
from kvbench.core.kv import NO_PROJECTION, DecodeProjection, Footprint, KVCopy, Refusal, SeqShape, Transfer
from kvbench.core.ledger import MemoryLedger
from kvbench.errors import ConfigError
from kvbench.memory.allocator import AllocatorCapabilities
from kvbench.memory.block_swap import SwappedFamily, swap_in_blocks, swap_out_blocks
from kvbench.memory.group_pool import GroupBlockPool
from kvbench.memory.host_cache import HostReload, host_tier
from kvbench.memory.kv_group_blocks import GroupLayout, GroupTable, group_slot_bytes
from kvbench.memory.paged_config import DEFAULT_BLOCK_SIZE_TOKENS, PagedConfig
from kvbench.memory.paged_projection import SHORT_PROJECTION_STEPS
from kvbench.memory.pooled import PooledAllocator
from kvbench.memory.prompt_keys import PromptKeys
from kvbench.memory.state_blocks import StateBlocks, with_state_columns, with_states
from kvbench.memory.window_appends import WindowGrowth
from kvbench.memory.window_projection import WindowSpan
from kvbench.memory.window_stepwise import project_stepwise, simulate_decode
from kvbench.specs.kv_groups import FULL, STATE, KVGroup

#: the paged allocator's options this one implements (generated-block keys and duplicate cached
#: blocks are paged's alone: here a key is held by one block, of one group)
SUPPORTED_OPTIONS = ("block_size_tokens", "prefix_caching", "host_cache_bytes", "host_reload")


class HybridPagedAllocator(WindowGrowth, PooledAllocator):
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
        state_bytes_per_request: int | None = None,
    ) -> None:
        """``kv_groups``: the model's groups, state groups included (their ``state_bytes`` are the
        state; ``state_bytes_per_request``, when given, must be their sum)."""
        state_groups = tuple(g for g in kv_groups if g.kind == STATE)
        state_bytes = sum(g.state_bytes for g in state_groups)
        if state_bytes_per_request is not None and state_bytes_per_request != state_bytes:
            raise ValueError(f"state_bytes_per_request={state_bytes_per_request} != its state groups' {state_bytes}")
        super().__init__(
            config or PagedConfig(),
            budget_bytes=budget_bytes,
            kv_bytes_per_token=kv_bytes_per_token,
            state_bytes_per_request=state_bytes,
        )
        #: the groups without a block table: one state per sequence each
        self.state_groups = state_groups
        groups = self.kv_groups = tuple(g for g in kv_groups if g.kind != STATE) or (KVGroup(FULL, 1),)
        if state_groups and self.config.prefix_caching:
            raise ConfigError(
                "allocator.prefix_caching=true cannot serve a model with linear-attention layers: a hit "
                "needs their state at the prefix's end, which is not kept; set allocator.prefix_caching=false"
            )
        #: one group's bytes per token: a slot of any block
        self.slot_bytes = group_slot_bytes(groups, self.kv_bytes_per_token)
        self.config.refuse_unsupported(SUPPORTED_OPTIONS, "for a model with sliding-window layers (hybrid KV groups)")
        self._windows = tuple(g.window_tokens for g in groups)  # 0: full attention
        self._num_groups = len(groups)
        self._block_size_tokens = size = self.config.block_size_tokens or DEFAULT_BLOCK_SIZE_TOKENS
        self.group_layout = GroupLayout(self._windows, size)
        self.page_bytes = size * self.slot_bytes  #: one block of any group
        self.num_blocks = self.budget_bytes // self.page_bytes if self.page_bytes else 0
        self._remainder_bytes = self.budget_bytes - self.num_blocks * self.page_bytes
        self._caching = bool(self.config.prefix_caching)
        self.capabilities = replace(
            type(self).capabilities,
            caches_prefixes=self._caching,
            # a window group frees the blocks its window moves past, decoding too
            frees_during_decode=any(self._windows),
        )
        #: the host tier evicted blocks' keys move to, in slots of one group's block (None: none)
        self.host_cache = host_tier(self.config.host_cache_bytes, self.page_bytes, size, enabled=self._caching)
        #: every group's blocks: free, held (counted per ledger part) and cached (keyed (group, key))
        self.pool = GroupBlockPool(self.num_blocks, self.page_bytes, groups, host=self.host_cache)
        # the pool's containers, read on the hot paths without a hop (changed only by the pool, or
        # as a slice by an append that nothing shares)
        self._shared_refs, self._block_key = self.pool.shared_refs, self.pool.key_of
        self._free_block_ids, self._held_per_column = self.pool.free_block_ids, self.pool.held_per_column
        self._start_growth(self.group_layout)  # the tables, token counts and the ledger's totals
        self._swapped: dict[tuple[int, ...], SwappedFamily] = {}
        self.prompt_keys = PromptKeys(self.pool, size)  #: prompt keys, and blocks waiting for theirs
        self._pending_keys = self.prompt_keys.pending  # read by append
        #: each sequence's state blocks (empty for a model without state groups)
        self.states = StateBlocks(self.pool, state_groups)

    # --- sizing ----------------------------------------------------------------------------------

    @property
    def block_size_tokens(self) -> int:
        return self._block_size_tokens

    def max_sequence_tokens(self, shape: SeqShape) -> int:
        return self.group_layout.max_sequence_tokens(self.num_blocks - self.states.blocks_for(1), shape)

    def fits_in_empty(self, shape: SeqShape) -> bool:
        """Every branch at its final length holds its own blocks (and state); the full groups' prompt
        blocks are shared (window groups counted per branch: a bound)."""
        shared = self.group_layout.shared_prompt_blocks(shape.num_tokens) if shape.num_branches > 1 else 0
        own = self.group_layout.most_blocks(max(shape.final_kv_tokens, 1)) - shared
        states = self.states.blocks_for(shape.num_branches)
        return shared + shape.num_branches * own + states <= self.num_blocks

    def reservation_tokens(self, shape: SeqShape) -> int:
        """Whole-model token slots worth of the new blocks the allocation takes (what a refusal reports)."""
        new_blocks = self._blocks_needed(shape)
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

    def num_cached_tokens(self, shape: SeqShape) -> int:
        return len(self._hits(shape)[0]) * self._block_size_tokens if self._caching else 0

    def group_bytes(self) -> list[int]:
        """Bytes of the blocks each group holds now (a block shared by several sequences once)."""
        held: list[set[int]] = [set() for _ in self.kv_groups]
        for tables in self._tables.values():
            for blocks_of_group, (_, blocks) in zip(held, tables):
                blocks_of_group.update(blocks)
        return [len(blocks) * self.page_bytes for blocks in held]

    def ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        """The KV's ledger (:meth:`_kv_ledger`) and the states': their blocks are the state part (the
        live states), reserved future (a fan-out's spares) and internal (the rest)."""
        led = self._kv_ledger(next_shape)
        return with_states(led, self.states.ledger_parts()) if self.states else led

    def _kv_ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        """O(1) from running totals while no block is shared; otherwise a shared partly filled last
        block counts its unfilled slots once, and as nobody's future. The states' blocks are
        neither free nor held by a group here."""
        pool = self.pool
        held_slots = sum(pool.held_per_column) * self._block_size_tokens
        if self._shared_refs:
            unfilled, future_slots = self.group_layout.tail_slots(
                self._tables, self._num_tokens, self._final_kv_tokens, self._shared_refs
            )
        else:
            unfilled, future_slots = self._num_tail_slots, self._num_future_slots
        return MemoryLedger.from_slots(
            budget_bytes=self.budget_bytes,
            kv_bytes_per_token=self.slot_bytes,
            allocated_slots=held_slots,
            token_slots=held_slots - unfilled,
            future_slots=future_slots,
            external_bytes=self._remainder_bytes,
            free_bytes=(len(pool.free_block_ids) + pool.num_fresh) * self.page_bytes,
            cached_bytes=len(pool.evictable) * self.page_bytes,
            group_bytes=pool.group_bytes(),
        )

    def unallocated_bytes(self) -> int:
        """O(1): the free, cached and remainder bytes."""
        return self.pool.num_available() * self.page_bytes + self._remainder_bytes

    # --- prefix cache ----------------------------------------------------------------------------

    def _hits(self, shape: SeqShape) -> tuple[list, list[list[int]]]:
        """The longest hit (in blocks) every group can serve, as (its keys, each group's hit blocks
        from the group's first needed block at the allocation's length)."""
        if not self._caching:
            return [], [[] for _ in self._windows]
        keys = self.prompt_keys.keys_for(shape)
        max_blocks = min(len(keys), self.prompt_keys.max_hit_blocks(shape))
        num_hit = self.group_layout.longest_hit(keys, max_blocks, self.pool.block_of.__contains__)
        return keys[:num_hit], self.group_layout.hit_blocks(keys, num_hit, shape.num_tokens, self.pool.block_of)

    def _blocks_needed(self, shape: SeqShape, hits=None) -> int:
        """New blocks (and evictable hits taken back) an allocation of ``shape`` takes, with a state
        per branch."""
        need = self.group_layout.blocks_held(shape.num_tokens) + self.states.blocks_for(shape.num_branches)
        if not self._caching:
            return need
        _, per_group = self._hits(shape) if hits is None else hits
        return need - sum(len(b) - self.pool.count_evictable(b) for b in per_group)

    def _key_blocks(self, seq_id: int) -> None:
        self.prompt_keys.key_group_blocks(seq_id, self._tables[seq_id], self._num_tokens[seq_id])

    def reload_from_host(self, holder_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> HostReload | None:
        """The host tier's lookup (:meth:`GroupLayout.host_walk`): reload the host blocks a longer
        hit needs, in every group, and pin all its blocks under ``holder_id`` (released with
        :meth:`free`) until the request is admitted. None (changing nothing) when no longer hit
        exists or the reloaded and revived blocks, with ``keep_free_bytes``, do not fit."""
        if holder_id in self._tables:
            raise ValueError(f"sequence {holder_id} is already allocated")
        host, pool = self.host_cache, self.pool
        if host is None or not len(host):
            return None
        keys = self.prompt_keys.keys_for(shape)
        max_blocks = min(len(keys), self.prompt_keys.max_hit_blocks(shape))
        num_gpu, num_hit, walk = self.group_layout.host_walk(keys, max_blocks, pool.block_of, host)
        num_reloaded = sum(1 for _, block_id in walk if block_id is None)
        if not walk or not pool.can_take(num_reloaded + pool.count_evictable(b for _, b in walk), keep_free_bytes):
            return None
        size = self._block_size_tokens
        self._tables[holder_id] = self.group_layout.walk_tables(pool.reload(host, walk), num_hit)
        self._num_tokens[holder_id] = self._final_kv_tokens[holder_id] = num_hit * size
        self._count(holder_id)
        return HostReload(Transfer(num_reloaded * self.page_bytes, 1), tuple(range(num_gpu, num_hit)), size)

    # --- verbs -----------------------------------------------------------------------------------

    def can_allocate(self, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        return self.pool.can_take(self._blocks_needed(shape), keep_free_bytes)

    def refusal_reason(self, shape: SeqShape, keep_free_bytes: int = 0) -> Refusal:
        return Refusal.NO_MEMORY if self._blocks_needed(shape) > self.pool.num_available() else Refusal.WATERMARK

    def can_readmit_branches(self, prompt_tokens: int, branch_tokens: Sequence[int], keep_free_bytes: int = 0) -> bool:
        shared = self.group_layout.shared_prompt_blocks(prompt_tokens)
        blocks = shared + sum(self.group_layout.blocks_held(t) - shared + len(self._windows) for t in branch_tokens)
        blocks += self.states.blocks_for(len(branch_tokens))
        return self.unallocated_bytes() - keep_free_bytes >= blocks * self.page_bytes

    def allocate(self, seq_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> int | None:
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        hits = self._hits(shape) if self._caching else None
        if not self.pool.can_take(self._blocks_needed(shape, hits), keep_free_bytes):
            return None
        n = shape.num_tokens
        end = -(-n // self._block_size_tokens)
        tables = []
        if hits is not None:
            for g, per_group in enumerate(hits[1]):
                for block_id in per_group:  # before taking new blocks: an eviction must not take a hit
                    self.pool.reference_for(block_id, g)
        for g, window in enumerate(self._windows):
            first = self.group_layout.first_needed(window, n)
            hit_blocks = hits[1][g] if hits is not None else []
            tables.append((first, hit_blocks + self.pool.take_for(g, end - first - len(hit_blocks))))
        self._tables[seq_id] = tables
        self._num_tokens[seq_id] = n
        self._final_kv_tokens[seq_id] = shape.final_kv_tokens
        self._count(seq_id)
        if self.states:
            self.states.admit(seq_id, shape.num_branches)
        if hits is None:
            return 0
        self.prompt_keys.start(seq_id, self.prompt_keys.keys_for(shape), len(hits[0]))
        if seq_id in self._pending_keys:
            self._key_blocks(seq_id)
        return len(hits[0]) * self._block_size_tokens

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        n = self._num_tokens[seq_id]
        if num_tokens == n:
            return
        size, tables = self._block_size_tokens, self._tables[seq_id]
        if not self.group_layout.can_truncate(tables, n, num_tokens, self._shared_refs):
            raise ValueError(f"cannot truncate sequence {seq_id} from {n} to {num_tokens} tokens")
        self._forget(seq_id)
        end, cut_partial = -(-num_tokens // size), bool(num_tokens % size)
        for g, (first, blocks) in enumerate(tables):
            keep = max(end - first, 0)
            if cut_partial and keep:
                self.pool.drop_key(blocks[keep - 1])
            for block_id in reversed(blocks[keep:]):
                self.pool.drop_key(block_id)
                self.pool.release_for(block_id, g)
            del blocks[keep:]
            # a window group whose every block left keeps its place (it starts at the next block)
            tables[g] = (first if blocks else min(first, end), blocks)
        self._num_tokens[seq_id] = num_tokens
        self._count(seq_id)
        self.prompt_keys.rewind(seq_id, num_tokens)  # blocks refilled later are keyed again

    def fork(self, parent_id: int, child_id: int, child_final_kv_tokens: int | None = None) -> None:
        if child_id in self._tables:
            kept = self.states.keep_over(child_id) if self.states else None  # overwritten, not freed
            self._free_kv(child_id)
            if kept is not None:
                self.states.put_back(child_id, kept)
        if self.states:  # the parent's state copied into the child's
            src, dst = self.states.fork(parent_id, child_id)
            self._pending_copies.append(KVCopy(src, dst, self.states.blocks_per_state, self.states.state_bytes))
        tables = self._tables[parent_id]
        self.pool.share(block_id for _, blocks in tables for block_id in blocks)
        self._tables[child_id] = [(first, list(blocks)) for first, blocks in tables]
        self._num_tokens[child_id] = self._num_tokens[parent_id]
        self._final_kv_tokens[child_id] = (
            self._final_kv_tokens[parent_id] if child_final_kv_tokens is None else child_final_kv_tokens
        )
        self._count(child_id)
        self._forget(parent_id)  # its tail is shared now: its next append copies it
        self._count(parent_id)

    def free(self, seq_id: int) -> None:
        self._free_kv(seq_id)  # (a KeyError for an unknown sequence, before anything changes)
        if self.states:
            self.states.release(seq_id)

    def _free_kv(self, seq_id: int) -> None:
        tables = self._tables[seq_id]
        self._forget(seq_id)
        del self._tables[seq_id], self._num_tokens[seq_id], self._final_kv_tokens[seq_id]
        del self._layout[seq_id], self._quiet_until[seq_id]
        self.prompt_keys.forget(seq_id)
        for g, (_, blocks) in enumerate(tables):
            self.pool.release_all_for(blocks[::-1], g)  # a prefix's tail is evicted before its head

    def swap_out(self, seq_ids: Sequence[int]) -> Transfer:
        family = tuple(seq_ids)
        firsts = {
            s: ([first for first, _ in self._tables[s]], self._num_tokens[s], self._final_kv_tokens[s]) for s in family
        }
        block_lists = {s: [blocks for _, blocks in self._tables[s]] for s in family}
        state_bytes = self.states.swap_out(family) if self.states else 0  # the states move with the KV
        swapped = swap_out_blocks(self.pool, block_lists, self._free_kv, (firsts, self.prompt_keys.save(family)))
        self._swapped[family] = swapped
        return Transfer(
            swapped.num_blocks * self.page_bytes + state_bytes, swapped.num_blocks + len(family) * bool(self.states)
        )

    def swap_in(self, seq_ids: Sequence[int], keep_free_bytes: int = 0) -> Transfer | None:
        family = tuple(seq_ids)
        state_blocks = self.states.swapped_blocks(family) if self.states else 0
        if not self.pool.can_take(self._swapped[family].num_blocks + state_blocks, keep_free_bytes):
            return None
        state_bytes = self.states.swap_in(family) if self.states else 0
        swapped = self._swapped.pop(family)
        blocks = swap_in_blocks(self.pool, swapped)
        firsts, prompt_keys = swapped.extra
        group_of = {p: g for lists in swapped.positions.values() for g, b in enumerate(lists) for p in b}
        for g in group_of.values():  # each block is held by its group again
            self._held_per_column[self.pool.column_of[g]] += 1
        for seq_id, position_lists in swapped.positions.items():
            seq_firsts, num_tokens, final = firsts[seq_id]
            self._tables[seq_id] = [(first, [blocks[p] for p in b]) for first, b in zip(seq_firsts, position_lists)]
            self._num_tokens[seq_id] = num_tokens
            self._final_kv_tokens[seq_id] = final
        for seq_id in swapped.positions:  # once every table is back: which tails are shared is known
            self._count(seq_id)
        self.prompt_keys.restore(prompt_keys)
        return Transfer(
            swapped.num_blocks * self.page_bytes + state_bytes, swapped.num_blocks + len(family) * bool(self.states)
        )

    def state_held_bytes(self) -> int:
        return self.states.num_blocks_held * self.page_bytes

    def footprint(self, seq_ids: Sequence[int]) -> Footprint:
        """The KV blocks' (:meth:`PooledAllocator.footprint`), and the sequences' states: evicting
        frees their blocks (and a root's spares), a swap moves each state once."""
        kv = super().footprint(seq_ids)
        if not self.states:
            return kv
        held = self.states.held_by(seq_ids) * self.page_bytes
        moved = Transfer(
            kv.transfer.num_bytes + len(seq_ids) * self.states.state_bytes, kv.transfer.num_runs + len(seq_ids)
        )
        return Footprint(kv.held_bytes + held, moved)

    # --- decode projection -----------------------------------------------------------------------

    def project_decode(
        self, seq_ids: Sequence[int], max_steps: int, next_shape: SeqShape | None = None
    ) -> DecodeProjection:
        """Exact: in closed form while no block is shared or keyed and every group of every sequence
        holds a block, otherwise step by step; sequences still keying prompt blocks on a copy of
        the allocator. Stops at the first step some append could not make, or where a window would
        release a shared block (what sharing saves changes there), or, in closed form, at the first
        that would take a sequence past its final length; a partly filled shared last block (a copy
        on the next append) stops it at 0 steps. The KV's steps are projected, then the states
        (which decoding never changes) added to each."""
        if not seq_ids or max_steps <= 0:
            return NO_PROJECTION
        if self._pending_keys and any(seq_id in self._pending_keys for seq_id in seq_ids):
            columns = [name for name, _ in self.pool.group_columns]
            return simulate_decode(self, seq_ids, max_steps, next_shape, columns)
        if not (self._shared_refs or self._block_key):
            sequences = (seq_ids, self._num_tokens, self._final_kv_tokens, self._layout)
            span = WindowSpan(*sequences, self.pool, self._block_size_tokens, self._num_groups, self.slot_bytes)
            projection = span.project(max_steps, lambda: self._kv_ledger(next_shape), SHORT_PROJECTION_STEPS)
            if projection is not None:
                return with_state_columns(projection, self.states.ledger_parts())
        return self._project_stepwise(seq_ids, max_steps, next_shape)

    def _project_stepwise(
        self, seq_ids: Sequence[int], max_steps: int, next_shape: SeqShape | None
    ) -> DecodeProjection:
        seqs = [(self._num_tokens[s], self._final_kv_tokens[s], self._tables[s]) for s in seq_ids]
        projection = project_stepwise(
            seqs, max_steps, lambda: self._kv_ledger(next_shape), self.group_layout, self.pool, self.slot_bytes
        )
        return with_state_columns(projection, self.states.ledger_parts())


@hookimpl
def kvbench_register_allocators() -> list[type]:
    return [HybridPagedAllocator]
