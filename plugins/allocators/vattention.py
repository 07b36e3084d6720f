"""vAttention's allocator: each sequence's KV is virtually contiguous, backed by physical pages
mapped on demand (Prabhu et al., "vAttention: Dynamic Memory Management for Serving LLMs without
PagedAttention", ASPLOS '25; code: microsoft/vattention).

At start-up vAttention reserves, for every request slot, a virtual range of S_max tokens in each
of the model's ``2 * num_layers`` K and V buffers (one tensor per layer and per K/V), and maps
physical memory into a range only as its sequence grows, through the CUDA virtual memory API
(``cuMemMap`` of physical pages). The attention kernel then reads each sequence as one contiguous
range: no block table, so non-paged kernels run unchanged.

How kvbench counts it:

- *pages and page groups*. A page is ``page_size_bytes`` of one layer's K (or V) buffer, so it
  holds ``tokens_per_page = page_size_bytes / (kv_bytes_per_token / (2 * num_layers))`` tokens.
  A sequence's tokens fill the same positions of all ``2L`` buffers, so it maps pages ``2L`` at a
  time: a *page group* (``tokens_per_page`` tokens of every layer's K and V). A sequence of ``n``
  tokens holds ``ceil(n / tokens_per_page)`` groups; the unfilled tail of its last group, in
  every layer's buffer, is internal fragmentation (2 MB pages: up to 255 tokens of Llama-2-7B per
  sequence). The physical pool is ``budget // (page_size_bytes * 2L)`` groups; what is left below
  one group is external, forever. Freed groups go back to the pool and are mapped again by the
  next sequence that grows (vAttention returns a finished request's pages for reuse).
- *block table*. ``block_size_tokens`` is ``tokens_per_page``; a sequence's table is the run of
  consecutive *virtual* page ids of its mapped part (its range is reserved once and never moves),
  so ``contiguous_layout`` is true and the simulator prices the contiguous kernel.
- *virtual reservation*. Each sequence's range holds its request's declared S_max (rounded up to
  whole pages), or ``max_model_len_tokens`` when set (one size for every slot, as vAttention's
  per-slot buffers); a sequence can never grow past it. Virtual address space itself is not a
  limit (64-bit): ranges are handed out by a bump pointer and never reused.
- *mapping cost*. Every group mapped (``allocate``, growth, ``swap_in``) is counted;
  :meth:`drain_page_mapping` hands the scheduler the pages mapped since the last call with their
  price (``2L`` pages per group, ``page_map_latency_s`` each) and whether they were mapped ahead
  (``map_ahead``: overlapped with the step's compute, so only the part longer than the step adds
  time) or on the critical path.
- *fork*. vAttention shares no physical page between two ranges (the paper does no
  copy-on-write and leaves parallel sampling and beam search out), so a fork *copies* the
  parent's tokens into the child's range (a queued :class:`KVCopy`, as the contiguous allocators
  do). A fork must never need memory, and any branch may later be overwritten by a longer one
  (beam search), so a fan-out request (``num_branches > 1``) maps every branch's whole virtual
  range at admission, as the contiguous baselines reserve theirs: honest about what vAttention
  cannot share, and costly. One-sequence requests, the common case, map on demand.
- *swap* moves each sequence's tokens to the host in one run and unmaps its groups; ``swap_in``
  maps fresh groups (counted as mapped) and copies the tokens back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench import hookimpl
from kvbench.core.kv import NO_PROJECTION, DecodeProjection, Footprint, KVCopy, PageMapping, Refusal, SeqShape, Transfer
from kvbench.core.ledger import MemoryLedger
from kvbench.errors import ConfigError, require
from kvbench.memory.allocator import Allocator, AllocatorCapabilities

KIB = 1024
MIB = 1024 * KIB
#: the page sizes vAttention maps: 2 MB is what the stock CUDA driver's cuMemMap gives; 64 KB and
#: 256 KB need vAttention's modified driver (its UVM-backed smaller pages)
PAGE_SIZES_BYTES = (64 * KIB, 256 * KIB, 2 * MIB)

#: Seconds to map one physical page into a virtual range. An assumption, not a measurement: the
#: per-page latencies of the calls a mapping needs once physical handles are pooled (``cuMemMap`` +
#: ``cuMemSetAccess``) could not be checked here, in the vAttention paper or on a GPU. 40 us is an
#: assumed order of magnitude; the README shows how the 64 KiB results move with it. Set a measured value with
#: ``allocator.page_map_latency_s``.
DEFAULT_PAGE_MAP_LATENCY_S = 40e-6


@dataclass
class VAttentionConfig:
    #: bytes of one physical page of one layer's K or V buffer: 65536, 262144 or 2097152
    page_size_bytes: int = 2 * MIB
    #: true: map the next step's pages in the background while this step computes (vAttention's
    #: default), so mapping only adds the time it takes beyond the step; false: on the critical path
    map_ahead: bool = True
    #: seconds to map one page (see DEFAULT_PAGE_MAP_LATENCY_S for where the default comes from)
    page_map_latency_s: float = DEFAULT_PAGE_MAP_LATENCY_S
    #: the model's layers (each has a K and a V buffer); the config file takes the model's
    num_layers: int | None = None
    #: every sequence's virtual range in tokens (vLLM's max_model_len); null: its request's S_max
    max_model_len_tokens: int | None = None

    def validate(self) -> None:
        require(
            self.page_size_bytes in PAGE_SIZES_BYTES,
            "allocator.page_size_bytes",
            self.page_size_bytes,
            "choose one of 65536 (64 KiB), 262144 (256 KiB), 2097152 (2 MiB)",
        )
        require(isinstance(self.map_ahead, bool), "allocator.map_ahead", self.map_ahead, "use true or false")
        latency = self.page_map_latency_s
        require(
            isinstance(latency, (int, float)) and not isinstance(latency, bool) and latency >= 0,
            "allocator.page_map_latency_s",
            latency,
            "use seconds >= 0",
        )
        layers = self.num_layers
        require(
            isinstance(layers, int) and not isinstance(layers, bool) and layers >= 1,
            "allocator.num_layers",
            layers,
            "use the model's number of layers (an integer >= 1)",
        )
        limit = self.max_model_len_tokens
        require(
            limit is None or (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1),
            "allocator.max_model_len_tokens",
            limit,
            "use null (each request's S_max) or an integer >= 1",
        )


@dataclass(frozen=True)
class PageGeometry:
    """How pages, tokens and bytes relate for one model (all derived, never typed in)."""

    page_size_bytes: int
    #: K and V buffers a token has a slot in: 2 per layer
    num_buffers: int
    #: tokens one page of one buffer holds
    tokens_per_page: int
    #: bytes of one page group: a page in every buffer
    group_bytes: int

    @classmethod
    def of(cls, page_size_bytes: int, kv_bytes_per_token: int, num_layers: int) -> PageGeometry:
        num_buffers = 2 * num_layers
        tokens_per_page = page_size_bytes * num_buffers // kv_bytes_per_token if kv_bytes_per_token else 0
        if tokens_per_page < 1:
            raise ConfigError(
                f"allocator.page_size_bytes={page_size_bytes!r} is invalid: one token's K of one layer "
                f"({kv_bytes_per_token / num_buffers:g} bytes) does not fit a page"
            )
        return cls(page_size_bytes, num_buffers, tokens_per_page, page_size_bytes * num_buffers)


class _Family:
    """A request's sequences: each holds ``num_groups`` groups, as does each unforked branch."""

    __slots__ = ("members", "num_spares", "spare_final", "num_groups", "pinned", "future_slots")

    def __init__(self, members: list[int], num_spares: int, spare_final: int, num_groups: int, pinned: bool) -> None:
        self.members = members
        self.num_spares = num_spares
        self.spare_final = spare_final
        self.num_groups = num_groups
        #: a fan-out: every range is mapped whole at admission and never shrinks (see ``fork``)
        self.pinned = pinned
        #: this family's share of reserved_future (slots), kept so that the ledger stays O(1)
        self.future_slots = 0

    @property
    def num_holders(self) -> int:
        return len(self.members) + self.num_spares


class VAttentionAllocator(Allocator):
    """Virtually contiguous per-sequence ranges, physical page groups mapped on demand."""

    name = "vattention"
    Config = VAttentionConfig
    capabilities = AllocatorCapabilities(
        contiguous_layout=True, shares_blocks=False, can_swap=True, projects_decode=True, maps_pages=True
    )

    def __init__(
        self,
        config: VAttentionConfig | None = None,
        *,
        budget_bytes: int,
        kv_bytes_per_token: int,
        geometry: PageGeometry | None = None,
    ) -> None:
        """``geometry`` replaces the one derived from the config (tests use tiny pages)."""
        super().__init__(
            config or VAttentionConfig(num_layers=1), budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token
        )
        if geometry is None:
            geometry = PageGeometry.of(self.config.page_size_bytes, self.kv_bytes_per_token, self.config.num_layers)
        self.geometry = geometry
        self.tokens_per_page = geometry.tokens_per_page
        self.group_bytes = geometry.group_bytes
        #: bytes of every group no token slot covers (0 when a token's bytes per buffer divide the page)
        self.group_slack_bytes = geometry.group_bytes - geometry.tokens_per_page * self.kv_bytes_per_token
        if self.group_slack_bytes < 0:
            raise ValueError("a page group cannot hold more token bytes than it has")
        self.num_groups = self.budget_bytes // self.group_bytes
        self._remainder_bytes = self.budget_bytes - self.num_groups * self.group_bytes
        self._page_map_latency_s = float(self.config.page_map_latency_s)
        self._map_ahead = bool(self.config.map_ahead)
        # Physical page groups are counted, not named, and so not taken from a BlockPool
        # (kvbench.memory.block_pool, which paged and hybrid_paged share): a sequence's address is
        # its virtual range (the block table is virtual pages), so which physical group backs it
        # is never read; no group is shared, keyed or cached; a fork copies. A pool would keep a
        # free stack of ids that nothing reads and cost a list operation per group mapped.
        self._num_free_groups = self.num_groups
        self._num_held_groups = 0
        self._num_token_slots = 0
        self._num_future_slots = 0
        self._tokens: dict[int, int] = {}
        self._final: dict[int, int] = {}
        self._family_of: dict[int, int] = {}  # seq -> its family's key (the seq it was admitted as)
        self._families: dict[int, _Family] = {}
        self._vstart: dict[int, int] = {}  # seq -> first virtual page of its range
        self._range_tokens: dict[int, int] = {}  # seq -> tokens its virtual range holds
        self._next_vpage = 0  # virtual address space: a bump pointer (64-bit VA is never short)
        # swapped-out families: key -> (members as (seq, tokens, final, range tokens), spares, spare final)
        self._swapped: dict[int, tuple[list[tuple[int, int, int, int]], int, int, bool]] = {}
        self._swapped_family: dict[int, int] = {}  # swapped-out seq -> its family's key
        #: page groups mapped so far (each is ``geometry.num_buffers`` pages)
        self.num_groups_mapped = 0
        self._groups_to_drain = 0

    # --- sizing ----------------------------------------------------------------------------------

    @property
    def block_size_tokens(self) -> int:
        return self.tokens_per_page

    def groups_for(self, num_tokens: int) -> int:
        """Page groups ``num_tokens`` tokens fill (the last one partly)."""
        return -(-num_tokens // self.tokens_per_page)

    def range_tokens(self, shape: SeqShape) -> int:
        """Tokens one sequence's virtual range holds: S_max (or max_model_len), in whole pages."""
        limit = self.config.max_model_len_tokens
        tokens = shape.s_max_tokens if limit is None else limit
        return self.groups_for(max(tokens, 1)) * self.tokens_per_page

    def max_sequence_tokens(self, shape: SeqShape) -> int:
        """Its virtual range, or the whole pool when that is smaller."""
        return min(self.range_tokens(shape), self.num_groups * self.tokens_per_page)

    def fits_in_empty(self, shape: SeqShape) -> bool:
        """Its final length within its range, and its groups (a fan-out's whole ranges) in the pool."""
        return (
            shape.final_kv_tokens <= self.range_tokens(shape)
            and (
                self.groups_for(shape.final_kv_tokens) if shape.num_branches == 1 else self._groups_at_admission(shape)
            )
            <= self.num_groups
        )

    def reservation_tokens(self, shape: SeqShape) -> int:
        """The prompt's groups (a fan-out: every branch's whole range)."""
        return self._groups_at_admission(shape) * self.tokens_per_page

    def can_allocate(self, shape: SeqShape, keep_free_bytes: int = 0) -> bool:
        if shape.num_tokens > self.range_tokens(shape):
            return False
        return self._can_take(self._groups_at_admission(shape), keep_free_bytes)

    def _groups_at_admission(self, shape: SeqShape) -> int:
        if shape.num_branches == 1:
            return self.groups_for(shape.num_tokens)
        return self.groups_for(self.range_tokens(shape)) * shape.num_branches

    # --- verbs -----------------------------------------------------------------------------------

    def allocate(self, seq_id: int, shape: SeqShape, keep_free_bytes: int = 0) -> int | None:
        """Reserve the sequence's virtual range and map the groups its ``num_tokens`` fill, once
        per branch; ``None`` (changing nothing) when they and the watermark are not free."""
        if seq_id in self._tokens or seq_id in self._swapped_family:
            raise ValueError(f"sequence {seq_id} is already allocated")
        if not self.can_allocate(shape, keep_free_bytes):
            return None
        pinned = shape.num_branches > 1
        num_groups = self.groups_for(self.range_tokens(shape) if pinned else shape.num_tokens)
        family = _Family([], shape.num_branches - 1, shape.final_kv_tokens, num_groups, pinned)
        self._families[seq_id] = family
        self._take(num_groups * shape.num_branches)
        self._add_member(seq_id, seq_id, shape.num_tokens, shape.final_kv_tokens, self.range_tokens(shape))
        self._refresh_future(family)
        return 0

    def refusal_reason(self, shape: SeqShape, keep_free_bytes: int = 0) -> Refusal:
        """Too few free groups, or enough but fewer than the watermark would leave (any free
        group serves anyone: never fragmented)."""
        need = self._groups_at_admission(shape)
        return Refusal.NO_MEMORY if need > self._num_free_groups else Refusal.WATERMARK

    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Grow within the mapped tail, or map the groups the family's new longest length needs
        (for every sequence and unforked branch of the family); ``False`` when they are not free
        or the sequence would outgrow its virtual range."""
        tokens = self._tokens[seq_id]
        new_tokens = tokens + num_tokens
        if new_tokens > self._range_tokens[seq_id]:
            return False
        family = self._families[self._family_of[seq_id]]
        new_groups = self.groups_for(new_tokens)
        if new_groups > family.num_groups:
            need = (new_groups - family.num_groups) * family.num_holders
            if need > self._num_free_groups:
                return False
            self._take(need)
            family.num_groups = new_groups
        self._tokens[seq_id] = new_tokens
        self._num_token_slots += num_tokens
        self._refresh_future(family)
        return True

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` tokens; groups no sequence of the family needs any more
        are unmapped."""
        tokens = self._tokens[seq_id]
        if not 0 <= num_tokens <= tokens:
            raise ValueError(f"cannot truncate sequence {seq_id} from {tokens} to {num_tokens} tokens")
        self._tokens[seq_id] = num_tokens
        self._num_token_slots -= tokens - num_tokens
        family = self._families[self._family_of[seq_id]]
        self._shrink(family)
        self._refresh_future(family)

    def fork(self, parent_id: int, child_id: int, child_final_kv_tokens: int | None = None) -> None:
        """Copy the parent's tokens into the child's range (a queued copy); a new child takes one
        of the family's unforked branches, whose groups are already mapped. Never maps memory."""
        tokens = self._tokens[parent_id]
        key = self._family_of[parent_id]
        family = self._families[key]
        final = self._final[parent_id] if child_final_kv_tokens is None else child_final_kv_tokens
        if child_id in self._tokens:
            if self._family_of[child_id] != key:
                raise ValueError(f"fork of {parent_id} over {child_id}: they belong to different requests")
            self._num_token_slots += tokens - self._tokens[child_id]
            self._tokens[child_id] = tokens
            self._final[child_id] = final
            # (a child that was the longest keeps its groups mapped: the parent's table must not change)
        else:
            if not family.num_spares:
                raise RuntimeError(f"fork of {parent_id}: its family reserved no branch for {child_id}")
            family.num_spares -= 1
            self._add_member(child_id, key, tokens, final, self._range_tokens[parent_id])
        self._refresh_future(family)
        if tokens:
            num_groups = self.groups_for(tokens)
            src, dst = self._vstart[parent_id], self._vstart[child_id]
            self._pending_copies.append(KVCopy(src, dst, num_groups, tokens * self.kv_bytes_per_token))

    def free(self, seq_id: int) -> None:
        """Unmap the sequence's groups (and, for the sequence its request was admitted as, the
        branches it never forked into); the rest of the family keeps only what it still needs."""
        tokens = self._tokens.pop(seq_id)  # KeyError for an unknown id: a bug, reported loudly
        key = self._family_of.pop(seq_id)
        del self._final[seq_id], self._vstart[seq_id], self._range_tokens[seq_id]
        self._num_token_slots -= tokens
        family = self._families[key]
        family.members.remove(seq_id)
        self._give(family.num_groups)
        if seq_id == key and family.num_spares:
            self._give(family.num_groups * family.num_spares)
            family.num_spares = 0
        if not family.members:
            self._num_future_slots -= family.future_slots
            del self._families[key]
            return
        self._shrink(family)
        self._refresh_future(family)

    def swap_out(self, seq_ids: Sequence[int]) -> Transfer:
        """Copy each sequence's tokens to the host (one run each) and unmap every group of their
        families (the unforked branches too: they come back with them)."""
        keys = self._families_of(seq_ids)
        transfer = self.footprint(seq_ids).transfer
        for key in keys:
            family = self._families[key]
            members = [(s, self._tokens[s], self._final[s], self._range_tokens[s]) for s in family.members]
            record = (members, family.num_spares, family.spare_final, family.pinned)
            for seq_id, *_ in members:
                self.free(seq_id)
                self._swapped_family[seq_id] = key
            self._swapped[key] = record
        return transfer

    def swap_in(self, seq_ids: Sequence[int], keep_free_bytes: int = 0) -> Transfer | None:
        """Map fresh groups for the families (all or nothing, the watermark kept) and copy the
        tokens back."""
        keys = list(dict.fromkeys(self._swapped_family[s] for s in seq_ids))
        need = 0
        for key in keys:
            members, num_spares, _, pinned = self._swapped[key]
            need += self._swapped_groups(members, pinned) * (len(members) + num_spares)
        if not self._can_take(need, keep_free_bytes):
            return None
        num_bytes = num_runs = 0
        for key in keys:
            members, num_spares, spare_final, pinned = self._swapped.pop(key)
            num_groups = self._swapped_groups(members, pinned)
            family = _Family([], num_spares, spare_final, num_groups, pinned)
            self._families[key] = family
            self._take(num_groups * (len(members) + num_spares))
            for seq_id, tokens, final, range_tokens in members:
                del self._swapped_family[seq_id]
                self._add_member(seq_id, key, tokens, final, range_tokens)
                num_bytes += tokens * self.kv_bytes_per_token
                num_runs += 1 if tokens else 0
            self._refresh_future(family)
        return Transfer(num_bytes, num_runs)

    # --- the mapping work ------------------------------------------------------------------------

    def drain_page_mapping(self) -> PageMapping:
        """Pages mapped since the last call, their price per page, and whether mapped ahead."""
        groups, self._groups_to_drain = self._groups_to_drain, 0
        return PageMapping(groups * self.geometry.num_buffers, self._page_map_latency_s, self._map_ahead)

    # --- views -----------------------------------------------------------------------------------

    def num_tokens(self, seq_id: int) -> int:
        return self._tokens[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        """The virtual pages of the sequence's range that are mapped, in address order."""
        start = self._vstart[seq_id]
        return list(range(start, start + self._families[self._family_of[seq_id]].num_groups))

    def ledger(self, next_shape: SeqShape | None = None) -> MemoryLedger:
        """O(1) from running totals; any free group serves anyone (``next_shape`` does not matter)."""
        kv = self.kv_bytes_per_token
        held_slots = self._num_held_groups * self.tokens_per_page
        return MemoryLedger(
            budget_bytes=self.budget_bytes,
            token_bytes=self._num_token_slots * kv,
            reserved_future_bytes=self._num_future_slots * kv,
            internal_bytes=(held_slots - self._num_token_slots - self._num_future_slots) * kv
            + self._num_held_groups * self.group_slack_bytes,
            external_bytes=self._remainder_bytes,
            free_bytes=self._num_free_groups * self.group_bytes,
        )

    def footprint(self, seq_ids: Sequence[int]) -> Footprint:
        """Evicting frees every group of the families (their unforked branches' too); a swap moves
        each sequence's tokens in one run."""
        keys = self._families_of(seq_ids)
        held = sum(self._families[k].num_groups * self._families[k].num_holders for k in keys)
        tokens = [self._tokens[s] for s in seq_ids]
        return Footprint(
            held * self.group_bytes,
            Transfer(sum(tokens) * self.kv_bytes_per_token, sum(1 for t in tokens if t)),
        )

    def project_decode(
        self, seq_ids: Sequence[int], max_steps: int, next_shape: SeqShape | None = None
    ) -> DecodeProjection:
        """Exact in O(sequences + steps): each family maps ``num_holders`` groups each time its
        longest decoding sequence crosses a page, which from its first crossing on repeats every
        ``tokens_per_page`` steps; a holder whose final length the family's mapped length passes
        turns the rest of each new group's slots into internal fragmentation. Sequences must not
        pass their final length within ``max_steps``. ``pages_mapped`` has each step's pages."""
        if not seq_ids or max_steps <= 0:
            return NO_PROJECTION
        size = self.tokens_per_page
        longest: dict[int, int] = {}  # family -> its longest decoding sequence's tokens
        for seq_id in seq_ids:
            key = self._family_of[seq_id]
            tokens = self._tokens[seq_id]
            if tokens + max_steps > self._range_tokens[seq_id]:
                max_steps = self._range_tokens[seq_id] - tokens  # the range ends: a refusal
            if longest.get(key, -1) < tokens:
                longest[key] = tokens
        if max_steps <= 0:
            return NO_PROJECTION
        # per step: groups whose progression starts there, and waste (slots) that starts recurring
        # there or happens once there
        starts = np.zeros(max_steps + 1, dtype=np.int64)
        recurring = np.zeros(max_steps + 1, dtype=np.int64)
        once = np.zeros(max_steps + 1, dtype=np.int64)
        for key, tokens in longest.items():
            family = self._families[key]
            mapped = family.num_groups * size
            first = mapped + 1 - tokens  # the step whose token needs a new group
            if first > max_steps:
                continue
            starts[first] += family.num_holders
            finals = [self._final[s] for s in family.members] + [family.spare_final] * family.num_spares
            for final in finals:
                # event k maps slots [mapped + k*size, mapped + (k+1)*size); slots past ``final`` are waste
                k = max(0, (final - mapped) // size)  # the first event whose group reaches past final
                step = first + k * size
                if step > max_steps:
                    continue
                partial = mapped + (k + 1) * size - max(final, mapped + k * size)
                once[step] += partial
                if step + size <= max_steps:
                    recurring[step + size] += size
        new_groups = _periodic_sum(starts, size)[1:]
        cum_groups = np.cumsum(new_groups)
        num_steps = int(np.searchsorted(cum_groups, self._num_free_groups, side="right"))
        if num_steps == 0:
            return NO_PROJECTION
        waste = (_periodic_sum(recurring, size) + once)[1 : num_steps + 1]
        cum_groups, new_groups = cum_groups[:num_steps], new_groups[:num_steps]
        cum_waste = np.cumsum(waste)
        steps = np.arange(1, num_steps + 1, dtype=np.int64)
        kv = self.kv_bytes_per_token
        token_slots = len(seq_ids) * steps
        led = self.ledger(next_shape)
        return DecodeProjection(
            num_steps,
            {
                "token_bytes": led.token_bytes + kv * token_slots,
                "reserved_future_bytes": led.reserved_future_bytes + kv * (size * cum_groups - token_slots - cum_waste),
                "internal_bytes": led.internal_bytes + kv * cum_waste + self.group_slack_bytes * cum_groups,
                "external_bytes": np.full(num_steps, led.external_bytes, dtype=np.int64),
                "free_bytes": led.free_bytes - self.group_bytes * cum_groups,
                "cached_bytes": np.zeros(num_steps, dtype=np.int64),
                "state_bytes": np.full(num_steps, led.state_bytes, dtype=np.int64),
            },
            new_groups * self.geometry.num_buffers,
        )

    # --- internals -------------------------------------------------------------------------------

    def _can_take(self, num_groups: int, keep_free_bytes: int = 0) -> bool:
        free_after = self._num_free_groups - num_groups
        return free_after >= 0 and free_after * self.group_bytes >= keep_free_bytes

    def _take(self, num_groups: int) -> None:
        """Map ``num_groups`` groups from the pool (the caller checked they are free)."""
        self._num_free_groups -= num_groups
        self._num_held_groups += num_groups
        self.num_groups_mapped += num_groups
        self._groups_to_drain += num_groups

    def _give(self, num_groups: int) -> None:
        self._num_free_groups += num_groups
        self._num_held_groups -= num_groups

    def _add_member(self, seq_id: int, key: int, tokens: int, final: int, range_tokens: int) -> None:
        self._families[key].members.append(seq_id)
        self._family_of[seq_id] = key
        self._tokens[seq_id] = tokens
        self._final[seq_id] = final
        self._range_tokens[seq_id] = range_tokens
        self._vstart[seq_id] = self._next_vpage
        self._next_vpage += range_tokens // self.tokens_per_page
        self._num_token_slots += tokens

    def _swapped_groups(self, members: list[tuple[int, int, int, int]], pinned: bool) -> int:
        """Groups each sequence of a swapped-out family maps when it comes back."""
        if pinned:
            return self.groups_for(members[0][3])  # the whole range
        return self.groups_for(max(tokens for _, tokens, _, _ in members))

    def _shrink(self, family: _Family) -> None:
        """Unmap the groups past what the family's longest sequence needs (a fan-out keeps all)."""
        if family.pinned:
            return
        needed = self.groups_for(max(self._tokens[s] for s in family.members))
        if needed < family.num_groups:
            self._give((family.num_groups - needed) * family.num_holders)
            family.num_groups = needed

    def _refresh_future(self, family: _Family) -> None:
        """Recount the family's reserved future: each holder's mapped slots it will still fill."""
        mapped = family.num_groups * self.tokens_per_page
        future = family.num_spares * min(mapped, family.spare_final)
        for seq_id in family.members:
            left = min(mapped, self._final[seq_id]) - self._tokens[seq_id]
            if left > 0:
                future += left
        self._num_future_slots += future - family.future_slots
        family.future_slots = future

    def _families_of(self, seq_ids: Sequence[int]) -> list[int]:
        """The families of ``seq_ids``, which must hold every live sequence of each."""
        keys = list(dict.fromkeys(self._family_of[s] for s in seq_ids))
        chosen = set(seq_ids)
        for key in keys:
            if not chosen.issuperset(self._families[key].members):
                raise ValueError(f"sequences {list(seq_ids)} leave out part of request {key}")
        return keys


def _periodic_sum(values: np.ndarray, period: int) -> np.ndarray:
    """``out[s] = values[s] + values[s - period] + values[s - 2*period] + ...``: a progression
    that starts at step ``s0`` and repeats every ``period`` steps, for every start at once."""
    length = len(values)
    rows = -(-length // period)
    padded = np.zeros(rows * period, dtype=values.dtype)
    padded[:length] = values
    return np.cumsum(padded.reshape(rows, period), axis=0).reshape(-1)[:length]


@hookimpl
def kvbench_register_allocators() -> list[type]:
    return [VAttentionAllocator]
