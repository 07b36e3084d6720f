"""PagedAttention's allocator (vLLM): fixed-size blocks, per-sequence block tables, copy-on-write.

The budget is cut into ``num_blocks`` blocks of ``block_size_tokens`` slots. A sequence takes a
block only when its last one is full, so its waste is at most the unfilled tail of one block.
``fork`` shares the parent's blocks by reference count; the first ``append`` that would write into
a shared, partly filled block copies it first (copy-on-write).

``append`` is the simulator's hot path, so every ledger total is kept up to date incrementally and
``ledger()`` is O(1); ``project_decode`` answers "how many decode steps until a block runs out, and
what does the ledger look like meanwhile" in closed form, so that the engine can skip those steps.

The blocks themselves (free, held, cached; reference counts; eviction) are a
:class:`~kvbench.memory.block_pool.BlockPool`; this module keeps what is paged attention's own:
block tables, token counts, each sequence's reserved future, copy-on-write of a shared last block.

Prefix caching (``prefix_caching=true``, vLLM's automatic prefix caching, v1's block pool): full
prompt blocks get keys as they fill (:mod:`kvbench.memory.prompt_keys`). ``allocate`` reuses every
cached block of the longest cached run of the prompt's keys, up to ``min(prompt, num_tokens - 1)``
tokens, in whole blocks (as vLLM: a fully cached prompt still computes its last token to get
logits). A keyed block nobody holds is *cached*: it joins the back of the pool's eviction queue, a
sequence's blocks last block first, so a prefix's tail is evicted before its head (a head evicted
first would strand the rest). A block that fills with a key another block holds stays private
(recomputed content), or, with ``cache_duplicate_blocks=true``, takes the key too (the pool's
:data:`~kvbench.memory.block_pool.VLLM` policy). Swaps: :mod:`kvbench.memory.block_swap`.

``host_cache_bytes > 0`` (a host tier, :mod:`kvbench.memory.host_cache`): an evicted block's key
moves to host memory instead of vanishing, and :meth:`PagedAllocator.reload_from_host`, which the
scheduler calls before an admission (:mod:`kvbench.sched.host_reload`), continues a prefix lookup
past the GPU-cached blocks through host-resident keys and reloads them into new blocks, pinned
until the request is admitted. ``allocate`` itself only ever sees the GPU tier.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from kvbench import hookimpl
from kvbench.core.kv import NO_PROJECTION, DecodeProjection, Footprint, KVCopy, Refusal, SeqShape, Transfer
from kvbench.core.ledger import MemoryLedger
from kvbench.memory.allocator import AllocatorCapabilities
from kvbench.memory.block_pool import LRU, VLLM, BlockPool
from kvbench.memory.block_swap import SwappedFamily, swap_in_blocks, swap_out_blocks
from kvbench.memory.host_cache import HostReload, host_tier
from kvbench.memory.paged_config import DEFAULT_BLOCK_SIZE_TOKENS, PagedConfig
from kvbench.memory.paged_projection import SHORT_PROJECTION_STEPS, BlockGrowth, project_blocks
from kvbench.memory.pooled import PooledAllocator
from kvbench.memory.prompt_keys import PromptKeys


class PagedAllocator(PooledAllocator):
    """Block pool + block tables + reference counts, as in the vLLM paper (SOSP '23, section 4)."""

    name = "paged"
    Config = PagedConfig
    capabilities = AllocatorCapabilities(shares_blocks=True, can_swap=True, projects_decode=True)

    def __init__(self, config: PagedConfig | None = None, *, budget_bytes: int, kv_bytes_per_token: int) -> None:
        super().__init__(config or PagedConfig(), budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token)
        self._block_size_tokens = self.config.block_size_tokens or DEFAULT_BLOCK_SIZE_TOKENS  # (None: not resolved)
        self.block_bytes = self._block_size_tokens * self.kv_bytes_per_token
        self.num_blocks = self.budget_bytes // self.block_bytes
        # NOTE: the budget left over below one block can never hold a block: external, forever.
        self._remainder_bytes = self.budget_bytes - self.num_blocks * self.block_bytes
        self._caching = bool(self.config.prefix_caching)
        self._cache_generated = self._caching and bool(self.config.cache_generated_blocks)
        self._cache_duplicates = self._caching and bool(self.config.cache_duplicate_blocks)
        if self._caching:
            self.capabilities = replace(
                type(self).capabilities,
                caches_prefixes=True,
                caches_own_blocks=self._cache_generated,
                caches_duplicate_blocks=self._cache_duplicates,
            )
        #: the host tier evicted blocks' keys move to (None: no host tier, evicted keys vanish)
        self.host_cache = host_tier(
            self.config.host_cache_bytes, self.block_bytes, self.block_size_tokens, enabled=self._caching
        )
        #: the blocks: free, held (reference counted) and cached (keyed, evictable)
        self.pool = BlockPool(
            self.num_blocks, self.block_bytes, policy=VLLM if self._cache_duplicates else LRU, host=self.host_cache
        )
        # read on the hot paths without a hop (the pool's own containers: changed only by the pool)
        self._shared_refs = self.pool.shared_refs
        self._block_key = self.pool.key_of
        self._tables: dict[int, list[int]] = {}
        self._num_tokens: dict[int, int] = {}
        self._final_kv_tokens: dict[int, int] = {}
        # Each sequence's share of reserved_future (slots of its own last block it will still fill).
        self._future_tokens: dict[int, int] = {}
        # Partly filled blocks that are the shared last block of several sequences -> those
        # sequences; when one holder is left, that holder's tail becomes its reserved future again.
        self._shared_tail_holders: dict[int, set[int]] = {}
        self._num_token_slots = 0  # physical slots holding a token (a shared block counted once)
        self._num_future_slots = 0
        # swapped-out families, with each sequence's (tokens, final length) and prompt keys
        self._swapped: dict[tuple[int, ...], SwappedFamily] = {}
        #: copy-on-write block copies made by ``append`` so far
        self.num_cow_copies = 0
        #: each sequence's prompt keys, and its prompt blocks still waiting for theirs
        self.prompt_keys = PromptKeys(self.pool, self._block_size_tokens, own_keys=self._cache_generated)
        self._pending_keys = self.prompt_keys.pending  # read by append, the hot path
        # append_each's one pass repeats what these do: a subclass that changes one appends one by one
        cls = type(self)
        self._plain_appends = all(
            getattr(cls, name) is getattr(PagedAllocator, name)
            for name in ("append", "_append_blocks", "_take_blocks", "_refresh_future")
        )

    # --- sizing ----------------------------------------------------------------------------------

    @property
    def block_size_tokens(self) -> int:
        return self._block_size_tokens

    def max_sequence_tokens(self, shape: SeqShape) -> int:
        """The whole pool: a paged sequence is limited only by the number of blocks."""
        return self.num_blocks * self._block_size_tokens

    def fits_in_empty(self, shape: SeqShape) -> bool:
        """The shared prompt's blocks plus every branch's own blocks (and its copy of a partly
        filled shared block) fit the pool."""
        size = self._block_size_tokens
        shared = shape.num_tokens // size if shape.num_branches > 1 else 0
        own = self._blocks_for(shape.final_kv_tokens) - shared
        return shared + shape.num_branches * own <= self.num_blocks

    def reservation_tokens(self, shape: SeqShape) -> int:
        """Slots of the new blocks covering the prompt: cached blocks it would hit are not new
        (nothing is reserved for the future)."""
        num_hits = len(self.prompt_keys.hits(shape)) if self._caching else 0
        return (self._blocks_for(shape.num_tokens) - num_hits) * self._block_size_tokens

    def num_cached_tokens(self, shape: SeqShape) -> int:
        """Tokens of the longest cached prefix ``allocate`` would reuse now, in whole blocks."""
        return len(self.prompt_keys.hits(shape)) * self._block_size_tokens if self._caching else 0

    # --- verbs -----------------------------------------------------------------------------------

    def allocate(self, seq_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> int | None:
        """Take ``ceil(num_tokens / block_size)`` blocks, the cached ones of the longest cached
        prefix first; ``None`` when the new ones (and evictable hits taken back), plus the
        watermark, are not available. Branches reserve nothing: forks share. Returns the tokens
        in hit blocks."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        num_tokens = shape.num_tokens
        num_blocks = -(-num_tokens // self._block_size_tokens)
        if not self._caching:
            if not self._can_take(num_blocks, keep_free_bytes):
                return None
            self._tables[seq_id] = self._take_blocks(num_blocks)
            num_hit_tokens = 0
        else:
            hits = self.prompt_keys.hits(shape)
            num_revived = self.pool.count_evictable(hits)
            # an evictable hit leaves the available pool as surely as a new block does
            if not self._can_take(num_blocks - len(hits) + num_revived, keep_free_bytes):
                return None
            self.pool.reference(hits)  # before taking new blocks: an eviction must not take a hit
            self._tables[seq_id] = hits + self._take_blocks(num_blocks - len(hits))
            num_hit_tokens = len(hits) * self._block_size_tokens
            # revived blocks hold tokens again; live hits are already counted (shared blocks count once)
            self._num_token_slots += num_revived * self._block_size_tokens - num_hit_tokens
            self.prompt_keys.start(seq_id, self.prompt_keys.keys_for(shape), len(hits))  # (keys remembered)
        self._num_tokens[seq_id] = num_tokens
        self._final_kv_tokens[seq_id] = shape.final_kv_tokens
        self._num_token_slots += num_tokens
        # its own last block's unfilled slots, up to its final length, are its future (never a hit)
        future = min(num_blocks * self._block_size_tokens - num_tokens, max(shape.final_kv_tokens - num_tokens, 0))
        self._future_tokens[seq_id] = future
        self._num_future_slots += future
        if seq_id in self._pending_keys:
            self._key_full_blocks(seq_id)
        return num_hit_tokens

    def can_allocate(self, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        """``allocate``'s own test, changing nothing: the new blocks plus the evictable hits it
        would take back, and the watermark, within the free and evictable blocks."""
        return self._can_take(self._blocks_needed(shape), keep_free_bytes)

    def refusal_reason(self, shape: SeqShape, keep_free_bytes: int = 0) -> Refusal:
        return Refusal.NO_MEMORY if self._num_free_blocks() < self._blocks_needed(shape) else Refusal.WATERMARK

    def _blocks_needed(self, shape: SeqShape) -> int:
        """Blocks ``allocate`` takes from the available ones: new blocks and evictable hits."""
        num_blocks = self._blocks_for(shape.num_tokens)
        if self._caching:
            hits = self.prompt_keys.hits(shape)
            num_blocks += self.pool.count_evictable(hits) - len(hits)
        return num_blocks

    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Room for ``num_tokens`` more: in the own last block, in new blocks, or after copying a
        shared last block first (copy-on-write)."""
        tokens = self._num_tokens[seq_id]
        offset = tokens % self._block_size_tokens
        if (
            offset
            and num_tokens <= self._block_size_tokens - offset
            and self._tables[seq_id][-1] not in self._shared_refs
        ):
            # the hot path: room in our own last block; that much of its tail becomes tokens
            self._num_tokens[seq_id] = tokens + num_tokens
            self._num_token_slots += num_tokens
            future = self._future_tokens[seq_id]
            if future:
                used = future if future < num_tokens else num_tokens
                self._future_tokens[seq_id] = future - used
                self._num_future_slots -= used
            if self._pending_keys and seq_id in self._pending_keys:  # a prompt block may be full now
                self._key_full_blocks(seq_id)
            return True
        return self._append_blocks(seq_id, tokens, offset, num_tokens)

    def _append_blocks(self, seq_id: int, tokens: int, offset: int, num_tokens: int) -> bool:
        """``append`` that needs new blocks, and maybe a copy of a shared last block first."""
        size = self._block_size_tokens
        table = self._tables[seq_id]
        shared_tail = offset and table[-1] in self._shared_refs
        if shared_tail:  # writing into it would corrupt the other holders' tokens: copy it first
            num_new_blocks = self._blocks_for(offset + num_tokens)
        else:
            num_new_blocks = self._blocks_for(num_tokens - (size - offset if offset else 0))
        if num_new_blocks > self._num_free_blocks():
            return False
        if shared_tail:
            self._copy_on_write(seq_id, table, offset)
            num_new_blocks -= 1
        table.extend(self._take_blocks(num_new_blocks))
        self._num_tokens[seq_id] = tokens + num_tokens
        self._num_token_slots += num_tokens
        self._refresh_future(seq_id)
        if self._pending_keys and seq_id in self._pending_keys:
            self._key_full_blocks(seq_id)
        return True

    def append_each(self, seq_ids: Sequence[int], num_tokens: int) -> int:
        """``append(seq_id, num_tokens)`` for each in turn, in one pass (a run of decode steps
        advances the whole batch this way: its cost is per sequence, so per-call overhead counts).

        Without shared blocks and prompt keys pending (no fork, no prefix cache filling up) no
        sequence needs a copy or a key, and a sequence's new blocks come off the given-back stack
        as ``_take_blocks`` pops them; the totals are integers, summed here and added once (the
        same values in any order). Anything else (shared blocks, keys, blocks fresh or evicted, a
        subclass with its own appending or placement) goes through ``append`` one by one."""
        if self._shared_refs or self._pending_keys or not self._plain_appends:
            return super().append_each(seq_ids, num_tokens)
        size = self._block_size_tokens
        counts, tables, futures, finals = self._num_tokens, self._tables, self._future_tokens, self._final_kv_tokens
        free, take = self.pool.free_block_ids, self.pool.take
        future_delta = 0  # to the reserved-future total
        done = 0
        for seq_id in seq_ids:
            tokens = counts[seq_id]
            offset = tokens % size
            room = size - offset if offset else 0
            new_tokens = tokens + num_tokens
            if num_tokens <= room:  # its own last block holds them: that much of its future is used
                future = futures[seq_id]
                if future:
                    used = future if future < num_tokens else num_tokens
                    futures[seq_id] = future - used
                    future_delta -= used
            else:
                num_new_blocks = -(-(num_tokens - room) // size)
                if num_new_blocks > len(free):  # fresh or cached blocks, or none: the general path
                    self._num_token_slots += num_tokens * done
                    self._num_future_slots += future_delta
                    return done + super().append_each(seq_ids[done:], num_tokens)
                tables[seq_id].extend(take(num_new_blocks))  # off the given-back stack
                # _refresh_future: the new last block's slots this sequence will still fill
                future = 0
                tail_tokens = -new_tokens % size
                if tail_tokens:
                    remaining_tokens = finals[seq_id] - new_tokens
                    if remaining_tokens > 0:
                        future = tail_tokens if tail_tokens < remaining_tokens else remaining_tokens
                future_delta += future - futures[seq_id]
                futures[seq_id] = future
            counts[seq_id] = new_tokens
            done += 1
        self._num_token_slots += num_tokens * done
        self._num_future_slots += future_delta
        return done

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Drop trailing tokens and the blocks they alone needed (tokens appended after a
        copy-on-write live in the copy, which stays)."""
        tokens = self._num_tokens[seq_id]
        if num_tokens == tokens:
            return
        table = self._tables[seq_id]
        keep = self._blocks_for(num_tokens)
        cut = table[keep - 1 : keep] if num_tokens % self._block_size_tokens else []
        if not 0 <= num_tokens < tokens or any(b in self._shared_refs for b in table[keep:] + cut):
            raise ValueError(f"cannot truncate sequence {seq_id} from {tokens} to {num_tokens} tokens")
        if self._block_key:
            # the tokens taken back were never computed: blocks they filled lose their keys (no
            # other sequence holds them, checked above), and are keyed again when refilled
            for block_id in table[keep:] + cut:
                self.pool.drop_key(block_id)
            self.prompt_keys.rewind(seq_id, num_tokens)
        self.pool.release(reversed(table[keep:]))  # keyless now: onto the free stack
        del table[keep:]
        self._num_tokens[seq_id] = num_tokens
        self._num_token_slots -= tokens - num_tokens
        self._refresh_future(seq_id)

    def fork(self, parent_id: int, child_id: int, child_final_kv_tokens: int | None = None) -> None:
        """Share every parent block with the child (reference counts + 1); an existing child
        first drops its own blocks. Never needs memory."""
        if child_id in self._tables:
            self.free(child_id)
        table = self._tables[parent_id]
        self.pool.share(table)
        num_tokens = self._num_tokens[parent_id]
        self._tables[child_id] = list(table)
        self._num_tokens[child_id] = num_tokens
        self._final_kv_tokens[child_id] = (
            self._final_kv_tokens[parent_id] if child_final_kv_tokens is None else child_final_kv_tokens
        )
        self._future_tokens[child_id] = 0  # its tail is shared, hence internal
        if num_tokens % self._block_size_tokens:
            self._shared_tail_holders.setdefault(table[-1], {parent_id}).add(child_id)
            self._refresh_future(parent_id)  # the parent's tail is now shared too

    def free(self, seq_id: int) -> None:
        """Drop one reference to each block; blocks nobody holds go back to the pool, or, when
        they hold a prefix-cache key, to the back of the evictable queue (last block first)."""
        table = self._tables.pop(seq_id)
        num_tokens = self._num_tokens.pop(seq_id)
        del self._final_kv_tokens[seq_id]
        self._num_future_slots -= self._future_tokens.pop(seq_id)
        self.prompt_keys.forget(seq_id)
        size = self._block_size_tokens
        shared, pool = self._shared_refs, self.pool
        if not shared or not any(map(shared.__contains__, table)):
            # the common case: every block is ours alone (reversed: a later allocation pops them in order)
            pool.release(reversed(table))
            self._num_token_slots -= num_tokens
        else:
            released = pool.drop_holders(table)
            # all holders of a block see the same tokens in it, so its fill is ours: whole blocks,
            # but for the last one's unfilled slots
            self._num_token_slots -= len(released) * size
            if released and released[-1] == table[-1]:
                self._num_token_slots += len(table) * size - num_tokens
            keyed = self._block_key
            if not keyed:
                pool.release(released)
            else:
                # unkeyed ones in table order as before; keyed ones join the LRU queue tail first
                pool.release([b for b in released if b not in keyed])
                pool.release([b for b in reversed(released) if b in keyed])
        if num_tokens % size:
            self._release_tail(table[-1], seq_id)

    def swap_out(self, seq_ids: Sequence[int]) -> Transfer:
        """Copy the family's blocks to the host, each shared block once, and free them
        (:mod:`kvbench.memory.block_swap`)."""
        family = tuple(seq_ids)
        lengths = {s: (self._num_tokens[s], self._final_kv_tokens[s]) for s in family}
        swapped = swap_out_blocks(
            self.pool, {s: (self._tables[s],) for s in family}, self.free, (lengths, self.prompt_keys.save(family))
        )
        self._swapped[family] = swapped
        return Transfer(swapped.num_blocks * self.block_bytes, swapped.num_blocks)

    def swap_in(self, seq_ids: Sequence[int], keep_free_bytes: int = 0) -> Transfer | None:
        """Take fresh blocks for the family (``None`` when they and the watermark are not free) and
        rebuild its tables with the same sharing."""
        family = tuple(seq_ids)
        if not self._can_take(self._swapped[family].num_blocks, keep_free_bytes):
            return None
        swapped = self._swapped.pop(family)
        blocks = swap_in_blocks(self.pool, swapped)
        lengths, prompt_keys = swapped.extra
        size = self._block_size_tokens
        filled: dict[int, int] = {}
        tails: dict[int, set[int]] = {}
        for seq_id in family:
            (table,), (num_tokens, final) = swapped.positions[seq_id], lengths[seq_id]
            self._tables[seq_id] = [blocks[p] for p in table]
            self._num_tokens[seq_id] = num_tokens
            self._final_kv_tokens[seq_id] = final
            self._future_tokens[seq_id] = 0
            for index, p in enumerate(table):
                filled[p] = min(size, num_tokens - index * size)
            if num_tokens % size:
                tails.setdefault(blocks[table[-1]], set()).add(seq_id)
        self._num_token_slots += sum(filled.values())
        for block_id, tail_holders in tails.items():
            if len(tail_holders) > 1:
                self._shared_tail_holders[block_id] = tail_holders
        for seq_id in family:
            self._refresh_future(seq_id)
        self.prompt_keys.restore(prompt_keys)
        return Transfer(swapped.num_blocks * self.block_bytes, swapped.num_blocks)

    # --- views -----------------------------------------------------------------------------------

    def num_tokens(self, seq_id: int) -> int:
        return self._num_tokens[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the sequence's block ids in logical order."""
        return list(self._tables[seq_id])

    def ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        """O(1) from running totals; ``next_shape`` does not matter (any free block serves anyone).
        Free is truly free blocks; cached is evictable blocks holding a prefix-cache key."""
        pool = self.pool
        num_free_blocks, num_cached_blocks = len(pool.free_block_ids) + pool.num_fresh, len(pool.evictable)
        allocated_slots = (self.num_blocks - num_free_blocks - num_cached_blocks) * self._block_size_tokens
        return MemoryLedger.from_slots(
            budget_bytes=self.budget_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            allocated_slots=allocated_slots,
            token_slots=self._num_token_slots,
            future_slots=self._num_future_slots,
            external_bytes=self._remainder_bytes,
            free_bytes=num_free_blocks * self.block_bytes,
            cached_bytes=num_cached_blocks * self.block_bytes,
        )

    def footprint(self, seq_ids: Sequence[int]) -> Footprint:
        """Every distinct block of the set is moved by a swap; evicting the set frees those no
        sequence outside it holds (without prefix caching blocks are shared only within a family,
        so that is all of them)."""
        if not self._block_key:
            num_blocks = len({block_id for seq_id in seq_ids for block_id in self._tables[seq_id]})
            return Footprint(num_blocks * self.block_bytes, Transfer(num_blocks * self.block_bytes, num_blocks))
        holders = Counter(block_id for seq_id in seq_ids for block_id in self._tables[seq_id])
        num_held = sum(1 for block_id, n in holders.items() if self._shared_refs.get(block_id, 1) == n)
        num_blocks = len(holders)
        return Footprint(num_held * self.block_bytes, Transfer(num_blocks * self.block_bytes, num_blocks))

    def project_decode(
        self, seq_ids: Sequence[int], max_steps: int, next_shape: SeqShape | None = None
    ) -> DecodeProjection:
        """Exact in closed form, in O(sequences + steps) (:mod:`kvbench.memory.paged_projection`).
        Sequences must not pass their final length within ``max_steps``; a sequence whose last
        block is shared (a copy pending) stops the projection at 0 steps."""
        if not seq_ids or max_steps <= 0:
            return NO_PROJECTION
        size = self._block_size_tokens
        num_tokens, tables, shared, finals = self._num_tokens, self._tables, self._shared_refs, self._final_kv_tokens
        if shared and any(num_tokens[s] % size and tables[s][-1] in shared for s in seq_ids):
            return NO_PROJECTION
        pool = self.pool
        return project_blocks(
            BlockGrowth.of(seq_ids, num_tokens, finals, size),
            max_steps,
            self.ledger(next_shape),
            kv_bytes_per_token=self.kv_bytes_per_token,
            block_size_tokens=size,
            num_available_blocks=pool.num_available(),
            num_free_blocks=pool.num_free(),
            short_steps=SHORT_PROJECTION_STEPS,  # read here: tests lower it on this module
        )

    # --- what a subclass builds on (with ``self.pool``, the BlockPool) -----------------------------

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that ``num_tokens`` tokens fill (the last one partly)."""
        return -(-num_tokens // self._block_size_tokens)

    def num_free_blocks(self) -> int:
        """Blocks an allocation can take (:meth:`BlockPool.num_available`)."""
        return self.pool.num_available()

    def can_take(self, num_blocks: int, keep_free_bytes: int = 0) -> bool:
        """:meth:`BlockPool.can_take`: ``num_blocks`` with the watermark left available."""
        return self.pool.can_take(num_blocks, keep_free_bytes)

    def take_blocks(self, num_blocks: int) -> list[int]:
        """:meth:`BlockPool.take`, through the hook a subclass may override (``_take_blocks``)."""
        return self._take_blocks(num_blocks)

    def can_readmit_branches(self, prompt_tokens: int, branch_tokens: Sequence[int], keep_free_bytes: int = 0) -> bool:
        """A fan-out readmitted after its branches emitted tokens: the prompt's full blocks once,
        then each branch's own blocks plus one for a copy-on-write of the shared partial block."""
        shared = prompt_tokens // self._block_size_tokens
        blocks = shared + sum(self.blocks_for(tokens) - shared + 1 for tokens in branch_tokens)
        return self.unallocated_bytes() - keep_free_bytes >= blocks * self.block_bytes

    # --- internals -------------------------------------------------------------------------------

    _blocks_for = blocks_for
    _num_free_blocks = num_free_blocks
    _can_take = can_take

    def _take_blocks(self, num_blocks: int) -> list[int]:
        return self.pool.take(num_blocks)

    # --- prefix-cache internals ------------------------------------------------------------------

    def reload_from_host(self, holder_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> HostReload | None:
        """The host tier's lookup: walk ``shape``'s keys as a hit does, but past the GPU-cached
        run continue through keys resident in host memory; reload those into newly taken blocks
        (keyed again, leaving the host tier) and hold every block of the walk under ``holder_id``
        (a pin, released with :meth:`free`), so that nothing of the prefix is evicted before the
        request is admitted and hits it. None (changing nothing) when no walked key is on host or
        the reloaded and revived blocks, with ``keep_free_bytes``, do not fit."""
        if holder_id in self._tables:
            raise ValueError(f"sequence {holder_id} is already allocated")
        host = self.host_cache
        if host is None or not len(host):
            return None
        keys = self.prompt_keys.keys_for(shape)[: self.prompt_keys.max_hit_blocks(shape)]
        walk = self.prompt_keys.host_walk(keys, host.__contains__)
        host_indices = tuple(i for i, (_, block_id) in enumerate(walk) if block_id is None)
        if not host_indices:
            return None
        num_revived = self.pool.count_evictable(block_id for _, block_id in walk)
        if not self._can_take(len(host_indices) + num_revived, keep_free_bytes):
            return None
        table = host.reload_into(self.pool, walk)
        num_tokens = len(table) * self._block_size_tokens
        self._tables[holder_id] = table
        self._num_tokens[holder_id] = self._final_kv_tokens[holder_id] = num_tokens
        self._future_tokens[holder_id] = 0
        # revived and reloaded blocks hold tokens again; live ones are counted already
        self._num_token_slots += (num_revived + len(host_indices)) * self._block_size_tokens
        num_bytes = len(host_indices) * self.block_bytes
        return HostReload(Transfer(num_bytes, 1), host_indices, self._block_size_tokens)

    def _key_full_blocks(self, seq_id: int) -> None:
        self.prompt_keys.key_full_blocks(seq_id, self._tables[seq_id], self._num_tokens[seq_id])

    def _copy_on_write(self, seq_id: int, table: list[int], offset: int) -> None:
        shared_id = table[-1]
        (block_id,) = self._take_blocks(1)
        self.pool.drop_holders((shared_id,))  # shared: other holders keep it
        table[-1] = block_id
        self._num_token_slots += offset  # the copied tokens now exist twice
        self.num_cow_copies += 1
        self._pending_copies.append(KVCopy(shared_id, block_id, 1, self.block_bytes))
        self._release_tail(shared_id, seq_id)

    def _release_tail(self, block_id: int, seq_id: int) -> None:
        holders = self._shared_tail_holders.get(block_id)
        if holders is None:
            return
        holders.discard(seq_id)
        if len(holders) == 1:  # the survivor owns its tail again: it is its future, not waste
            (survivor_id,) = holders
            del self._shared_tail_holders[block_id]
            self._refresh_future(survivor_id)

    def _refresh_future(self, seq_id: int) -> None:
        num_tokens = self._num_tokens[seq_id]
        tail_tokens = -num_tokens % self._block_size_tokens
        future_tokens = 0
        if tail_tokens and self._tables[seq_id][-1] not in self._shared_refs:
            remaining_tokens = self._final_kv_tokens[seq_id] - num_tokens
            if remaining_tokens > 0:
                future_tokens = min(tail_tokens, remaining_tokens)
        self._num_future_slots += future_tokens - self._future_tokens[seq_id]
        self._future_tokens[seq_id] = future_tokens


@hookimpl
def kvbench_register_allocators() -> list[type]:
    return [PagedAllocator]
