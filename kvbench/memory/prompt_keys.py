"""Which prefix-cache key each full prompt block takes, and when: the keys of a prompt, the longest
run of them a pool has cached (and, past it, on its host tier), and each sequence's prompt blocks
still waiting for their key.

A full prompt block is identified by :func:`kvbench.core.prefix.block_keys` (its granule's chained
id and its end). It gets its key when it becomes full while the prompt is computed, so a request
admitted later, even in the same step, can hit it while the first one still runs (as vLLM v1
caches blocks when it schedules them). With ``own_keys`` (``cache_generated_blocks``: vLLM hashes
every full block) a one-sequence request's blocks past its shared prefix get keys of its own (its
request id and the block's end), up to its final length, generated tokens included.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from kvbench.core.kv import SeqShape
from kvbench.core.prefix import BlockKey, block_keys
from kvbench.memory.block_pool import BlockPool


class PromptKeys:
    """The prompt keys of one allocator's sequences over one :class:`BlockPool`."""

    def __init__(self, pool: BlockPool, block_size_tokens: int, *, own_keys: bool = False) -> None:
        self.pool = pool
        self.block_size_tokens = block_size_tokens
        self.own_keys = own_keys
        #: seq -> its prompt's full-block keys (while some are not yet taken)
        self.keys: dict[int, list[BlockKey]] = {}
        #: seq -> index of its first full prompt block not yet considered for a key; only while
        #: some are left, so that a decoding sequence costs ``append`` one failed dict lookup at most
        self.pending: dict[int, int] = {}
        self._memo: tuple = ((), -1, -1, [])  # the last block_keys call (a refused head is asked every step)

    def keys_for(self, shape: SeqShape) -> list[BlockKey]:
        """The prompt's full-block keys, remembered for the last prompt asked about; with
        ``own_keys``, then the request's own keys for every later full block up to its final
        length (never equal to a prefix key: three fields, the request id first)."""
        hashes, granule = shape.prefix_hashes, shape.hash_block_tokens
        prompt = shape.num_tokens if shape.prompt_tokens is None else shape.prompt_tokens
        own = shape.content_id if self.own_keys and shape.num_branches == 1 else None
        memo_hashes, memo_granule, memo_prompt, memo_keys = self._memo
        if hashes is memo_hashes and granule == memo_granule and prompt == memo_prompt and own is None:
            return memo_keys
        keys = block_keys(prompt, hashes, granule, self.block_size_tokens)
        if own is not None:
            size = self.block_size_tokens
            ends = range((len(keys) + 1) * size, shape.final_kv_tokens + 1, size)
            return keys + [(own, end, -1) for end in ends]  # type: ignore[misc]
        self._memo = (hashes, granule, prompt, keys)
        return keys

    def max_hit_blocks(self, shape: SeqShape) -> int:
        """The most blocks a hit may cover: ``min(prompt, num_tokens - 1)`` tokens, or
        ``num_tokens - 1`` with ``own_keys`` (one token is always computed, for its logits)."""
        prompt = shape.num_tokens if shape.prompt_tokens is None else shape.prompt_tokens
        served = shape.num_tokens - 1 if self.own_keys else min(prompt, shape.num_tokens - 1)
        return served // self.block_size_tokens

    def hits(self, shape: SeqShape) -> list[int]:
        """Blocks of the longest cached run of ``shape``'s keys, at most :meth:`max_hit_blocks`."""
        keys = self.keys_for(shape)
        if not keys:
            return []
        cached = self.pool.block_of
        hits = []
        for key in keys[: self.max_hit_blocks(shape)]:
            block_id = cached.get(key)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def host_walk(self, keys: list[Hashable], on_host: Callable[[Hashable], bool]) -> list[tuple[Hashable, int | None]]:
        """``keys`` walked as :meth:`hits` does, but past a key the pool has not cached on through
        keys ``on_host``, up to the last of those: each key with its GPU block (None: on host).
        Empty when no key of the walk is on host."""
        cached = self.pool.block_of
        walk: list[tuple[Hashable, int | None]] = []
        last_host = -1
        for key in keys:
            block_id = cached.get(key)
            if block_id is None:
                if not on_host(key):
                    break
                last_host = len(walk)
            walk.append((key, block_id))
        del walk[last_host + 1 :]  # GPU blocks past the last host one are not the reload's
        return walk

    def start(self, seq_id: int, keys: list[BlockKey], first_unkeyed: int) -> None:
        """``seq_id`` was allocated with ``keys``, the first ``first_unkeyed`` blocks hits."""
        if len(keys) > first_unkeyed:
            self.keys[seq_id] = keys
            self.pending[seq_id] = first_unkeyed

    def key_full_blocks(self, seq_id: int, table: list[int], num_tokens: int) -> None:
        """Give the sequence's newly full prompt blocks their keys (a key another block already
        holds leaves the block private, or makes it one more holder when the pool keeps duplicates)."""
        keys = self.keys[seq_id]
        start = self.pending[seq_id]
        end = min(len(keys), num_tokens // self.block_size_tokens)
        if end <= start:
            return
        pool, keyed = self.pool, self.pool.key_of
        for index in range(start, end):
            block_id = table[index]
            if block_id not in keyed:
                pool.add_key(block_id, keys[index])
        if end == len(keys):
            del self.pending[seq_id]
        else:
            self.pending[seq_id] = end

    def key_group_blocks(self, seq_id: int, tables: list[tuple[int, list[int]]], num_tokens: int) -> None:
        """:meth:`key_full_blocks` for a sequence with one table per KV-cache group (each from its
        first held block): a block takes ``(group, key)``, in every group that still holds it."""
        keys = self.keys[seq_id]
        start = self.pending[seq_id]
        full_blocks = min(len(keys), num_tokens // self.block_size_tokens)
        pool = self.pool
        for g, (first, blocks) in enumerate(tables):
            for index in range(max(start, first), min(full_blocks, first + len(blocks))):
                if blocks[index - first] not in pool.key_of:
                    pool.add_key(blocks[index - first], (g, keys[index]))
        if full_blocks == len(keys):
            del self.pending[seq_id]
        elif full_blocks > start:
            self.pending[seq_id] = full_blocks

    def forget(self, seq_id: int) -> None:
        if self.keys:
            self.keys.pop(seq_id, None)
            self.pending.pop(seq_id, None)

    def rewind(self, seq_id: int, num_tokens: int) -> None:
        """The sequence was cut back to ``num_tokens``: blocks refilled later are keyed again."""
        keys = self.keys.get(seq_id)
        if keys is not None:
            first_unkeyed = min(self.pending.get(seq_id, len(keys)), num_tokens // self.block_size_tokens)
            if first_unkeyed < len(keys):
                self.pending[seq_id] = first_unkeyed

    def save(self, seq_ids: tuple[int, ...]) -> dict[int, tuple[list[BlockKey], int | None]]:
        """What :meth:`restore` needs to bring the sequences' keys back after a swap."""
        return {s: (self.keys[s], self.pending.get(s)) for s in seq_ids if s in self.keys}

    def restore(self, saved: dict[int, tuple[list[BlockKey], int | None]]) -> None:
        for seq_id, (keys, pending) in saved.items():
            self.keys[seq_id] = keys
            if pending is not None:
                self.pending[seq_id] = pending
