"""The memory ledger: where every byte of the KV budget is, at one instant.

:data:`LEDGER_FIELDS` is the one list of its parts; step tables, summaries and figures all derive
their columns from it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


#: init=False: the constructor below is written by hand (see its note); the rest (frozen, eq, hash,
#: repr, fields) is the dataclass's
@dataclass(frozen=True, init=False)
class MemoryLedger:
    """The budget split into seven parts that sum to ``budget_bytes``.

    - ``token_bytes``: slots holding a token's K/V state (a block shared by several sequences
      counts once).
    - ``reserved_future_bytes``: allocated slots a sequence will fill before it finishes.
    - ``internal_bytes``: allocated slots that will never be filled (reserve-to-S_max waste, the
      unused tail of a paged sequence's last block, a shared partly filled block's tail).
    - ``external_bytes``: free slots that the next waiting request cannot use (holes smaller than
      its reservation, budget left over below one slot or block).
    - ``free_bytes``: the remaining, usable free slots (holding nothing).
    - ``cached_bytes``: blocks no sequence holds that still keep a finished or preempted
      request's prompt KV for a later request to reuse (a prefix cache's evictable blocks). An
      allocation may take them (evicting the least recently used first), so for admission they
      count as free; they are reported apart so that "free" never hides what a cache keeps. 0 for
      allocators without a prefix cache.
    - ``state_bytes``: the fixed per-sequence state of a model's linear-attention layers (Qwen3.5's
      gated delta net: a recurrent and a conv state per layer), one per live sequence whatever its
      length, reserved at admission and freed with the sequence. What rounding a state up to the
      allocator's unit (a slot, a block, a page) adds is internal fragmentation, and a state
      reserved for a fan-out's branch not yet forked is reserved future. 0 for models without.

    ``group_bytes`` splits the allocated bytes (token + reserved future + internal) by KV-cache
    group kind for a model with several groups (hybrid paging of a sliding-window model):
    ``(("full_group_bytes", b1), ("window_group_bytes", b2), ("state_group_bytes", b3))``, in that
    order, summing to :attr:`allocated_bytes` (the state group's blocks hold the state, its rounding
    and its spares). Empty for a model whose layers form one group. It is a split of a part,
    not a part: it is not among :data:`LEDGER_FIELDS`.
    """

    budget_bytes: int
    token_bytes: int
    reserved_future_bytes: int
    internal_bytes: int
    external_bytes: int
    free_bytes: int
    #: last, with a default, so that the five-part constructor calls of allocators without a
    #: prefix cache stay valid (they report 0)
    cached_bytes: int = 0
    group_bytes: tuple[tuple[str, int], ...] = ()
    #: last, with a default, for the same reason as ``cached_bytes`` (0 without per-request state)
    state_bytes: int = 0

    def __init__(
        self,
        budget_bytes: int,
        token_bytes: int,
        reserved_future_bytes: int,
        internal_bytes: int,
        external_bytes: int,
        free_bytes: int,
        cached_bytes: int = 0,
        group_bytes: tuple[tuple[str, int], ...] = (),
        state_bytes: int = 0,
    ) -> None:
        # NOTE: the generated __init__ of a frozen dataclass sets each field through
        # object.__setattr__; writing the instance's dict, as that setattr would, is cheaper, and
        # the loop builds one or two ledgers a turn. Counted inside the loop under valgrind it saves
        # about 3,600 instructions a ledger (timed alone it promised far more). The signature is
        # the generated one's (tests/kvbench/core/test_ledger.py)
        values = self.__dict__
        values["budget_bytes"] = budget_bytes
        values["token_bytes"] = token_bytes
        values["reserved_future_bytes"] = reserved_future_bytes
        values["internal_bytes"] = internal_bytes
        values["external_bytes"] = external_bytes
        values["free_bytes"] = free_bytes
        values["cached_bytes"] = cached_bytes
        values["group_bytes"] = group_bytes
        values["state_bytes"] = state_bytes

    @classmethod
    def from_slots(
        cls,
        *,
        budget_bytes: int,
        kv_bytes_per_token: int,
        allocated_slots: int,
        token_slots: int,
        future_slots: int,
        external_bytes: int,
        free_bytes: int,
        cached_bytes: int = 0,
        group_bytes: tuple[tuple[str, int], ...] = (),
        state_bytes: int = 0,
        state_future_bytes: int = 0,
        state_held_bytes: int = 0,
    ) -> MemoryLedger:
        """Build a ledger from slot counts: allocated slots that hold no token and will never be
        filled are internal fragmentation. ``allocated_slots`` are the KV's alone: the live
        sequences' states are ``state_bytes``, the states reserved for a fan-out's branches not yet
        forked ``state_future_bytes`` (reserved future), and the memory held for both
        ``state_held_bytes`` (what rounding to the allocator's unit adds is internal too)."""
        return cls(  # (in field order, by position: a keyword costs a name lookup each)
            budget_bytes,
            token_slots * kv_bytes_per_token,
            future_slots * kv_bytes_per_token + state_future_bytes,
            (allocated_slots - token_slots - future_slots) * kv_bytes_per_token
            + (state_held_bytes - state_bytes - state_future_bytes),
            external_bytes,
            free_bytes,
            cached_bytes,
            group_bytes,
            state_bytes,
        )

    @property
    def total_bytes(self) -> int:
        return sum(getattr(self, name) for name in LEDGER_FIELDS)

    @property
    def allocated_bytes(self) -> int:
        """Bytes held by sequences: tokens, reserved future, internal fragmentation and state."""
        return self.token_bytes + self.reserved_future_bytes + self.internal_bytes + self.state_bytes


#: the ledger's parts in the order they stack up to the budget (cached on top of free; state last,
#: added after the others: files written before it have six parts)
LEDGER_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(MemoryLedger) if f.name not in ("budget_bytes", "group_bytes")
)
