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

from collections.abc import Callable, Hashable, Sequence

from kvbench.core.kv import SeqShape


class GroupLayout:
    """The blocks of each group (``windows``: each group's window in tokens, 0 for full attention)."""

    def __init__(self, windows: Sequence[int], block_size_tokens: int) -> None:
        self.windows = tuple(windows)
        self.block_size_tokens = block_size_tokens

    def first_needed(self, window: int, num_tokens: int) -> int:
        """The first logical block a group needs at ``num_tokens`` tokens (0 for a full group)."""
        return (num_tokens - window) // self.block_size_tokens if window and num_tokens > window else 0

    def blocks_held(self, num_tokens: int) -> int:
        """Blocks over every group of a sequence of ``num_tokens`` grown one append at a time."""
        end = -(-num_tokens // self.block_size_tokens)
        return sum(end - self.first_needed(w, num_tokens) for w in self.windows)

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
