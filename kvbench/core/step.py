"""The step plan a scheduler hands the executor, and what the executor says happened.

Decide, then execute: everything that costs GPU time in a step is in its :class:`StepPlan`
(prefill chunks, decodes, copies, swap transfers), so the executor can price it and the recorder
can see it. A *quiet* plan (decodes only: nothing admitted, preempted, forked, copied or moved)
can stand for a run of identical decode steps, ``num_steps`` of them, which the engine advances
in one computation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from kvbench.core.kv import KVCopy, PageMapping, Refusal, Transfer
from kvbench.core.ledger import MemoryLedger
from kvbench.core.sequence import Sequence, SequenceGroup


class PrefillChunk(NamedTuple):
    """``num_new_tokens`` of ``seq`` computed over the ``num_context_tokens`` already in its cache."""

    seq: Sequence
    num_new_tokens: int
    num_context_tokens: int
    #: how many of the new tokens had been computed before and were lost to a recompute preemption
    num_recomputed_tokens: int


class Mechanism(str, enum.Enum):
    """How a preempted request gives up its memory (a ``str``: a policy may answer "swap")."""

    #: drop its KV; it rejoins the waiting queue and is prefilled again
    RECOMPUTE = "recompute"
    #: move its KV to host memory; it comes back before any waiting request is admitted
    SWAP = "swap"


class Preemption(NamedTuple):
    group: SequenceGroup
    #: distinct token positions whose KV it held when preempted
    kv_tokens: int
    #: the mechanism that was used
    mechanism: Mechanism
    #: a swap was asked for but could not be done (no room in the host pool, or an allocator
    #: that cannot swap), so the victim was recomputed instead
    fell_back: bool
    #: bytes the swap moved to host memory (0 for a recompute)
    swap_out_bytes: int = 0


class AdmissionRefusal(NamedTuple):
    """The head of the queue could not be admitted this step (first come first served: nobody overtakes it)."""

    group: SequenceGroup
    reason: Refusal
    reservation_bytes: int
    free_bytes: int
    largest_hole_bytes: int


@dataclass(slots=True)
class StepPlan:
    step: int
    start_s: float
    prefills: list[PrefillChunk] = field(default_factory=list)
    #: sequences computing exactly one token (the one they sampled last)
    decodes: list[Sequence] = field(default_factory=list)
    #: KV slots the decodes read in the plan's first step
    kv_read_tokens: int = 0
    #: sequences that sample a token at the end of the step besides the decodes (completed prefills, new branches)
    samples: list[Sequence] = field(default_factory=list)
    forks: list[tuple[Sequence, Sequence]] = field(default_factory=list)
    copies: list[KVCopy] = field(default_factory=list)
    swap_out: list[Transfer] = field(default_factory=list)
    swap_in: list[Transfer] = field(default_factory=list)
    #: the request each ``swap_in`` transfer brought back, in the same order
    swap_in_request_ids: list[int] = field(default_factory=list)
    #: host-tier reloads of prefix blocks paid in this step (``allocator.host_reload=blocking``)
    host_reloads: list[Transfer] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    refusal: AdmissionRefusal | None = None
    #: requests admitted (or readmitted) this step: one whose every token but the last was served
    #: from a prefix cache computes a single token, which reads like a decode, yet the step is not quiet
    num_admitted: int = 0
    #: the memory ledger once the step's allocations are made
    ledger: MemoryLedger | None = None
    #: blocks two or more sequences share, and the bytes that saves (each shared block's bytes once
    #: per holder after the first), once the step's allocations are made; constant over a run of
    #: quiet steps (only forks, copies, prefix hits and frees change them)
    num_shared_blocks: int = 0
    shared_bytes_saved: int = 0
    num_running: int = 0  #: sequences holding memory and computing
    num_waiting: int = 0  #: requests waiting for admission
    num_swapped: int = 0  #: requests in host memory
    #: how many identical decode steps this plan stands for (only a quiet plan has more than one)
    num_steps: int = 1
    #: the ledger after each of steps 2..num_steps: LEDGER_FIELDS name -> array
    span_ledgers: dict[str, np.ndarray] | None = None
    #: the pages the allocator mapped for this step (allocators that ``maps_pages``: vAttention;
    #: None for the others), priced by the executor
    page_mapping: PageMapping | None = None
    #: with ``page_mapping``, a run of steps: the pages each of steps 2..num_steps maps
    span_pages_mapped: np.ndarray | None = None
    #: a beam search decodes in this step: it may re-fork after any step, so no run of steps can
    #: be taken at once
    has_beam_search: bool = False

    @property
    def has_work(self) -> bool:
        """Something to compute or move: a prefill, a decode, a sample, a swap, a preemption or a
        blocking host-tier reload (a plan without is idle: only a reload in flight can explain it)."""
        return bool(
            self.prefills
            or self.decodes
            or self.samples
            or self.swap_in
            or self.swap_out
            or self.preemptions
            or self.host_reloads
        )

    @property
    def is_quiet(self) -> bool:
        """Decodes only: nothing admitted, prefilled, preempted, forked, copied or moved."""
        return bool(self.decodes) and not (
            self.num_admitted
            or self.prefills
            or self.samples
            or self.forks
            or self.copies
            or self.swap_out
            or self.swap_in
            or self.preemptions
            or self.host_reloads
        )

    @property
    def signature(self) -> tuple:
        """What a run of quiet steps keeps constant; a change starts a new row of the step table."""
        refused = self.refusal.group.request_id if self.refusal else None
        return (len(self.decodes), self.num_running, self.num_waiting > 0, self.num_swapped, refused)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(chunk.num_new_tokens for chunk in self.prefills) if self.prefills else 0

    @property
    def num_computed_tokens(self) -> int:
        """Token positions the plan computes over all its steps."""
        return self.num_prefill_tokens + len(self.decodes) * self.num_steps


@dataclass(slots=True)
class StepResult:
    """How long each step of a plan took, and where the time went."""

    start_s: float
    #: one entry per step of the plan
    durations_s: np.ndarray | tuple[float, ...]
    end_s: float
    prefill_s: float = 0.0
    #: compute time of each of the plan's prefill chunks, in plan order
    chunk_times_s: tuple[float, ...] = ()
    decode_s: float = 0.0  #: over all the plan's steps
    swap_s: float = 0.0
    copy_s: float = 0.0
    #: the part of ``prefill_s`` spent recomputing KV lost to preemption
    recompute_s: float = 0.0
    #: ``mode=real``: the cost model's time for the same plan (the durations are then measured);
    #: None in ``sim``, where the durations are the prediction
    predicted_s: float | None = None
    #: a run of steps: the clock at each step boundary, ``start_s`` first and ``end_s`` last, added
    #: in step order (what :meth:`step_starts_s` and a truncation read; None: computed when asked)
    clock_s: np.ndarray | None = None
    #: with a plan's ``page_mapping``: what mapping pages added to each step's time (all of the
    #: mapping time on the critical path, or the part longer than the step when mapped ahead);
    #: None when the allocator maps no pages
    page_map_added_s: np.ndarray | tuple[float, ...] | None = None

    def step_starts_s(self) -> np.ndarray:
        """Start time of each step (the first is ``start_s``), accumulated in step order."""
        if self.clock_s is not None:
            return self.clock_s[:-1]
        return np.cumsum(np.concatenate(([self.start_s], self.durations_s[:-1])))


def added_in_order(total: float, values) -> float:
    """``total`` plus ``values`` added one by one, in step order, so that a run of steps added at
    once and the same steps added one at a time give the same float: plain floats for a tuple (a
    short run), one cumulative sum for an array."""
    if len(values) == 1:
        return total + float(values[0])
    if isinstance(values, tuple):
        for value in values:
            total += value
        return total
    return float(np.cumsum(np.concatenate(([total], values)))[-1])


class Executor(Protocol):
    """What the engine hands a step plan to: the simulator's cost model (``kvbench.exec.sim``) or
    a GPU running the model (``kvbench.exec.real``). It prices or runs exactly what the plan
    lists, and says what happened."""

    def execute(self, plan: StepPlan) -> StepResult: ...
