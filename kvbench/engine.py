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
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from kvbench.core.request import Request
from kvbench.core.sequence import SequenceGroup
from kvbench.core.step import Executor, StepPlan, StepResult
from kvbench.metrics.recorder import Recorder, RunRecord
from kvbench.sched.scheduler import Scheduler

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
    ) -> None:
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1 or None, got {max_in_flight!r}")
        self.scheduler = scheduler
        self.executor = executor
        self.event_driven = event_driven
        self.on_finished = on_finished  # progress: called with the number of requests just finished
        self.max_in_flight = max_in_flight  # a closed-loop client's requests in flight; None: open loop

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

    def _run(self, requests: list[Request]) -> RunRecord:
        scheduler = self.scheduler
        scheduler.check_fits(requests)
        recorder = Recorder(scheduler.allocator.kv_bytes_per_token)
        first_seq_ids = list(itertools.accumulate((r.num_branches for r in requests[:-1]), initial=0))
        # groups (and arrivals_s) hold the requests sent so far, in order: all of them in an open
        # loop; in a closed loop the rest are sent, and get their group, as earlier ones finish
        num_sent = len(requests) if self.max_in_flight is None else min(self.max_in_flight, len(requests))
        groups = [SequenceGroup(r, first) for r, first in zip(requests[:num_sent], first_seq_ids)]
        arrivals_s = [r.arrival_s for r in requests[:num_sent]]
        clock_s, next_arrival, num_finished = 0.0, 0, 0
        while num_finished < len(requests):
            if not scheduler.has_work():  # idle: jump to the next arrival
                clock_s = max(clock_s, arrivals_s[next_arrival])
            while next_arrival < len(groups) and arrivals_s[next_arrival] <= clock_s:
                scheduler.add(groups[next_arrival], clock_s)
                next_arrival += 1
            plan = scheduler.schedule(clock_s)
            result = self._advance(plan, arrivals_s[next_arrival] if next_arrival < len(groups) else None)
            next_arrival = self._arrivals_within(groups, next_arrival, result)
            outcome = scheduler.update(plan, result)
            recorder.record(plan, result, outcome.any_seq_finished)
            num_finished += outcome.num_finished_requests
            self.on_finished(outcome.num_finished_requests)
            clock_s = result.end_s
            for request in requests[len(groups) : len(groups) + outcome.num_finished_requests]:
                # a closed loop sends one request per finished one, at the end of the step; its
                # own arrival_s is only the earliest time it may be sent
                request = replace(request, arrival_s=max(request.arrival_s, clock_s))
                groups.append(SequenceGroup(request, first_seq_ids[len(groups)]))
                arrivals_s.append(request.arrival_s)
        return recorder.finish(groups)

    def _advance(self, plan: StepPlan, next_arrival_s: float | None) -> StepResult:
        """Execute the plan, first stretching a quiet one over as many decode steps as nothing interrupts."""
        if self.event_driven and plan.is_quiet:
            projection = self.scheduler.decode_span(plan, MAX_SPAN_STEPS)
            if projection.num_steps:
                plan.num_steps = 1 + projection.num_steps
                result = self.executor.execute(plan)
                num_extra = projection.num_steps
                if next_arrival_s is not None and self.scheduler.arrival_may_join():
                    # an arrival that may be admitted (an empty queue, or one it may overtake): stop before its step
                    starts_s = result.step_starts_s()
                    num_extra = min(num_extra, int(np.searchsorted(starts_s, next_arrival_s, side="left")) - 1)
                plan.num_steps = 1
                if num_extra > 0:
                    self.scheduler.extend(plan, projection, num_extra)
                    return _truncate(result, plan.num_steps)
        return self.executor.execute(plan)

    def _arrivals_within(self, groups: list[SequenceGroup], next_arrival: int, result: StepResult) -> int:
        """Requests that arrived during a run of steps (behind a blocked queue) join at the first
        step boundary at or after their arrival, as they would have step by step."""
        if len(result.durations_s) == 1:
            return next_arrival
        starts_s = result.step_starts_s()
        while next_arrival < len(groups) and groups[next_arrival].request.arrival_s <= starts_s[-1]:
            boundary = starts_s[bisect.bisect_left(starts_s, groups[next_arrival].request.arrival_s)]
            self.scheduler.add(groups[next_arrival], float(boundary))
            next_arrival += 1
        return next_arrival


def _truncate(result: StepResult, num_steps: int) -> StepResult:
    """The first ``num_steps`` steps of a run's result (each step's time does not depend on later ones)."""
    if num_steps == len(result.durations_s):
        return result
    durations_s = result.durations_s[:num_steps]
    end_s = float(np.cumsum(np.concatenate(([result.start_s], durations_s)))[-1])
    return StepResult(result.start_s, durations_s, end_s, decode_s=float(np.cumsum(durations_s)[-1]))
