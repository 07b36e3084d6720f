"""PagedAttention's allocator (vLLM): fixed-size blocks, per-sequence block tables, copy-on-write.

The budget is cut into ``num_blocks`` blocks of ``block_size_tokens`` slots. A sequence takes a
block only when its last one is full, so its waste is at most the unfilled tail of one block.
``fork`` shares the parent's blocks by reference count; the first ``append`` that would write into
a shared, partly filled block copies it first (copy-on-write).

``append`` is the simulator's hot path (about a million calls per run), so every ledger total is
kept up to date incrementally and ``ledger()`` is O(1).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench import hookimpl
from kvbench.memory.allocator import Allocator, MemoryLedger, SeqShape
from kvbench.errors import require


@dataclass
class PagedConfig:
    #: tokens per KV block (vLLM's block_size): a power of two from 8 to 256; small blocks waste
    #: less tail, large blocks give the attention kernel longer contiguous runs
    block_size_tokens: int = 16

    def validate(self) -> None:
        size = self.block_size_tokens
        require(
            isinstance(size, int) and 8 <= size <= 256 and size & (size - 1) == 0,
            "allocator.block_size_tokens",
            size,
            "use a power of two from 8 to 256",
        )


class PagedAllocator(Allocator):
    """Block pool + block tables + reference counts, as in the vLLM paper (SOSP '23, section 4)."""

    name = "paged"
    Config = PagedConfig

    def __init__(self, config: PagedConfig | None = None, *, budget_bytes: int, kv_bytes_per_token: int) -> None:
        super().__init__(config or PagedConfig(), budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token)
        self._block_size_tokens = self.config.block_size_tokens
        self.block_bytes = self._block_size_tokens * self.kv_bytes_per_token
        self.num_blocks = self.budget_bytes // self.block_bytes
        # NOTE: the budget left over below one block can never hold a block: external, forever.
        self._remainder_bytes = self.budget_bytes - self.num_blocks * self.block_bytes
        # Free pool as a stack: O(1) pop/push; reversed so that a fresh pool hands out 0, 1, 2, ...
        self._free_block_ids: list[int] = list(range(self.num_blocks - 1, -1, -1))
        self._ref_counts: list[int] = [0] * self.num_blocks
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
        #: copy-on-write block copies made by ``append`` so far
        self.num_cow_copies = 0

    # --- sizing ----------------------------------------------------------------------------------

    @property
    def block_size_tokens(self) -> int:
        return self._block_size_tokens

    def max_sequence_tokens(self, shape: SeqShape) -> int:
        """The whole pool: a paged sequence is limited only by the number of blocks."""
        return self.num_blocks * self._block_size_tokens

    def reservation_tokens(self, shape: SeqShape) -> int:
        """Slots of the blocks covering the prompt (nothing is reserved for the future)."""
        return self._blocks_for(shape.num_tokens) * self._block_size_tokens

    def refcount(self, block_id: int) -> int:
        """How many live sequences hold ``block_id`` in their block table (0 when it is free)."""
        return self._ref_counts[block_id]

    # --- verbs -----------------------------------------------------------------------------------

    def can_fit(self, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        """Whether the prompt's blocks are free with ``keep_free_bytes`` still free afterwards."""
        num_free_after = len(self._free_block_ids) - self._blocks_for(shape.num_tokens)
        return num_free_after >= 0 and num_free_after * self.block_bytes >= keep_free_bytes

    def allocate(self, seq_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        """Take ``ceil(num_tokens / block_size)`` blocks; ``False`` when the watermark would be crossed."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        if not self.can_fit(shape, keep_free_bytes):
            return False
        num_blocks = self._blocks_for(shape.num_tokens)
        table = [self._free_block_ids.pop() for _ in range(num_blocks)]
        for block_id in table:
            self._ref_counts[block_id] = 1
        self._tables[seq_id] = table
        self._num_tokens[seq_id] = shape.num_tokens
        self._final_kv_tokens[seq_id] = shape.final_kv_tokens
        self._future_tokens[seq_id] = 0
        self._num_token_slots += shape.num_tokens
        self._refresh_future(seq_id)
        return True

    def append(self, seq_id: int) -> bool:
        """One more slot: in place, in a new block when the last is full, or after copy-on-write."""
        num_tokens = self._num_tokens[seq_id]
        table = self._tables[seq_id]
        offset = num_tokens % self._block_size_tokens
        if offset and self._ref_counts[table[-1]] == 1:
            # the common case: room in our own last block; one slot of its tail is now a token
            self._num_tokens[seq_id] = num_tokens + 1
            self._num_token_slots += 1
            if self._future_tokens[seq_id]:
                self._future_tokens[seq_id] -= 1
                self._num_future_slots -= 1
            return True
        if not self._free_block_ids:
            return False
        if offset == 0:  # last block full (or none yet): take a fresh one
            block_id = self._free_block_ids.pop()
            self._ref_counts[block_id] = 1
            table.append(block_id)
            self._num_token_slots += 1
        else:  # shared tail: writing into it would corrupt the other holders' tokens
            self._copy_on_write(seq_id, table, offset)
        self._num_tokens[seq_id] = num_tokens + 1
        self._refresh_future(seq_id)
        return True

    def fork(self, parent_id: int, child_id: int, child_final_kv_tokens: int | None = None) -> bool:
        """Share every parent block with the child (reference counts + 1); never needs memory."""
        table = self._tables[parent_id]
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id} is already allocated")
        for block_id in table:
            self._ref_counts[block_id] += 1
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
        return True

    def free(self, seq_id: int) -> None:
        """Drop one reference to each block; blocks nobody holds go back to the pool."""
        table = self._tables.pop(seq_id)
        num_tokens = self._num_tokens.pop(seq_id)
        del self._final_kv_tokens[seq_id]
        self._num_future_slots -= self._future_tokens.pop(seq_id)
        size = self._block_size_tokens
        last_index = len(table) - 1
        for index, block_id in enumerate(table):
            ref_count = self._ref_counts[block_id] - 1
            self._ref_counts[block_id] = ref_count
            if ref_count == 0:
                self._free_block_ids.append(block_id)
                # all holders of a block see the same tokens in it, so its fill is ours
                self._num_token_slots -= size if index < last_index else num_tokens - last_index * size
        if num_tokens % size:
            self._release_tail(table[-1], seq_id)

    # --- views -----------------------------------------------------------------------------------

    def num_tokens(self, seq_id: int) -> int:
        return self._num_tokens[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the sequence's block ids in logical order."""
        return list(self._tables[seq_id])

    def ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        """O(1) from running totals; ``next_shape`` does not matter (any free block serves anyone)."""
        num_free_blocks = len(self._free_block_ids)
        allocated_slots = (self.num_blocks - num_free_blocks) * self._block_size_tokens
        return MemoryLedger.from_slots(
            budget_bytes=self.budget_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            allocated_slots=allocated_slots,
            token_slots=self._num_token_slots,
            future_slots=self._num_future_slots,
            external_bytes=self._remainder_bytes,
            free_bytes=num_free_blocks * self.block_bytes,
        )

    # --- internals -------------------------------------------------------------------------------

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self._block_size_tokens)

    def _copy_on_write(self, seq_id: int, table: list[int], offset: int) -> None:
        shared_id = table[-1]
        block_id = self._free_block_ids.pop()
        self._ref_counts[block_id] = 1
        self._ref_counts[shared_id] -= 1
        table[-1] = block_id
        self._num_token_slots += offset + 1  # the copied tokens plus the new one
        self.num_cow_copies += 1
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
        if tail_tokens and self._ref_counts[self._tables[seq_id][-1]] == 1:
            remaining_tokens = self._final_kv_tokens[seq_id] - num_tokens
            if remaining_tokens > 0:
                future_tokens = min(tail_tokens, remaining_tokens)
        self._num_future_slots += future_tokens - self._future_tokens[seq_id]
        self._future_tokens[seq_id] = future_tokens


@hookimpl
def kvbench_register_allocators() -> list[type]:
    return [PagedAllocator]
