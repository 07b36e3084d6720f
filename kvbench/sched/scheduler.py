"""The scheduler: its queues and state, and the order a step happens in.

A scheduling policy (a ``scheduler`` plugin) implements :meth:`Scheduler.schedule_step`, deciding
the order in which a step runs the running requests, resumes swapped ones and admits waiting ones,
by calling the public mechanisms :meth:`Scheduler.run_running`, :meth:`Scheduler.continue_prefills`,
:meth:`Scheduler.admit` and :meth:`Scheduler.resume_swapped`. Which waiting request is offered
first is the admission queue's choice (:mod:`kvbench.sched.queue`: ``scheduler.queue=fcfs|priority|
shortest_prompt`` or a plugin's), not the policy's.

This module is the one place that calls the mechanisms, in order: :meth:`Scheduler.schedule` (a
step begins, the policy fills the plan, the plan takes the allocator's copies and ledger) and
:meth:`Scheduler.update` (samples, finishes, and the memory they release). Admission, growth and
preemption all happen while the plan is built; ``update`` then applies what the executor did. The
mechanisms live in rooms by concern, each a mixin of :class:`Scheduler`, so that a mechanism is
found by its name and each is still a bound method on the scheduler (a subclass may override it,
and the engine's hot loop pays no indirection for the split):

- :mod:`kvbench.sched.admission`: admission and chunking (the watermark, the token budget, a
  request's first allocation, a refused admission taken back);
- :mod:`kvbench.sched.reservation`: room held back at admission for the running requests' output
  (SGLang's new-token ratio, TRT-LLM's guaranteed-no-evict rule); nothing by default;
- :mod:`kvbench.sched.compute`: the running requests' next tokens, decodes and prefill chunks, and
  growth that preempts;
- :mod:`kvbench.sched.fan_out`: fan-outs and beams (the shared prompt, forks, beam reshuffles);
- :mod:`kvbench.sched.cache_hits`: prefix-cache hits and their undo;
- :mod:`kvbench.sched.victims`: preemption and victims (recompute, the step a victim gives back);
- :mod:`kvbench.sched.swapping`: swap out and in, and reloads from the host tier;
- :mod:`kvbench.sched.projection`: runs of quiet decode steps, projected and taken at once;
- :mod:`kvbench.sched.finishing`: finished branches and requests, and request-level batches;
- :mod:`kvbench.sched.roles`: a prefill or decode worker's part in a disaggregated deployment
  (KV held until its transfer ends, KV reserved before it lands); nothing without a role.

The options every scheduler has are :class:`kvbench.sched.options.SchedulerConfig` (importable
from here too).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

from kvbench.core.sequence import Sequence, SequenceGroup
from kvbench.core.step import StepPlan, StepResult
from kvbench.exec.costmodel import CostModel
from kvbench.memory.allocator import Allocator, Refusal, SeqShape
from kvbench.memory.host_pool import HostSwapPool
from kvbench.sched.admission import AdmissionMixin
from kvbench.sched.cache_hits import CacheHitsMixin
from kvbench.sched.compute import ComputeMixin
from kvbench.sched.fan_out import FanOutMixin, GroupWork
from kvbench.sched.finishing import FinishingMixin
from kvbench.sched.options import SchedulerConfig
from kvbench.sched.preemption import PreemptionContext, PreemptionPolicy
from kvbench.sched.projection import ProjectionMixin
from kvbench.sched.queue import FcfsQueue, RequestQueue
from kvbench.sched.reservation import ReservationMixin
from kvbench.sched.roles import RolesMixin
from kvbench.sched.swapping import SwappingMixin, host_reloads_for
from kvbench.sched.victims import VictimsMixin

__all__ = ["Scheduler", "SchedulerConfig", "StepOutcome"]


class StepOutcome(NamedTuple):
    num_finished_requests: int
    #: some sequence finished at the end of the step (the next step runs a different batch)
    any_seq_finished: bool


class Scheduler(
    AdmissionMixin,
    ReservationMixin,
    ComputeMixin,
    FanOutMixin,
    CacheHitsMixin,
    VictimsMixin,
    SwappingMixin,
    ProjectionMixin,
    FinishingMixin,
    RolesMixin,
):
    """A scheduling-policy plugin: ``name`` matches ``conf/scheduler/<name>.yaml``.

    The contract: a subclass implements :meth:`schedule_step` with the mechanisms
    :meth:`run_running`, :meth:`continue_prefills`, :meth:`admit` and :meth:`resume_swapped` (and
    may read, never reorder, ``running``, ``waiting`` and ``swapped``). Everything else (admission
    order, growth, preemption, forks, prefix-cache hits, finishing) is the base class's, so the
    engine, the event-driven loop and the recorder work for any policy.
    ``kvbench.testing.SchedulingConformance`` checks a subclass.
    """

    name: ClassVar[str]
    Config: ClassVar[type] = SchedulerConfig
    #: a finished sequence keeps its memory until every request of its batch has finished, and the
    #: requests of a batch are returned together (request-level batching)
    holds_finished: ClassVar[bool] = False
    #: admits prompts in chunks (a prompt never needs the whole step's budget at once)
    chunks_prompts: ClassVar[bool] = False
    #: preemptions in a row with no token sampled between them, after which a run stops as a
    #: livelock. Tokens are never lost, so a run that goes on for ever samples its last token at
    #: some point and then only preempts (a step that neither samples nor preempts only computes
    #: chunks, which ends in a sample, or is empty, which stops the run below). A run that makes
    #: progress samples long before this: a scheduler whose victim order ranks one request above
    #: the rest lets that one finish its prefill and sample
    max_preemptions_without_a_token: ClassVar[int] = 1_000_000

    def __init__(
        self,
        config: Any,
        *,
        allocator: Allocator,
        policy: PreemptionPolicy,
        cost: CostModel,
        host_pool: HostSwapPool,
        queue: RequestQueue | None = None,
    ) -> None:
        self.config = config if config is not None else self.Config()
        self.allocator = allocator
        self.policy = policy
        self.host_pool = host_pool
        self.preemption = PreemptionContext(allocator, cost, host_pool)
        #: the admission queue (FCFS unless the run names another)
        self.waiting: RequestQueue = queue if queue is not None else FcfsQueue()
        self.swapped: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []  # in admission order
        self.held: list[SequenceGroup] = []  # finished, memory kept until the batch ends
        self._held_seq_ids: list[int] = []
        #: requests that finished since the engine last took them (it records each and lets it go)
        self.finished: list[SequenceGroup] = []
        self.num_running_seqs = 0
        self._step = 0
        # admission (admission.py)
        # NOTE: growth headroom only matters to allocators that allocate on demand
        reserves = allocator.capabilities.reserves_future
        self.watermark_bytes = 0 if reserves else self._watermark_bytes()
        self._headroom_bytes = 0
        self._refused: tuple[SeqShape, Refusal] | None = None  # why the last admission failed
        #: requests running or waiting when the step began (who a long prefill would starve)
        self._num_eligible = 0
        # reservation (reservation.py): SGLang's new-token ratio, TRT-LLM's blocks to completion
        self._init_reservation()
        # cache hits (cache_hits.py): the hit counted by the admission in progress, to take back if
        # it is refused: (group, lost positions served back from the cache, new prompt positions served)
        self._caches_prefixes = allocator.capabilities.caches_prefixes
        self._admission_hit: tuple[SequenceGroup, int, int] | None = None
        # fan-out (fan_out.py)
        self._work: GroupWork | None = None  # the request whose tokens are being scheduled
        # victims (victims.py): those taken this step from requests that had already run, and the
        # tokens they gave back
        self._num_earlier_victims = self._returned_tokens = 0
        #: preemptions since a step last sampled a token
        self._preemptions_without_a_token = 0
        # swap and reloads (swapping.py)
        #: reloads from the allocator's host tier of evicted prefix blocks (None: no host tier)
        self.host_reloads = host_reloads_for(allocator, cost)
        # projection (projection.py): a run of decode steps may free memory (sliding windows):
        # what was free and cached when the step began, so that a projected run stops before a
        # refused request could fit
        self._frees_during_decode = allocator.capabilities.frees_during_decode
        self._available_at_start_bytes = 0

    # --- what the engine calls -------------------------------------------------------------------
    # (also check_fits: admission.py; wake_s: swapping.py; decode_span_limit, project_span, extend:
    # projection.py)

    def add_arrivals(self, num_requests: int, make: Callable[[], SequenceGroup]) -> None:
        """``num_requests`` requests arrive; each call of ``make`` makes the next one's group, its
        ``boundary_s`` set, in arrival order. The queue makes them when it needs them: a
        first-come-first-served queue only when each reaches its head."""
        self.waiting.add_deferred(num_requests, make)

    def arrival_may_join(self) -> bool:
        """Whether a request arriving now could be admitted ahead of everything waiting: the queue
        is empty, or it lets later arrivals overtake (the engine then ends a quiet run at arrivals)."""
        return not self.waiting or not self.waiting.fifo

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.swapped or self.held)

    def schedule(self, clock_s: float) -> StepPlan:
        """Decide the next step."""
        plan = StepPlan(self._step, clock_s)
        if self._landing_s:  # a decode worker: requests whose KV has landed join the running ones
            self._land_due(clock_s)
        self._num_eligible = len(self.running) + len(self.waiting)
        if self.host_reloads is not None:
            self.host_reloads.start_step(clock_s, self.waiting.peek() if self.waiting else None)
        if self._frees_during_decode:
            self._note_available_at_start()
        self.schedule_step(plan)
        if self._ratio_active and (plan.decodes or plan.preemptions):
            self._after_decode(plan)
        plan.copies.extend(self.allocator.drain_copies())
        if self.allocator.capabilities.maps_pages:  # vAttention: the pages this step mapped, to be priced
            plan.page_mapping = self.allocator.drain_page_mapping()
        plan.ledger = self.allocator.ledger(self._head_shape())
        if self._in_flight_bytes:  # a decode worker: reserved slots hold no token until the KV lands
            plan.ledger = self._ledger_in_flight(plan.ledger)
        plan.num_shared_blocks = self.allocator.num_shared_blocks()
        plan.shared_bytes_saved = self.allocator.shared_bytes_saved()
        plan.num_running = self.num_running_seqs
        plan.num_waiting = len(self.waiting)
        plan.num_swapped = len(self.swapped)
        # (a worker with a role may wait with nothing to compute: for a KV transfer to land, or to end)
        if not plan.has_work and not self._reload_lands_after(clock_s) and self.role is None:
            raise RuntimeError(  # check_fits makes this unreachable; a broken plugin would loop forever
                f"scheduler {self.name!r} made no progress at step {self._step} "
                f"({len(self.running)} running, {len(self.waiting)} waiting, {len(self.swapped)} swapped)"
            )
        if plan.decodes or plan.samples:
            self._preemptions_without_a_token = 0
        elif plan.preemptions:
            self._stop_a_livelock(plan)
        return plan

    def update(self, plan: StepPlan, result: StepResult) -> StepOutcome:
        """Apply what the step did: samples, finishes, and the memory they release."""
        end_s = result.end_s
        num_steps = plan.num_steps
        for chunk, chunk_s in zip(plan.prefills, result.chunk_times_s):
            group = chunk.seq.group
            if group.first_token_s < 0:
                group.prefill_compute_s += chunk_s
        finished: list[Sequence] = []
        for seq in plan.decodes:
            seq.num_tokens += num_steps
            if seq.num_tokens >= seq.end_tokens:
                finished.append(seq)
        for seq in plan.samples:
            seq.num_tokens += 1
            group = seq.group
            if group.first_token_s < 0:
                group.first_token_s = end_s
            if seq.num_tokens >= seq.end_tokens:
                finished.append(seq)
        num_finished = 0
        for seq in finished:
            num_finished += self._finish(seq, end_s)
        if finished:
            self.running = [g for g in self.running if g.num_live]
        if self.holds_finished and self.held and not self.running:
            num_finished += self._end_batch(end_s)
        self._step += num_steps
        return StepOutcome(num_finished, bool(finished))

    # --- the policy ------------------------------------------------------------------------------

    def schedule_step(self, plan: StepPlan) -> None:
        """Fill ``plan`` with this step's work, calling :meth:`run_running`, :meth:`admit` and
        :meth:`resume_swapped` in the policy's order. The one method a scheduler plugin writes."""
        legacy = getattr(self, "_schedule", None)  # a plugin written before the contract was public
        if legacy is None:
            raise NotImplementedError(f"scheduler {self.name!r} does not implement schedule_step")
        legacy(plan)

    # the names the built-in policies used before the contract was public (kept for older plugins)
    _run_running = ComputeMixin.run_running
    _admit = AdmissionMixin.admit
    _resume_swapped = SwappingMixin.resume_swapped
