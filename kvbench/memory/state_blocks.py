"""Per-request state in whole blocks of a block pool (``hybrid_paged`` for a linear-attention model).

A linear-attention layer (Qwen3.5's gated delta net) keeps no KV per token: each sequence has a
fixed state (a recurrent state and a conv state per layer) whatever its length. vLLM's hybrid KV
cache manager gives such layers their own KV-cache group, whose table holds one block per request:
the state lives in blocks of the one pool every group draws from. Here each state group of a
sequence takes ``ceil(state bytes / block bytes)`` blocks of the pool (vLLM instead raises the
attention block size until one block holds a state; kvbench keeps the block size the user chose and
counts the rounding as internal fragmentation).

Lifetime, as the scheduler sees it: a sequence's state is taken at admission with its first blocks
(all or nothing) and released when it is freed; a recompute preemption frees it (the prefill
rebuilds it), a swap moves it to the host with the KV and back. A fan-out reserves one state per
branch at admission (a fork never needs memory): a fork copies the parent's state into a reserved
one (a :class:`~kvbench.core.kv.KVCopy` of the state's bytes, priced like any copy); a fork over an
existing branch (beam search) overwrites that branch's state in place. A branch freed while the
family's first sequence lives leaves its state to the family as a spare (it may be forked again);
the family's spares go with its first sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvbench.core.kv import DecodeProjection
from kvbench.core.ledger import MemoryLedger
from kvbench.memory.block_pool import BlockPool
from kvbench.specs.kv_groups import STATE, KVGroup

#: the ledger's split by group for the blocks holding states (the full and window groups' are
#: :class:`~kvbench.memory.group_pool.GroupBlockPool`'s)
STATE_COLUMN = f"{STATE}_group_bytes"


class StateBlocks:
    """Which blocks of ``pool`` hold each sequence's state, and the family spares reserved for forks."""

    def __init__(self, pool: BlockPool, state_groups: Sequence[KVGroup]) -> None:
        self.pool = pool
        #: one sequence's state: the state groups' bytes together
        self.state_bytes = sum(g.state_bytes for g in state_groups)
        #: blocks one sequence's state takes: a whole number per state group
        self.blocks_per_state = sum(-(-g.state_bytes // pool.block_bytes) for g in state_groups)
        self._held: dict[int, list[int]] = {}  # seq -> its state's blocks
        self._root: dict[int, int] = {}  # seq -> the sequence its family was admitted as
        self._spares: dict[int, list[list[int]]] = {}  # root -> states reserved for unforked branches
        self._swapped: dict[int, tuple[int, int]] = {}  # seq -> (root, spares it held)
        self._num_spares = 0

    def __bool__(self) -> bool:
        return self.blocks_per_state > 0

    # --- sizes -----------------------------------------------------------------------------------

    def blocks_for(self, num_states: int) -> int:
        """Blocks ``num_states`` states take."""
        return num_states * self.blocks_per_state

    @property
    def num_blocks_held(self) -> int:
        """Blocks holding states now: every live sequence's and every reserved spare."""
        return (len(self._held) + self._num_spares) * self.blocks_per_state

    def held_by(self, seq_ids: Sequence[int]) -> int:
        """Blocks these sequences' states hold, with the spares of the roots among them."""
        spares = sum(len(self._spares.get(s, ())) for s in seq_ids)
        return (len(seq_ids) + spares) * self.blocks_per_state

    def swapped_blocks(self, seq_ids: Sequence[int]) -> int:
        """Blocks a swapped-out family's states take back."""
        return sum(1 + self._swapped[s][1] for s in seq_ids) * self.blocks_per_state

    # --- verbs (the caller checked the pool can take what they take) -----------------------------

    def admit(self, seq_id: int, num_branches: int) -> None:
        """A new family's first sequence: its state and one per branch it will fork into."""
        self._held[seq_id] = self.pool.take(self.blocks_per_state)
        self._root[seq_id] = seq_id
        if num_branches > 1:
            self._spares[seq_id] = [self.pool.take(self.blocks_per_state) for _ in range(num_branches - 1)]
            self._num_spares += num_branches - 1

    def release(self, seq_id: int, keep_for_refork: bool = True) -> None:
        """A freed sequence gives its state back (and, the family's first, its unforked spares).
        A branch freed while its family's first sequence lives (a branch preempted alone, which the
        scheduler forks again from it, or one that finished) leaves its state to the family as a
        spare: a fork never needs memory, and the family's spares go when its first sequence does."""
        blocks = self._held.pop(seq_id)
        root = self._root.pop(seq_id)
        if keep_for_refork and root != seq_id and root in self._held:
            self._spares.setdefault(root, []).append(blocks)
            self._num_spares += 1
        else:
            self._give(blocks)
        for spare in reversed(self._spares.pop(seq_id, [])):
            self._num_spares -= 1
            self._give(spare)

    def fork(self, parent_id: int, child_id: int) -> tuple[int, int]:
        """The child's state becomes a copy of the parent's: a spare of the family for a new child
        (its blocks taken from the family's reserve), its own for an existing one. Returns the
        (source, destination) first blocks of the copy."""
        if child_id not in self._held:
            root = self._root[parent_id]
            spares = self._spares.get(root)
            if not spares:
                raise RuntimeError(f"fork of {parent_id}: its family reserved no state for {child_id}")
            self._held[child_id] = spares.pop(0)
            self._num_spares -= 1
            if not spares:
                del self._spares[root]
            self._root[child_id] = root
        return self._held[parent_id][0], self._held[child_id][0]

    def keep_over(self, child_id: int) -> tuple[list[int], list[list[int]] | None, int]:
        """Take an existing child's state (and spares) out before its KV is freed by a fork over it."""
        return self._held.pop(child_id), self._spares.pop(child_id, None), self._root.pop(child_id)

    def put_back(self, child_id: int, kept: tuple[list[int], list[list[int]] | None, int]) -> None:
        blocks, spares, root = kept
        self._held[child_id], self._root[child_id] = blocks, root
        if spares is not None:
            self._spares[child_id] = spares

    def swap_out(self, seq_ids: Sequence[int]) -> int:
        """Remember the family's states (and its spares) and give their blocks back; the bytes moved
        to the host (the live states: the spares hold nothing yet)."""
        for seq_id in seq_ids:
            self._swapped[seq_id] = (self._root[seq_id], len(self._spares.get(seq_id, ())))
            self.release(seq_id, keep_for_refork=False)  # the whole family moves
        return len(seq_ids) * self.state_bytes

    def swap_in(self, seq_ids: Sequence[int]) -> int:
        """Take the family's states back; the bytes moved from the host."""
        for seq_id in seq_ids:
            root, num_spares = self._swapped.pop(seq_id)
            self._held[seq_id] = self.pool.take(self.blocks_per_state)
            self._root[seq_id] = root
            if num_spares:
                self._spares[seq_id] = [self.pool.take(self.blocks_per_state) for _ in range(num_spares)]
                self._num_spares += num_spares
        return len(seq_ids) * self.state_bytes

    def _give(self, blocks: list[int]) -> None:
        for block_id in blocks:
            self.pool.unref(block_id)

    # --- the ledger ------------------------------------------------------------------------------

    def ledger_parts(self) -> dict[str, int]:
        """What the states add to the KV's ledger (decode steps never change it): the live states
        (the state part), the spares' (reserved future), the rest of their blocks (internal), and
        all their blocks (the state group's split). Nothing without state groups."""
        if not self:
            return {}
        held_bytes = self.num_blocks_held * self.pool.block_bytes
        live, spare = len(self._held) * self.state_bytes, self._num_spares * self.state_bytes
        return {
            "state_bytes": live,
            "reserved_future_bytes": spare,
            "internal_bytes": held_bytes - live - spare,
            STATE_COLUMN: held_bytes,
        }


def with_states(led: MemoryLedger, parts: dict[str, int]) -> MemoryLedger:
    """The KV's ledger ``led`` with the states' ``parts`` (:meth:`StateBlocks.ledger_parts`) added."""
    if not parts:
        return led
    return MemoryLedger(
        led.budget_bytes,
        led.token_bytes,
        led.reserved_future_bytes + parts["reserved_future_bytes"],
        led.internal_bytes + parts["internal_bytes"],
        led.external_bytes,
        led.free_bytes,
        led.cached_bytes,
        (*led.group_bytes, (STATE_COLUMN, parts[STATE_COLUMN])),
        led.state_bytes + parts["state_bytes"],
    )


def with_state_columns(projection: DecodeProjection, parts: dict[str, int]) -> DecodeProjection:
    """A projection of the KV's decode steps with the states' ``parts`` (constant over the steps)
    added to each step's ledger; a ``state_bytes`` of 0 without them."""
    if not projection.num_steps:
        return projection
    steps = projection.num_steps
    ledgers = dict(projection.ledgers)
    as_lists = isinstance(ledgers["token_bytes"], list)  # a short projection's plain integers stay so
    for name, value in {"state_bytes": 0, **parts}.items():
        values = ledgers.get(name)
        if values is None:
            ledgers[name] = [value] * steps if as_lists else np.full(steps, value, dtype=np.int64)
        elif value:
            ledgers[name] = [v + value for v in values] if isinstance(values, list) else values + value
    return projection._replace(ledgers=ledgers)
