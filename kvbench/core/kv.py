"""What an allocator is asked and answers, as values: the ground floor the core, the memory
managers, the cost model and the metrics all stand on (nothing here imports above ``core``).

A request's shape (:class:`SeqShape`), why an allocation was refused (:class:`Refusal`), the work
an allocator hands back to be priced (:class:`KVCopy`, :class:`Transfer`), what evicting would
free (:class:`Footprint`) and how far decoding can run without a decision (:class:`DecodeProjection`).
The memory ledger's parts are in :mod:`kvbench.core.ledger`.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import numpy as np


class SeqShape(NamedTuple):
    """What an allocator may know about a request when sizing it.

    ``final_kv_tokens`` is the number of KV slots one sequence holds when it finishes (prompt +
    output - 1: the last emitted token is never fed back; the longest branch of a fan-out). A real
    engine does not know it; kvbench uses it for the memory ledger (what is reserved but will
    never be used) and for the ``oracle``/``pow2`` reservations of the vLLM paper's baselines.
    """

    num_tokens: int  #: KV slots needed now (a prompt, a prompt chunk, or a recomputed context)
    s_max_tokens: int  #: the request's declared S_max (prompt + output never exceed it)
    final_kv_tokens: int
    #: sequences the request forks into after its prompt; allocators that reserve a sequence's
    #: whole future reserve one range per branch at admission, so that a later fork never fails
    num_branches: int = 1
    #: the request's prompt (None: ``num_tokens``), for reservations sized by the output alone
    prompt_tokens: int | None = None
    #: the prompt's content as chained ids of ``hash_block_tokens``-token granules
    #: (:mod:`kvbench.core.prefix`): what a prefix cache identifies blocks by; () = unknown content
    prefix_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 0
    #: the request whose own tokens these are (one-sequence requests): what identifies the blocks
    #: past its shared prefix, generated tokens included, to a cache that keeps those (vLLM's)
    content_id: int | None = None


class Refusal(str, enum.Enum):
    """Why an ``allocate`` (or ``swap_in``) was refused: the one classification every table uses."""

    #: fewer free bytes than the request needs
    NO_MEMORY = "no_memory"
    #: enough free bytes in total, but no single hole holds the reservation (external fragmentation)
    FRAGMENTED = "fragmented"
    #: it fits, but would leave less than the scheduler's watermark free
    WATERMARK = "watermark"


class KVCopy(NamedTuple):
    """A device-to-device copy the allocator made: ``num_blocks`` blocks from ``src_block_id`` on."""

    src_block_id: int
    dst_block_id: int
    num_blocks: int
    num_bytes: int


class Transfer(NamedTuple):
    """Bytes moved between device and host by a swap, in ``num_runs`` separate copies."""

    num_bytes: int
    #: one copy per run (the per-transfer overhead is paid per run): vLLM swaps block by block,
    #: so a paged sequence is one run per block; a contiguous sequence is one run
    num_runs: int


class Footprint(NamedTuple):
    """What evicting a set of sequences would free, and what swapping them would move."""

    held_bytes: int
    transfer: Transfer


class DecodeProjection(NamedTuple):
    """The next ``num_steps`` decode steps of a set of sequences, computed without taking them.

    Each step appends one token to every sequence of the set. ``num_steps`` is the most steps
    that need neither a refusal nor a copy, and do not change what sharing saves (a window that
    releases a block another sequence still holds: a run reports its first step's sharing);
    ``ledgers`` maps each :data:`LEDGER_FIELDS` name to a
    sequence of integers (an int64 array, or a list for a short projection) of its value after each
    of those steps, exactly what ``ledger(next_shape)`` would return after taking them one by one.
    ``pages_mapped`` (allocators that ``maps_pages``; None for the others): the physical pages
    each of those steps maps, what :meth:`drain_page_mapping` would count step by step.
    """

    num_steps: int
    ledgers: dict[str, np.ndarray]
    pages_mapped: np.ndarray | None = None


class PageMapping(NamedTuple):
    """Physical pages an allocator mapped into virtual address ranges since it was last asked
    (vAttention's ``cuMemMap`` calls): work on the host and the GPU driver, priced by the executor."""

    num_pages: int
    #: seconds to map one page
    page_map_latency_s: float
    #: mapped ahead, in the background, while the step computes: only the part of the mapping time
    #: longer than the step adds to it (false: on the step's critical path, all of it adds)
    overlapped: bool

    @property
    def map_s(self) -> float:
        return self.num_pages * self.page_map_latency_s


NO_PROJECTION = DecodeProjection(0, {})
