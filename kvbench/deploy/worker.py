"""One worker of a disaggregated deployment: an engine that a loop steps, one turn at a time.

The aggregated :class:`~kvbench.engine.Engine` runs a whole workload to its end; a deployment's
workers run side by side, each with its own scheduler, allocator and clock, and what one does
(a prompt computed, blocks reserved) decides what another does next. So a :class:`Worker` is
stepped from outside (:mod:`kvbench.deploy.loop`): requests are *pushed* to it as they are
routed, a turn (:meth:`Worker.advance`) takes one step, or a run of quiet decode steps none of
which starts after the loop's horizon, and returns what happened in it as events.

A turn is the engine's turn (the same span machinery: :func:`kvbench.engine.advance_span`, with
arrivals joining at step boundaries as :func:`kvbench.engine.join_within` does), and the same
recorder writes the worker's own request and step tables. A run of quiet steps also stops before
a step that starts at or after a pending push (when it could be admitted), a KV landing, a KV
release or the horizon: each may change the batch. ``event_driven=False`` takes every step one
by one, with identical tables.

The scheduler's side of each role (KV held on the prefill side, reserved on the decode side) is
:mod:`kvbench.sched.roles`.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
from collections import deque
from dataclasses import dataclass, replace

from kvbench.core.request import Request
from kvbench.core.sequence import SequenceGroup
from kvbench.core.step import Executor
from kvbench.deploy.interfaces import Role, WorkerView
from kvbench.engine import advance_span, join_within
from kvbench.memory.allocator import SeqShape
from kvbench.metrics.recorder import Recorder, RunRecord, StepSink
from kvbench.sched.scheduler import Scheduler


@dataclass(frozen=True)
class Prefilled:
    """Prefill role: a request's prompt is computed and its KV held for the transfer."""

    request_id: int
    start_s: float  #: the start of the first step that computed any of its prompt
    end_s: float  #: the end of the step that computed its last prompt token
    kv_bytes: int  #: its KV on this worker: what a transfer moves (whole blocks, as a swap would)


@dataclass(frozen=True)
class Admitted:
    """Decode role: a prefilled request's blocks are reserved (its KV may be sent from now on)."""

    request_id: int
    at_s: float  #: the step boundary at which they were reserved


@dataclass(frozen=True)
class FirstToken:
    """Decode role: a request emitted its first output token."""

    request_id: int
    at_s: float


@dataclass(frozen=True)
class Finished:
    """Decode role: a request emitted its last output token (its memory is freed)."""

    request_id: int
    at_s: float


Event = Prefilled | Admitted | FirstToken | Finished


class _Pushed:
    """Requests pushed to a worker and not yet in its queue, in order of the time they reach it;
    each joins the queue at the first step boundary at or after that time (the engine's arrivals,
    for requests that are not known in advance)."""

    def __init__(self, make_group) -> None:
        self._times_s: list[float] = []
        self._requests: list[Request] = []
        self._joined: deque[tuple[Request, float]] = deque()  # joined, their groups not made yet
        self._make_group = make_group

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, request: Request, at_s: float) -> None:
        i = bisect.bisect_right(self._times_s, at_s)  # (equal times: in push order)
        self._times_s.insert(i, at_s)
        self._requests.insert(i, request)

    def next_s(self) -> float | None:
        return self._times_s[0] if self._times_s else None

    def join(self, scheduler: Scheduler, until_s: float, boundary_s: float) -> None:
        num_joining = bisect.bisect_right(self._times_s, until_s)
        if not num_joining:
            return
        self._joined.extend((request, boundary_s) for request in self._requests[:num_joining])
        del self._times_s[:num_joining], self._requests[:num_joining]
        scheduler.add_arrivals(num_joining, self._make)

    def _make(self) -> SequenceGroup:
        request, boundary_s = self._joined.popleft()
        group = self._make_group(request)
        group.boundary_s = boundary_s
        return group


class Worker:
    """One prefill or decode worker (see the module docstring); ``clock_s`` is the end of its last step."""

    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        *,
        role: Role,
        event_driven: bool = True,
        step_sink: StepSink | None = None,
    ) -> None:
        scheduler.set_role(role)
        self.scheduler = scheduler
        self.executor = executor
        self.role = role
        self.event_driven = event_driven
        self.clock_s = 0.0
        self._recorder = Recorder(scheduler.allocator.kv_bytes_per_token, step_sink)
        self._pushed = _Pushed(self._make_group)
        self._next_seq_id = 0
        #: KV releases not applied yet (prefill role): (at_s, request id), in time order
        self._releases: list[tuple[float, int]] = []  # a heap of (release time, request id)
        #: the last plan was empty (nothing could run): the worker waits for the next push, landing,
        #: release or reload (each is in next_event_s' times: nothing changes before one of them)
        self._blocked = False

    # --- what the loop tells it ------------------------------------------------------------------

    def push(self, request: Request, at_s: float) -> None:
        """``request`` reaches this worker at ``at_s``; it joins the queue at the first step
        boundary at or after it. A prefill worker runs it with one output token (the prompt's own
        sample, which the decode side makes again); a decode worker takes it as prefilled."""
        if request.num_branches != 1:
            raise ValueError(
                f"request {request.request_id} has {request.num_branches} branches: a disaggregated "
                "deployment runs one-branch requests only"
            )
        if self.role == "prefill":
            request = replace(request, branch_output_tokens=(1,))
        else:  # its prompt's KV comes whole from the prefill side: the local prefix cache is not asked
            request = replace(request, prefix_hashes=(), hash_block_tokens=0)
            self.scheduler.expect_kv(request.request_id)
        self.scheduler.check_fits([request])
        self._pushed.add(request, at_s)

    def land(self, request_id: int, at_s: float) -> None:
        """Decode role: the request's KV has landed at ``at_s``; it runs from the first step
        boundary at or after it (its blocks must be reserved: an :class:`Admitted` came first)."""
        self.scheduler.set_landing(request_id, at_s)

    def release(self, request_id: int, at_s: float) -> None:
        """Prefill role: the request's KV has left at ``at_s``; its blocks are freed before any
        step that starts at or after it."""
        if request_id not in self.scheduler.held_kv:
            raise ValueError(f"request {request_id} holds no KV on this worker: nothing to release")
        heapq.heappush(self._releases, (at_s, request_id))

    # --- stepping --------------------------------------------------------------------------------

    def next_event_s(self) -> float | None:
        """The earliest time this worker has something to do (None: nothing until told more)."""
        scheduler = self.scheduler
        times = [
            t
            for t in (self._pushed.next_s(), scheduler.next_landing_s(), self._next_release_s(), scheduler.wake_s())
            if t is not None
        ]
        if not self._blocked and scheduler.has_work():
            times.append(self.clock_s)
        return max(self.clock_s, min(times)) if times else None

    def advance(self, horizon_s: float) -> list[Event]:
        """One turn: one step, or a run of quiet steps none of which starts after ``horizon_s``
        (nothing when the next step would). Returns what happened in it, in time order."""
        start_s = self.next_event_s()
        if start_s is None or start_s > horizon_s:
            return []
        # NOTE: as in Engine.run, the loop's many long-lived small objects are not worth scanning
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._turn(start_s, horizon_s)
        finally:
            if collecting:
                gc.enable()

    def _turn(self, clock_s: float, horizon_s: float) -> list[Event]:
        scheduler = self.scheduler
        self._release_due(clock_s)
        if (next_s := self._pushed.next_s()) is not None and next_s <= clock_s:
            self._pushed.join(scheduler, clock_s, clock_s)
        self.clock_s = clock_s
        plan = scheduler.schedule(clock_s)
        events: list[Event] = self._admitted()
        if not plan.has_work:  # waiting: for a landing, a release, a push or a host-tier reload
            self._blocked = True
            return events
        self._blocked = False
        firsts = [seq.group for seq in plan.samples if seq.group.first_token_s < 0]
        result = advance_span(scheduler, self.executor, plan, self._stop_s(horizon_s), self.event_driven)
        join_within(self._pushed, scheduler, result)
        outcome = scheduler.update(plan, result)
        self._recorder.record(plan, result, outcome.any_seq_finished)
        self.clock_s = result.end_s
        if self.role == "decode":
            events += [FirstToken(group.request_id, group.first_token_s) for group in firsts]
            events += [Finished(group.request_id, group.finish_s) for group in scheduler.finished]
        else:
            events += [
                Prefilled(group.request_id, group.admitted_s, group.finish_s, kv_bytes)
                for group, kv_bytes in scheduler.prefilled
            ]
            scheduler.prefilled.clear()
        for group in scheduler.finished:  # its row is all the worker keeps of a finished request
            self._recorder.record_request(group)
        scheduler.finished.clear()
        return events

    def _stop_s(self, horizon_s: float) -> float | None:
        """Where a run of quiet steps stops (none of its steps but the first starts at or after
        it): the horizon, a push that may be admitted, a landing, a release, a reload landing."""
        scheduler = self.scheduler
        times = [horizon_s, scheduler.next_landing_s(), self._next_release_s(), scheduler.wake_s()]
        if scheduler.arrival_may_join():
            times.append(self._pushed.next_s())
        stop_s = min(t for t in times if t is not None)
        return None if math.isinf(stop_s) else stop_s

    def _admitted(self) -> list[Event]:
        admitted = getattr(self.scheduler, "admitted_kv", None)
        if not admitted:
            return []
        events = [Admitted(request_id, at_s) for request_id, at_s in admitted]
        admitted.clear()
        return events

    def _next_release_s(self) -> float | None:
        return self._releases[0][0] if self._releases else None

    def _release_due(self, clock_s: float) -> None:
        while self._releases and self._releases[0][0] <= clock_s:
            _, request_id = heapq.heappop(self._releases)
            self.scheduler.release_kv(request_id)

    def _make_group(self, request: Request) -> SequenceGroup:
        group = SequenceGroup(request, self._next_seq_id)
        self._next_seq_id += request.num_branches
        return group

    # --- what the loop and the routers read --------------------------------------------------------

    def view(self, index: int) -> WorkerView:
        """What a router sees of this worker now (its state at its last step boundary)."""
        scheduler = self.scheduler
        ledger = scheduler.allocator.ledger()
        return WorkerView(
            index=index,
            role=self.role,
            num_waiting=len(scheduler.waiting) + len(self._pushed),
            num_running=len(scheduler.running) + len(scheduler.swapped) + scheduler.num_awaiting_kv(),
            free_kv_bytes=ledger.free_bytes + ledger.cached_bytes,
            cached_prefix_tokens=self.cached_prefix_tokens,
        )

    def cached_prefix_tokens(self, request: Request) -> int:
        """Prompt tokens of ``request`` this worker's prefix cache holds now (0 without one): what
        its admission would be served (never the whole prompt: one is computed, for its logits)."""
        alloc = self.scheduler.allocator
        if not alloc.capabilities.caches_prefixes or not request.prefix_hashes:
            return 0
        shape = SeqShape(
            request.prompt_tokens,
            request.s_max_tokens,
            request.final_kv_tokens,
            1,
            request.prompt_tokens,
            request.prefix_hashes,
            request.hash_block_tokens,
            request.request_id,
        )
        return alloc.num_cached_tokens(shape)

    def finish(self) -> RunRecord:
        """The worker's own request and step tables (every KV release told must have been applied
        or is applied now)."""
        if self._releases:
            self._release_due(max(self._releases)[0])
        return self._recorder.finish()
