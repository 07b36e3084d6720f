"""The allocator interface the scheduler talks to, and the memory ledger every allocator reports.

The scheduler never reaches into an allocator's internals: it asks through a handful of verbs
(``can_fit``, ``allocate``, ``append``, ``fork``, ``free``) and reads ``ledger`` once per step.
Running out of memory is an ordinary answer (``False``), not an exception; exceptions are for bad
input and broken invariants.

Units: allocators count *token slots* (one token's K and V in every layer); bytes are
``slots * kv_bytes_per_token``. Every allocator exposes each sequence's physical placement as a
block table in units of ``block_size_tokens`` (consecutive ids for a contiguous range), so any
paged kernel can read any allocator's cache.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple


class SeqShape(NamedTuple):
    """What an allocator may know about a sequence when sizing it.

    ``final_kv_tokens`` is the number of KV slots the sequence will hold when it finishes
    (prompt + output - 1: the last emitted token is never fed back). A real engine does not know
    it; kvbench uses it for the memory ledger (what is reserved but will never be used) and for
    the ``oracle``/``pow2`` reservation baselines of the vLLM paper, which assume it.
    """

    num_tokens: int  #: KV slots needed now (the prompt, or prompt + generated after a recompute)
    max_tokens: int  #: the request's declared S_max (prompt + output never exceed it)
    final_kv_tokens: int


@dataclass(frozen=True)
class MemoryLedger:
    """Where every byte of the KV budget is, at one instant. The six fields sum to ``budget_bytes``.

    - ``token_bytes``: slots holding a token's K/V state (a block shared by several sequences
      counts once).
    - ``reserved_future_bytes``: allocated slots a sequence will fill before it finishes.
    - ``internal_bytes``: allocated slots that will never be filled (reserve-to-S_max waste, the
      unused tail of a paged sequence's last block once it has finished growing).
    - ``external_bytes``: free slots that the next waiting request cannot use (holes smaller than
      its reservation, budget left over below one slot or block).
    - ``free_bytes``: the remaining free slots.
    """

    budget_bytes: int
    token_bytes: int
    reserved_future_bytes: int
    internal_bytes: int
    external_bytes: int
    free_bytes: int

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
    ) -> MemoryLedger:
        """Build a ledger from slot counts: allocated slots that hold no token and will never be
        filled are internal fragmentation."""
        return cls(
            budget_bytes=budget_bytes,
            token_bytes=token_slots * kv_bytes_per_token,
            reserved_future_bytes=future_slots * kv_bytes_per_token,
            internal_bytes=(allocated_slots - token_slots - future_slots) * kv_bytes_per_token,
            external_bytes=external_bytes,
            free_bytes=free_bytes,
        )

    @property
    def total_bytes(self) -> int:
        return (
            self.token_bytes
            + self.reserved_future_bytes
            + self.internal_bytes
            + self.external_bytes
            + self.free_bytes
        )


class Allocator(ABC):
    """A KV-cache allocator plugin.

    Subclasses set ``name`` (the ``conf/allocator/<name>.yaml`` it is selected by) and ``Config``
    (a dataclass of its options, with a ``validate()`` raising :class:`kvbench.errors.ConfigError`).
    """

    name: ClassVar[str]
    Config: ClassVar[type | None] = None
    #: False for allocators that reserve a sequence's whole future at admission: they never need
    #: headroom for growth, so the scheduler's watermark is not applied to them
    uses_watermark: ClassVar[bool] = True
    #: True when each sequence occupies one contiguous range (kernels then read it as a
    #: contiguous cache, and the simulator uses the kernel's contiguous efficiency)
    contiguous: ClassVar[bool] = False

    def __init__(self, config: Any, *, budget_bytes: int, kv_bytes_per_token: int) -> None:
        self.config = config
        self.budget_bytes = int(budget_bytes)
        self.kv_bytes_per_token = int(kv_bytes_per_token)

    # --- sizing ----------------------------------------------------------------------------------

    @property
    @abstractmethod
    def block_size_tokens(self) -> int:
        """Tokens per entry of :meth:`block_table`."""

    @abstractmethod
    def max_sequence_tokens(self, shape: SeqShape) -> int:
        """Most KV slots one sequence of this shape could ever hold in an empty cache.

        The engine rejects a workload up front (with a clear message) when a request's
        ``final_kv_tokens`` exceeds this, instead of letting it wait forever.
        """

    # --- verbs -----------------------------------------------------------------------------------

    @abstractmethod
    def can_fit(self, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        """Whether :meth:`allocate` would succeed for this shape now (changes nothing)."""

    @abstractmethod
    def allocate(self, seq_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        """Give a new sequence room for ``shape.num_tokens`` slots (and whatever it reserves).

        ``keep_free_bytes`` is the scheduler's watermark: on-demand allocators refuse when fewer
        than that many bytes would stay free; allocators that reserve the sequence's whole future
        at admission ignore it. Returns ``False`` (changing nothing) when it does not fit.
        """

    @abstractmethod
    def append(self, seq_id: int) -> bool:
        """Make room for one more token of ``seq_id``; ``False`` (changing nothing) when out of memory.

        For a paged allocator this is where a new block is taken, or where a shared last block is
        copied first (copy-on-write).
        """

    @abstractmethod
    def fork(self, parent_id: int, child_id: int, child_final_kv_tokens: int | None = None) -> bool:
        """Create ``child_id`` holding the same tokens as ``parent_id``.

        Paged allocators share the parent's blocks (reference counts); contiguous ones copy into a
        new reservation. ``False`` (changing nothing) when there is no room.
        """

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Release everything ``seq_id`` holds. Freeing an unknown id is a bug (``KeyError``)."""

    # --- views -----------------------------------------------------------------------------------

    @abstractmethod
    def num_tokens(self, seq_id: int) -> int:
        """KV slots ``seq_id`` holds now."""

    @abstractmethod
    def block_table(self, seq_id: int) -> list[int]:
        """Physical block ids of ``seq_id`` in logical order, ``block_size_tokens`` slots each."""

    @abstractmethod
    def ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        """The memory breakdown now; ``next_shape`` (the head of the waiting queue) defines which
        free bytes are externally fragmented. Cheap: called once per simulated step."""

    def free_bytes(self) -> int:
        """Bytes not allocated to any sequence (free + externally fragmented)."""
        led = self.ledger()
        return led.free_bytes + led.external_bytes

    def reservation_tokens(self, shape: SeqShape) -> int:
        """Slots :meth:`allocate` would take for this shape (what a refused request asked for)."""
        return shape.num_tokens
