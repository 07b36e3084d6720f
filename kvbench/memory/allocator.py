"""The allocator interface the scheduler talks to.

The scheduler never reaches into an allocator's internals: it asks through a handful of verbs
(``allocate``, ``append``, ``truncate``, ``fork``, ``free``, and ``swap_out``/``swap_in`` where
declared) and reads ``ledger`` once per step. Running out of memory is an ordinary answer (``None`` /
``False``), not an exception; exceptions are for bad input and broken invariants.

Units: allocators count *token slots* (one token's K and V in every layer); bytes are
``slots * kv_bytes_per_token``. A model with linear-attention layers also keeps a fixed state per
sequence (``state_bytes_per_request``, the ledger's ``state_bytes``): an allocator reserves it at
admission with the sequence's first slots (all or nothing), frees it with the sequence, moves it
with a swap and copies it on a fork (each branch has its own: a fan-out reserves one per branch at
admission, as it does its branches' ranges). Every allocator exposes each sequence's physical placement as a
block table in units of ``block_size_tokens`` (consecutive ids for a contiguous range), so any
paged kernel can read any allocator's cache.

Work that costs GPU time is never hidden: a copy the allocator makes (copy-on-write of a shared
block, a contiguous fork copying its parent's tokens) is queued as a :class:`KVCopy` that the
scheduler drains into the step plan, and a swap returns the :class:`Transfer` it performed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.core.kv import (
    NO_PROJECTION,
    DecodeProjection,
    Footprint,
    KVCopy,
    PageMapping,
    Refusal,
    SeqShape,
    Transfer,
)
from kvbench.core.ledger import MemoryLedger

#: the interface: the allocator base class, its capabilities, and the value types its verbs take
#: and return (defined in :mod:`kvbench.core.kv`, the ground floor)
__all__ = [
    "NO_PROJECTION",
    "Allocator",
    "AllocatorCapabilities",
    "DecodeProjection",
    "Footprint",
    "KVCopy",
    "MemoryLedger",
    "PageMapping",
    "Refusal",
    "SeqShape",
    "Transfer",
]


@dataclass(frozen=True)
class AllocatorCapabilities:
    """What an allocator can do beyond the required verbs; the scheduler reads these, never probes."""

    #: reserves a sequence's whole future at admission: growth never takes memory, so the
    #: scheduler's watermark (headroom for growth) is not applied to it
    reserves_future: bool = False
    #: each sequence is one contiguous range (kernels read it as a contiguous cache; the simulator
    #: uses the kernel's contiguous efficiency)
    contiguous_layout: bool = False
    #: fork shares blocks by reference count (``refcount`` is meaningful); otherwise every block
    #: is in exactly one block table
    shares_blocks: bool = False
    #: implements ``swap_out``/``swap_in`` (a swap preemption falls back to recompute otherwise)
    can_swap: bool = False
    #: implements ``project_decode`` exactly, so the engine can advance runs of decode-only steps
    #: in one computation (without it every step is simulated one by one, with identical results)
    projects_decode: bool = False
    #: keeps full prompt blocks across requests (a prefix cache): ``allocate`` may answer that
    #: some leading tokens are already cached, and :meth:`Allocator.num_cached_tokens` says how
    #: many before the scheduler sizes the first chunk. Set per instance (it is an option)
    caches_prefixes: bool = False
    #: with ``caches_prefixes``: also keys a one-sequence request's own blocks past any shared
    #: prefix, generated tokens included (vLLM hashes every full block), so a request without
    #: prefix hashes still finds its own blocks again after a recompute preemption. Set per instance
    caches_own_blocks: bool = False
    #: with ``caches_prefixes``: a block computed with content another block already holds keeps
    #: the key too (vLLM's BlockPool does not de-duplicate), so a key may have several blocks; a
    #: lookup takes the earliest still cached. Set per instance
    caches_duplicate_blocks: bool = False
    #: maps physical pages into virtual ranges as sequences grow (vAttention), work that takes
    #: time: the scheduler puts :meth:`Allocator.drain_page_mapping` in each step plan
    maps_pages: bool = False
    #: with ``projects_decode``: a run of decode steps may give memory back (a sliding window frees
    #: the blocks it moves past), so a request refused before the run may fit during it; the
    #: scheduler then cuts a projected run before its free and cached bytes rise above what the
    #: step's decisions saw (an allocator without it only takes memory while decoding)
    frees_during_decode: bool = False


class Allocator(ABC):
    """A KV-cache allocator plugin.

    Subclasses set ``name`` (the ``conf/allocator/<name>.yaml`` it is selected by), ``Config`` (a
    dataclass of its options, with a ``validate()`` raising :class:`kvbench.errors.ConfigError`)
    and ``capabilities``.
    """

    name: ClassVar[str]
    Config: ClassVar[type | None] = None
    capabilities: ClassVar[AllocatorCapabilities] = AllocatorCapabilities()

    def __init__(
        self, config: Any, *, budget_bytes: int, kv_bytes_per_token: int, state_bytes_per_request: int = 0
    ) -> None:
        self.config = config
        self.budget_bytes = int(budget_bytes)
        self.kv_bytes_per_token = int(kv_bytes_per_token)
        #: the fixed state one sequence keeps beside its KV (linear-attention layers; 0: none)
        self.state_bytes_per_request = int(state_bytes_per_request)
        if self.state_bytes_per_request < 0:
            raise ValueError(f"state_bytes_per_request={state_bytes_per_request} is negative")
        self._pending_copies: list[KVCopy] = []

    # --- sizing ----------------------------------------------------------------------------------

    @property
    @abstractmethod
    def block_size_tokens(self) -> int:
        """Tokens per entry of :meth:`block_table`."""

    @abstractmethod
    def max_sequence_tokens(self, shape: SeqShape) -> int:
        """Most KV slots one sequence of this shape could ever hold in an empty cache."""

    def fits_in_empty(self, shape: SeqShape) -> bool:
        """Whether a request of this shape, with all its branches at their final length at once,
        fits an empty cache. The engine rejects a workload up front when it does not, instead of
        letting the request wait forever. The default checks one sequence."""
        return shape.final_kv_tokens <= self.max_sequence_tokens(shape)

    def reservation_tokens(self, shape: SeqShape) -> int:
        """Slots :meth:`allocate` would take for this shape (what a refused request asked for)."""
        return shape.num_tokens

    # --- verbs -----------------------------------------------------------------------------------

    @abstractmethod
    def allocate(self, seq_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> int | None:
        """Give a new sequence room for ``shape.num_tokens`` slots (and whatever it reserves).

        ``keep_free_bytes`` is the scheduler's watermark: allocators that allocate on demand
        refuse when fewer than that many bytes would stay free; those that reserve the whole
        future ignore it. Returns how many of the leading tokens are already cached (their KV is
        reused, not computed: always 0 without ``caches_prefixes``; never more than
        ``min(prompt_tokens, num_tokens - 1)``, or ``num_tokens - 1`` with ``caches_own_blocks``, so at
        least one token is computed and yields
        logits), or ``None`` (changing nothing) when it does not fit; :meth:`refusal_reason`
        then says why. The slots held afterwards are ``shape.num_tokens`` whatever the answer:
        the scheduler asks for the cached tokens plus the chunk it computes now.
        """

    def can_allocate(self, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        """Whether :meth:`allocate` of ``shape`` would succeed now, changing nothing (the
        scheduler's whole-prompt admission asks this for a request's every known token before it
        allocates only a first chunk). The default compares :meth:`reservation_tokens` with the
        unallocated bytes; an allocator with placement constraints or a cache overrides it."""
        need_bytes = self.reservation_tokens(shape) * self.kv_bytes_per_token + keep_free_bytes
        return need_bytes <= self.unallocated_bytes()

    def can_readmit_branches(self, prompt_tokens: int, branch_tokens: Sequence[int], keep_free_bytes: int = 0) -> bool:
        """Whether a fan-out preempted after its branches emitted tokens surely fits if readmitted
        now: its prompt, then each branch grown to ``branch_tokens``. The scheduler asks before a
        readmission under a prefix cache, which must not start one it would take back. The default
        counts every branch's tokens as its own (no sharing), a bound an allocator may tighten."""
        need_bytes = sum(branch_tokens) * self.kv_bytes_per_token + keep_free_bytes
        return need_bytes <= self.unallocated_bytes()

    def num_cached_tokens(self, shape: SeqShape) -> int:
        """What :meth:`allocate` of ``shape`` would answer now, changing nothing (``caches_prefixes``):
        the scheduler asks first, with ``shape.num_tokens`` the sequence's whole length, so that it
        charges its first chunk only for the tokens not served from the cache."""
        return 0

    @abstractmethod
    def refusal_reason(self, shape: SeqShape, keep_free_bytes: int = 0) -> Refusal:
        """Why :meth:`allocate` refuses ``shape`` now (only meaningful when it does)."""

    @abstractmethod
    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Make room for ``num_tokens`` more tokens of ``seq_id``, all or nothing.

        ``False`` (changing nothing) when out of memory. For a paged allocator this is where new
        blocks are taken, or where a shared last block is copied first (copy-on-write, queued as a
        :class:`KVCopy`).
        """

    def append_each(self, seq_ids: Sequence[int], num_tokens: int) -> int:
        """:meth:`append` of ``num_tokens`` to each of ``seq_ids`` in turn, stopping at the first
        that does not fit (changing nothing for it and those after). Returns how many fitted.

        The scheduler grows the batch this way: a run of decode steps (every sequence by the run's
        length), and a decode step's one-sequence requests (a token each). An allocator may do it
        in one pass, with the same result as the appends one by one: the same block tables,
        totals and copies (the conformance suite compares the two)."""
        append = self.append
        for done, seq_id in enumerate(seq_ids):
            if not append(seq_id, num_tokens):
                return done
        return len(seq_ids)

    @abstractmethod
    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep only the first ``num_tokens`` tokens of ``seq_id``, giving back blocks no longer
        needed: growth the scheduler took and then did not use (a request preempted halfway
        through its step). Cutting into a block shared with another sequence is a bug."""

    @abstractmethod
    def fork(self, parent_id: int, child_id: int, child_final_kv_tokens: int | None = None) -> None:
        """Make ``child_id`` hold the same tokens as ``parent_id``; it never needs memory.

        A new ``child_id`` must be one of the ``num_branches - 1`` branches its family reserved at
        admission: paged allocators share the parent's blocks (reference counts); contiguous ones
        copy the parent's tokens into a range reserved then (a queued :class:`KVCopy`).
        """

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Release everything ``seq_id`` holds. Freeing an unknown id is a bug (``KeyError``)."""

    def swap_out(self, seq_ids: Sequence[int]) -> Transfer:
        """Move these sequences' KV to host memory and free their device memory (``can_swap``).

        Blocks shared among them move once. They stay known to the allocator until
        :meth:`swap_in` brings them back with the same tokens and the same sharing.
        """
        raise NotImplementedError(f"allocator {self.name!r} cannot swap")

    def swap_in(self, seq_ids: Sequence[int], keep_free_bytes: int = 0) -> Transfer | None:
        """Bring swapped-out sequences back (``can_swap``); ``None`` (changing nothing) when they do not fit."""
        raise NotImplementedError(f"allocator {self.name!r} cannot swap")

    def drain_page_mapping(self) -> PageMapping:
        """The pages mapped since the last call (``maps_pages``)."""
        raise NotImplementedError(f"allocator {self.name!r} maps no pages")

    def drain_copies(self) -> list[KVCopy]:
        """The copies made since the last call (the scheduler puts them in the step plan)."""
        copies, self._pending_copies = self._pending_copies, []
        return copies

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

    @abstractmethod
    def footprint(self, seq_ids: Sequence[int]) -> Footprint:
        """What evicting these sequences together would free, and what swapping them would move."""

    def state_held_bytes(self) -> int:
        """Bytes held for per-request states now: every live sequence's, those reserved for a
        fan-out's unforked branches, and their rounding to the allocator's unit (0 without state).
        A view for checks: the ledger's state part is the live states alone."""
        return 0

    def refcount(self, block_id: int) -> int:
        """How many live sequences hold ``block_id`` (meaningful when ``shares_blocks``)."""
        raise NotImplementedError(f"allocator {self.name!r} does not share blocks")

    def num_shared_blocks(self) -> int:
        """Blocks held by two or more live sequences now (0 when ``shares_blocks`` is false). Cheap:
        read once per step."""
        return 0

    def shared_bytes_saved(self) -> int:
        """Bytes that sharing saves now: what the live sequences' block tables address beyond the
        blocks allocated, i.e. each shared block's bytes once per holder after the first. Allocated
        bytes plus this is the KV the same sequences would hold with nothing shared. Constant over
        a run of decode-only steps (only forks, copies, hits and frees change it). Cheap."""
        return 0

    def cached_block_ids(self) -> list[int]:
        """Blocks no sequence holds that keep a prefix-cache key, the next to be evicted first
        (``caches_prefixes``; a view for checks)."""
        raise NotImplementedError(f"allocator {self.name!r} has no prefix cache")

    def block_key(self, block_id: int) -> tuple[int, int] | None:
        """The prefix-cache key ``block_id`` holds, or None (``caches_prefixes``; a view for checks)."""
        raise NotImplementedError(f"allocator {self.name!r} has no prefix cache")

    def largest_hole_bytes(self) -> int:
        """The largest free range a single reservation could take; without placement constraints,
        every usable free byte."""
        return self.ledger().free_bytes

    def unallocated_bytes(self) -> int:
        """Bytes not allocated to any sequence (usable free + externally fragmented + cached but
        evictable, which an allocation may take)."""
        led = self.ledger()
        return led.free_bytes + led.external_bytes + led.cached_bytes

    def project_decode(
        self, seq_ids: Sequence[int], max_steps: int, next_shape: SeqShape | None = None
    ) -> DecodeProjection:
        """Up to ``max_steps`` decode steps of ``seq_ids`` (``projects_decode``); see
        :class:`DecodeProjection`. The default projects nothing, so the engine takes every step
        one by one."""
        return NO_PROJECTION
