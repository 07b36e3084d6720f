"""The engine: only the clock. Each turn the scheduler decides a step, the executor prices it, the
scheduler applies it and the recorder writes it down.

Event-driven: a quiet step (decodes only: nothing admitted, preempted, forked, copied or moved)
is the first of a run of identical decode steps that lasts until the first of them finishes a
sequence, until a block would run out, or until an arrival could change the batch. The engine
advances the whole run in one computation (the allocator projects its memory in closed form, the
cost model prices every step at once), so the loop's cost grows with events, not with tokens.
``event_driven=False`` takes every step one by one: the reference the tests compare against, with
identical tables.

Closed loop (``max_in_flight=C``): a client that keeps C requests in flight. The first C requests
are sent at their ``arrival_s``; each time k requests finish in a step, the next k are sent at
that step's end, which becomes their arrival (TTFT counts from the moment the client sent it, as
in ``vllm bench serve --max-concurrency``). A request finishes only at the last step of a run
(a run of quiet steps ends at the first that finishes a sequence), so both loops release at the
same boundaries.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from kvbench.core.request import Request, RequestList
from kvbench.core.sequence import SequenceGroup
from kvbench.core.step import Executor, StepPlan, StepResult, added_in_order
from kvbench.metrics.recorder import Recorder, RunRecord, StepSink
from kvbench.sched.scheduler import Scheduler

#: requests made at a time from the workload (a run holds those in flight and one batch ahead)
REQUEST_BATCH = 4096
#: the longest run of decode steps advanced at once (bounds the projection's arrays; a longer run
#: just continues in the next turn, and the recorder merges the two)
MAX_SPAN_STEPS = 1 << 14


class Engine:
    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        *,
        event_driven: bool = True,
        on_finished: Callable[[int], None] = lambda n: None,
        max_in_flight: int | None = None,
        step_sink: StepSink | None = None,
    ) -> None:
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1 or None, got {max_in_flight!r}")
        self.scheduler = scheduler
        self.executor = executor
        self.event_driven = event_driven
        self.on_finished = on_finished  # progress: called with the number of requests just finished
        self.max_in_flight = max_in_flight  # a closed-loop client's requests in flight; None: open loop
        self.step_sink = step_sink  # where the step table goes a batch of rows at a time; None: kept

    def run(self, requests: list[Request]) -> RunRecord:
        # NOTE: the loop creates many small objects that live for the whole run; the cyclic garbage
        # collector would scan them over and over (doubling the wall time at 10,000 requests)
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run(requests)
        finally:
            if collecting:
                gc.enable()

    def _run(self, requests: Sequence[Request]) -> RunRecord:
        scheduler = self.scheduler
        scheduler.check_fits(requests)
        recorder = Recorder(scheduler.allocator.kv_bytes_per_token, self.step_sink)
        arrivals = _Arrivals(requests, self.max_in_flight, recorder)
        clock_s, num_finished = 0.0, 0
        while num_finished < len(requests):
            if not scheduler.has_work():  # idle: jump to the next arrival
                clock_s = max(clock_s, arrivals.next_s())
            if (next_s := arrivals.next_s()) is not None and next_s <= clock_s:
                arrivals.join(scheduler, clock_s, clock_s)
            plan = scheduler.schedule(clock_s)
            if scheduler.wake_s() is not None and not plan.has_work:
                # nothing to compute until a host-tier reload lands: the GPU idles until then
                clock_s = max(clock_s, scheduler.wake_s())
                continue
            result = self._advance(plan, arrivals.next_s())
            join_within(arrivals, scheduler, result)
            outcome = scheduler.update(plan, result)
            recorder.record(plan, result, outcome.any_seq_finished)
            if scheduler.finished:
                for group in scheduler.finished:  # its row is all the run keeps of a finished request
                    recorder.record_request(group)
                scheduler.finished.clear()
            num_finished += outcome.num_finished_requests
            self.on_finished(outcome.num_finished_requests)
            clock_s = result.end_s
            arrivals.send_after_finishes(outcome.num_finished_requests, clock_s)
        return recorder.finish()

    def _advance(self, plan: StepPlan, next_arrival_s: float | None) -> StepResult:
        """Execute the plan, first stretching a quiet one over as many decode steps as nothing interrupts."""
        if not (self.event_driven and plan.is_quiet):  # (the common turn: asks nothing of the scheduler)
            return self.executor.execute(plan)
        return advance_span(self.scheduler, self.executor, plan, self._stop_s(next_arrival_s), self.event_driven)

    def _stop_s(self, next_arrival_s: float | None) -> float | None:
        """Where a run of quiet steps must stop (no step of it starts at or after it): the next
        arrival when it may be admitted, or a host-tier reload landing, whichever comes first."""
        scheduler = self.scheduler
        stop_s = next_arrival_s if next_arrival_s is not None and scheduler.arrival_may_join() else None
        wake_s = scheduler.wake_s()
        if wake_s is not None and (stop_s is None or wake_s < stop_s):
            # a host-tier reload lands: the request waiting for it joins as an arrival would
            stop_s = wake_s
        return stop_s


def advance_span(
    scheduler: Scheduler, executor: Executor, plan: StepPlan, stop_s: float | None, event_driven: bool
) -> StepResult:
    """Execute the plan, first stretching a quiet one over as many decode steps as nothing
    interrupts: no step of the run starts at or after ``stop_s`` (an arrival that may be admitted,
    a reload or a KV transfer landing, memory given back: None when nothing will), but the first,
    which is the plan's own. The engine and a deployment's workers (:mod:`kvbench.deploy.worker`)
    advance alike."""
    if not (event_driven and plan.is_quiet):
        return executor.execute(plan)
    limit = scheduler.decode_span_limit(plan, MAX_SPAN_STEPS)  # steps before the first finish
    if limit <= 0:
        return executor.execute(plan)
    first = None
    if stop_s is not None:
        # an arrival that may be admitted ends the run before its step. Every step of the run
        # takes at least as long as its first (contexts only grow), which bounds the run's
        # length before memory is projected: a short run costs a short projection
        first = executor.execute(plan)
        if stop_s <= first.end_s:
            return first
        # (+ 1: a bound, never a cut: the exact cut below comes from the run's own clock)
        limit = min(limit, math.ceil((stop_s - plan.start_s) / first.durations_s[0]) + 1)
    projection = scheduler.project_span(plan, limit)
    if projection.num_steps:
        plan.num_steps = 1 + projection.num_steps
        plan.span_pages_mapped = projection.pages_mapped  # (allocators that map pages)
        result = executor.execute(plan)
        plan.num_steps, plan.span_pages_mapped = 1, None
        num_extra = projection.num_steps
        if stop_s is not None:  # stop before the step in which the arrival joins
            starts_s = result.step_starts_s()
            num_extra = min(num_extra, bisect.bisect_left(starts_s, stop_s) - 1)
        if num_extra > 0:
            scheduler.extend(plan, projection, num_extra)
            return _truncate(result, plan.num_steps)
    return first if first is not None else executor.execute(plan)


def join_within(arrivals, scheduler: Scheduler, result: StepResult) -> None:
    """Requests that arrived during a run of steps (behind a blocked queue) join at the first
    step boundary at or after their arrival, as they would have step by step (``arrivals``: what
    has ``next_s()`` and ``join(scheduler, until_s, boundary_s)``)."""
    if len(result.durations_s) == 1:
        return
    starts_s = result.step_starts_s()
    while (next_s := arrivals.next_s()) is not None and next_s <= starts_s[-1]:
        boundary_s = float(starts_s[bisect.bisect_left(starts_s, next_s)])
        arrivals.join(scheduler, boundary_s, boundary_s)


class _Arrivals:
    """The requests on their way to the scheduler, in arrival order. A request is made (with a
    batch of the next ones) when it is next to arrive, and its group only when the scheduler's
    queue needs it: a run holds the requests in flight, not every request, and a first-come-
    first-served queue holds the requests waiting behind its head as a count.

    Open loop: every request is sent at its own ``arrival_s``. Closed loop (``max_in_flight=C``):
    the first C are sent at their ``arrival_s``; each time k requests finish in a step, the next k
    are sent at that step's end, which becomes their arrival (their own ``arrival_s`` is only the
    earliest time they may be sent)."""

    def __init__(self, requests: Sequence[Request], max_in_flight: int | None, recorder: Recorder) -> None:
        self._requests = requests
        self._recorder = recorder
        self._made: deque[Request] = deque()  # the next requests, made a batch at a time
        if isinstance(requests, RequestList):  # it knows them without making every request
            self._first_seq_ids = requests.first_seq_ids
            self._arrival_s = requests.arrival_s
        else:
            self._first_seq_ids = list(itertools.accumulate((r.num_branches for r in requests[:-1]), initial=0))
            self._arrival_s = [r.arrival_s for r in requests]
        self._open = max_in_flight is None
        #: open loop: requests that have arrived (the next to arrive is request ``_num_arrived``)
        self._num_arrived = 0
        #: closed loop: the requests sent that have not arrived yet, and those arrived and not made
        self._in_flight: deque[Request] = deque()
        self._arrived: deque[Request] = deque()
        self._num_sent = 0
        #: the arrived requests whose groups are not made yet, as [boundary_s, count] in arrival order
        self._joins: deque[list] = deque()
        self._num_made = 0  # groups made (in request order: requests arrive and are made in order)
        self._make = self._make_group  # (one bound method for every join: the queue compares it)
        if not self._open:
            for _ in range(min(max_in_flight, len(requests))):
                self._send(self._next_request())

    def next_s(self) -> float | None:
        """The next arrival's time, or None when no request is on its way."""
        if self._open:
            i = self._num_arrived
            return self._arrival_s[i] if i < len(self._arrival_s) else None
        return self._in_flight[0].arrival_s if self._in_flight else None

    def join(self, scheduler: Scheduler, until_s: float, boundary_s: float) -> None:
        """The requests that arrive by ``until_s`` join the scheduler's queue at the step boundary
        ``boundary_s`` (counted now, made when the queue needs them)."""
        num_joining = 0
        if self._open:
            arrival_s, i = self._arrival_s, self._num_arrived
            while i < len(arrival_s) and arrival_s[i] <= until_s:
                i += 1
            num_joining, self._num_arrived = i - self._num_arrived, i
        else:
            while self._in_flight and self._in_flight[0].arrival_s <= until_s:
                self._arrived.append(self._in_flight.popleft())
                num_joining += 1
        if num_joining:
            self._joins.append([boundary_s, num_joining])
            scheduler.add_arrivals(num_joining, self._make)

    def _make_group(self) -> SequenceGroup:
        """The group of the earliest arrived request whose group is not made yet."""
        join = self._joins[0]
        join[1] -= 1
        if not join[1]:
            self._joins.popleft()
        request = self._next_request() if self._open else self._arrived.popleft()
        group = SequenceGroup(request, int(self._first_seq_ids[self._num_made]))
        group.boundary_s = join[0]
        self._num_made += 1
        return group

    def _next_request(self) -> Request:
        """The next request in order (made with a batch of the following ones: making requests
        is the workload's work, not the loop's)."""
        if not self._made:
            with self._recorder.outside_loop():
                start = self._num_made if self._open else self._num_sent
                self._made.extend(self._requests[start : start + REQUEST_BATCH])
        return self._made.popleft()

    def send_after_finishes(self, num_finished: int, clock_s: float) -> None:
        """A closed loop's client sends one request per finished one, at the end of the step."""
        if self._open:
            return
        for _ in range(min(num_finished, len(self._requests) - self._num_sent)):
            request = self._next_request()
            self._send(replace(request, arrival_s=max(request.arrival_s, clock_s)))

    def _send(self, request: Request) -> None:
        self._in_flight.append(request)
        self._num_sent += 1


def _truncate(result: StepResult, num_steps: int) -> StepResult:
    """The first ``num_steps`` steps of a run's result (each step's time does not depend on later ones)."""
    if num_steps == len(result.durations_s):
        return result
    durations_s = result.durations_s[:num_steps]
    if result.clock_s is not None:
        clock_s = result.clock_s[: num_steps + 1]
    else:
        clock_s = np.cumsum(np.concatenate(([result.start_s], durations_s)))
    decode_s = added_in_order(0.0, durations_s)
    added_s = None if result.page_map_added_s is None else result.page_map_added_s[:num_steps]
    return StepResult(
        result.start_s, durations_s, float(clock_s[-1]), decode_s=decode_s, clock_s=clock_s, page_map_added_s=added_s
    )
