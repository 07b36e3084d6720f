"""Which blocks each KV-cache group of a sliding-window model holds (``hybrid_paged``'s arithmetic).

Per sequence of ``n`` tokens and group, in blocks of ``block_size_tokens`` (B):

- a full group holds the ``ceil(n / B)`` blocks of all ``n`` tokens;
- a window group of W tokens holds only the blocks overlapping the last W tokens ``[n - W, n)``
  (what the next token's query reads): logical blocks ``(n - W) // B`` to ``(n - 1) // B``.

A prefix hit of ``p`` tokens needs, in every group, what that group would hold at ``p``: a full
group the blocks of ``[0, p)``, a window group those of ``[p - W, p)`` (vLLM's rule: a prefix is
cached only if each group can serve it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Hashable, Mapping, Sequence

from kvbench.core.kv import SeqShape
from kvbench.errors import ConfigError
from kvbench.specs.kv_groups import FULL, WINDOW, KVGroup

#: a sequence's table in one group: (logical index of its first held block, the held block ids)
GroupTable = tuple[int, list[int]]


def group_slot_bytes(groups: Sequence[KVGroup], kv_bytes_per_token: int) -> int:
    """One group's bytes per token (a slot of any block), for groups one pool can serve: full and
    window groups of equally many layers (equal block bytes); refused in one line otherwise."""
    if any(g.kind not in (FULL, WINDOW) for g in groups):
        raise ConfigError("allocator=paged holds full and sliding-window groups only, not a state group")
    if len({g.num_layers for g in groups}) != 1:
        raise ConfigError("allocator=paged needs KV groups of equally many layers (equal block bytes)")
    num_layers = sum(g.num_layers for g in groups)
    if kv_bytes_per_token * groups[0].num_layers % num_layers:
        raise ValueError("kv_bytes_per_token is not a whole number of bytes per group")
    return kv_bytes_per_token * groups[0].num_layers // num_layers


class GroupLayout:
    """The blocks of each group (``windows``: each group's window in tokens, 0 for full attention)."""

    def __init__(self, windows: Sequence[int], block_size_tokens: int) -> None:
        self.windows = tuple(windows)
        self.block_size_tokens = block_size_tokens
        #: (window tokens, how many window groups have it), for the block counts of a whole sequence
        self.groups_per_window = tuple(Counter(filter(None, self.windows)).items())

    def first_needed(self, window: int, num_tokens: int) -> int:
        """The first logical block a group needs at ``num_tokens`` tokens (0 for a full group)."""
        return (num_tokens - window) // self.block_size_tokens if window and num_tokens > window else 0

    def blocks_held(self, num_tokens: int) -> int:
        """Blocks over every group of a sequence of ``num_tokens`` grown one append at a time."""
        size = self.block_size_tokens
        blocks = len(self.windows) * -(-num_tokens // size)
        for window, num_groups in self.groups_per_window:  # less what each window has left
            if num_tokens > window:
                blocks -= num_groups * ((num_tokens - window) // size)
        return blocks

    def most_blocks(self, final_tokens: int) -> int:
        """The most blocks a sequence holds at once on its way to ``final_tokens``: full groups grow
        with it, a window group grows up to its window and then repeats with period B, so the most
        is within the last B + 1 lengths."""
        size = self.block_size_tokens
        return max(self.blocks_held(n) for n in range(max(1, final_tokens - size), final_tokens + 1))

    def max_sequence_tokens(self, num_blocks: int, shape: SeqShape) -> int:
        """The longest sequence whose blocks, over every group, fit ``num_blocks``; a model whose
        every layer is windowed holds any length once its windows fit (the shape's S_max then)."""
        if self.most_blocks(1) > num_blocks:
            return 0
        if all(self.windows):
            limit = max(shape.s_max_tokens, shape.final_kv_tokens)
            return limit if self.most_blocks(limit) <= num_blocks else 0
        low, high = 1, num_blocks * self.block_size_tokens
        while low < high:  # the most blocks held grows with the length once a full group is there
            mid = (low + high + 1) // 2
            if self.most_blocks(mid) <= num_blocks:
                low = mid
            else:
                high = mid - 1
        return low

    def shared_prompt_blocks(self, prompt_tokens: int) -> int:
        """Blocks a fan-out's branches share: the full groups' full prompt blocks (window groups
        are counted per branch, a bound)."""
        return sum(1 for w in self.windows if not w) * (prompt_tokens // self.block_size_tokens)

    def longest_hit(self, keys: Sequence[Hashable], max_blocks: int, present: Callable[[tuple], bool]) -> int:
        """The longest prefix, in blocks (at most ``max_blocks``), that every group can serve from
        blocks whose ``(group, key)`` is ``present``."""
        runs = []  # per group, the present run ending at each logical block
        limit = max_blocks
        for g, window in enumerate(self.windows):
            run, out = 0, []
            for index in range(max_blocks):
                run = run + 1 if present((g, keys[index])) else 0
                out.append(run)
                if not window and not run:
                    limit = min(limit, index)
                    break
            runs.append(out)
        size = self.block_size_tokens
        for h in range(limit, 0, -1):  # the longest hit every window group can serve too
            if all(runs[g][h - 1] >= h - self.first_needed(w, h * size) for g, w in enumerate(self.windows) if w):
                return h
        return 0

    def hit_blocks(self, keys: Sequence[Hashable], num_hit: int, num_tokens: int, cached: Mapping) -> list[list[int]]:
        """Each group's blocks of a hit of ``num_hit`` blocks, from the group's first needed block at
        the allocation's ``num_tokens`` (``cached``: ``(group, key)`` -> its block)."""
        return [
            [cached[(g, keys[i])] for i in range(self.first_needed(w, num_tokens), num_hit)]
            for g, w in enumerate(self.windows)
        ]

    def host_walk(
        self, keys: Sequence[Hashable], max_blocks: int, cached: Mapping, host: Container
    ) -> tuple[int, int, list[tuple[Hashable, int | None]]]:
        """The host tier's lookup: the longest hit from GPU-cached blocks alone, the longest from
        those and ``host``-resident keys, and, when longer, the blocks the longer hit needs in every
        group, group by group, each ``(group, key)`` with its GPU block (None: on host)."""
        num_gpu = self.longest_hit(keys, max_blocks, cached.__contains__)
        num_hit = self.longest_hit(keys, max_blocks, lambda key: key in cached or key in host)
        if num_hit <= num_gpu:
            return num_gpu, num_hit, []
        end = num_hit * self.block_size_tokens
        walk = [
            ((g, keys[i]), cached.get((g, keys[i])))
            for g, w in enumerate(self.windows)
            for i in range(self.first_needed(w, end), num_hit)
        ]
        return num_gpu, num_hit, walk

    def walk_tables(self, blocks: Sequence[int], num_hit: int) -> list[GroupTable]:
        """A :meth:`host_walk`'s blocks, in its order, as each group's table at ``num_hit`` blocks."""
        tables, start = [], 0
        for window in self.windows:
            first = self.first_needed(window, num_hit * self.block_size_tokens)
            tables.append((first, list(blocks[start : start + num_hit - first])))
            start += num_hit - first
        return tables

    def append_plan(
        self, tables: Sequence[GroupTable], num_tokens: int, new_tokens: int, shared: Container[int]
    ) -> tuple[int, int, list[int]]:
        """What appending ``new_tokens`` to a sequence of ``num_tokens`` does to its groups' tables:
        (blocks released that nobody else holds, blocks needed, the groups whose ``shared`` partly
        filled last block must be copied first)."""
        size = self.block_size_tokens
        new_n = num_tokens + new_tokens
        end = -(-new_n // size)
        freed, needed, copies = 0, 0, []
        for g, (first, blocks) in enumerate(tables):
            new_first = max(first, self.first_needed(self.windows[g], new_n))
            held_end = first + len(blocks)
            freed += sum(1 for i in range(first, min(new_first, held_end)) if blocks[i - first] not in shared)
            if num_tokens % size and held_end - 1 >= new_first and blocks[-1] in shared:
                copies.append(g)
                needed += 1
            needed += end - max(held_end, new_first)
        return freed, needed, copies

    def tail_slots(
        self,
        tables: Mapping[int, Sequence[GroupTable]],
        num_tokens: Mapping[int, int],
        final: Mapping[int, int],
        shared,
    ) -> tuple[int, int]:
        """(the unfilled slots of the partly filled last blocks, each counted once however many
        hold it; the reserved future: each sequence's unfilled slots of its own, unshared last
        blocks, up to its final length)."""
        size = self.block_size_tokens
        future_slots = 0
        partial: dict[int, int] = {}  # partly filled last blocks -> unfilled slots
        for seq_id, seq_tables in tables.items():
            n = num_tokens[seq_id]
            tail = -n % size
            if not tail:
                continue
            remaining = final[seq_id] - n
            for _, blocks in seq_tables:
                if not blocks:  # a window group truncated past its window holds none
                    continue
                last = blocks[-1]
                partial[last] = tail
                if remaining > 0 and last not in shared:
                    future_slots += tail if tail < remaining else remaining
        return sum(partial.values()), future_slots

    def can_truncate(
        self, tables: Sequence[GroupTable], num_tokens: int, new_tokens: int, shared: Container[int]
    ) -> bool:
        """Whether a sequence of ``num_tokens`` can be cut back to ``new_tokens``: no block it drops
        or cuts into (a partly kept last block) is shared (another holder's tokens are in it)."""
        if not 0 <= new_tokens < num_tokens:
            return False
        end = -(-new_tokens // self.block_size_tokens)
        cut_partial = bool(new_tokens % self.block_size_tokens)
        for first, blocks in tables:
            keep = max(end - first, 0)
            if any(b in shared for b in blocks[keep - 1 if cut_partial and keep else keep :]):
                return False
        return True

    def slide(
        self, tables: list[GroupTable], num_tokens: int, release: Callable[[int, int], object]
    ) -> tuple[list[int], int]:
        """Move each group's window to ``num_tokens`` (every group before any takes a block, as vLLM
        removes skipped blocks before allocating): ``release(block, group)`` the blocks it left; returns where
        each group's next new block goes, and how many blocks the windows moved past (dropped, or
        never taken when one call appends several blocks' worth)."""
        starts, num_slid = [], 0
        for g, (first, blocks) in enumerate(tables):
            new_first = max(first, self.first_needed(self.windows[g], num_tokens))
            drop = min(new_first - first, len(blocks))
            for block_id in blocks[:drop]:
                release(block_id, g)
            del blocks[:drop]
            num_slid += new_first - first
            starts.append(first + drop + len(blocks) if blocks else new_first)
            tables[g] = (new_first, blocks)
        return starts, num_slid
