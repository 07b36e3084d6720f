"""The decode loop: iteration-level scheduling over a pluggable allocator and preemption policy.

Every step (Orca-style iteration-level batching, no chunked prefill):

1. grow: each running sequence needs one more KV slot (for the token it emitted last step); when
   the allocator says no, the preemption policy evicts sequences until it says yes;
2. admit: waiting sequences, first come first served, while the allocator accepts them (keeping
   the watermark free), the batch has room and the step's prefill-token budget is not spent; the
   first refusal stops admission (no overtaking, so nobody starves);
3. execute: the executor prices the step (``sim``: the cost model);
4. emit: every sequence in the batch emits one token (a prefill emits its first);
5. retire: finished sequences free their memory at the end of the step.

A step is *saturated* when memory binds: the allocator refused the head of the waiting queue or a
running sequence had to be preempted. Utilization "while saturated" is measured over those steps.

Per-step work is proportional to the batch, never to the tokens held, and there are no per-token
Python objects: sequences are counters (:mod:`kvbench.core.sequence`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvbench.memory.allocator import Allocator, SeqShape
from kvbench.app.config import SchedulerConfig
from kvbench.exec.costmodel import CostModel
from kvbench.errors import ConfigError
from kvbench.sched.preemption import PreemptionPolicy
from kvbench.app.progress import progress_bar
from kvbench.core.sequence import Sequence
from kvbench.workload.source import Workload

STEP_COLUMNS = (
    "step", "start_s", "duration_s", "num_running", "num_prefill_seqs", "num_prefill_tokens",
    "num_decode_seqs", "num_waiting", "saturated", "token_bytes", "reserved_future_bytes",
    "internal_bytes", "external_bytes", "free_bytes", "kv_read_bytes", "num_preemptions",
    "allocated_tail_tokens",
)  # fmt: skip
#: (request-table column, Sequence attribute)
REQUEST_COLUMNS = tuple(
    (column, "seq_id" if column == "request_id" else column)
    for column in (
        "request_id", "arrival_s", "prompt_tokens", "output_tokens", "max_tokens", "num_generated",
        "boundary_s", "admitted_s", "prefill_s", "first_token_s", "finish_s", "num_preemptions",
        "num_recomputed_tokens",
    )
)  # fmt: skip
REFUSAL_COLUMNS = ("time_s", "request_id", "reservation_bytes", "free_bytes", "largest_hole_bytes")


@dataclass
class EngineRecord:
    """What one run produced: per-request and per-step tables, admission refusals, wall time."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    refusals: pd.DataFrame
    sim_wall_s: float


class Engine:
    def __init__(
        self,
        allocator: Allocator,
        policy: PreemptionPolicy,
        cost: CostModel,
        scheduler: SchedulerConfig,
        *,
        show_progress: bool = False,
    ) -> None:
        self.allocator = allocator
        self.policy = policy
        self.cost = cost
        self.scheduler = scheduler
        self.show_progress = show_progress
        self.watermark_bytes = int(scheduler.watermark_fraction * allocator.budget_bytes)

    # ---------------------------------------------------------------------------------------------

    def _check_fits(self, seqs: list[Sequence]) -> None:
        """Refuse up front a request that could never run, instead of letting it wait forever."""
        for s in seqs:
            shape = SeqShape(s.prompt_tokens, s.max_tokens, s.final_kv_tokens)
            limit = self.allocator.max_sequence_tokens(shape)
            if s.prompt_tokens + s.output_tokens > s.max_tokens or s.final_kv_tokens > limit:
                room = f"holds at most {limit} tokens per sequence" if limit else "cannot hold it in the whole KV budget"
                raise ConfigError(
                    f"request {s.seq_id} (prompt {s.prompt_tokens} + output {s.output_tokens} tokens, "
                    f"declared S_max {s.max_tokens}) does not fit: allocator {self.allocator.name!r} {room}; "
                    f"shorten the workload's lengths or raise S_max or hardware.kv_budget_bytes"
                )

    def _preempt(self, victim: Sequence, waiting: deque) -> None:
        mechanism = self.policy.mechanism(victim)
        if mechanism != PreemptionPolicy.RECOMPUTE:
            raise ConfigError(
                f"preemption.name={self.policy.name!r} asked for mechanism {mechanism!r}; "
                f"this engine offers: {PreemptionPolicy.RECOMPUTE}"
            )
        # NOTE: the victim loses its cache, never its tokens: num_generated is kept, and the
        # re-prefill on readmission processes prompt + generated tokens.
        self.allocator.free(victim.seq_id)
        victim.num_kv_tokens = 0
        victim.num_preemptions += 1
        waiting.appendleft(victim)

    def run(self, workload: Workload) -> EngineRecord:
        wall_start_s = time.perf_counter()
        n = workload.num_requests
        arrival_s = workload.arrival_s.tolist()
        seqs = [
            Sequence(i, arrival_s[i], p, o, m)
            for i, (p, o, m) in enumerate(
                zip(workload.prompt_tokens.tolist(), workload.output_tokens.tolist(), workload.max_tokens.tolist())
            )
        ]
        self._check_fits(seqs)

        alloc, cost, policy = self.allocator, self.cost, self.policy
        append, allocate = alloc.append, alloc.allocate
        max_num_seqs = self.scheduler.max_num_seqs
        max_batched = self.scheduler.max_num_batched_tokens
        kv_bytes = alloc.kv_bytes_per_token
        keep_free = self.watermark_bytes if alloc.uses_watermark else 0

        waiting: deque[Sequence] = deque()
        running: list[Sequence] = []
        rows: list[tuple] = []
        refusals: list[tuple] = []
        next_arrival, num_finished, clock_s, step = 0, 0, 0.0, 0

        with progress_bar(n, "simulating", enabled=self.show_progress) as advance:
            while num_finished < n:
                if not running and not waiting:
                    clock_s = max(clock_s, arrival_s[next_arrival])  # idle: jump to the next arrival
                while next_arrival < n and arrival_s[next_arrival] <= clock_s:
                    s = seqs[next_arrival]
                    s.boundary_s = clock_s
                    waiting.append(s)
                    next_arrival += 1

                # 1. grow every running sequence by one slot, preempting when memory runs out
                num_preempted, kv_read_tokens, i = 0, 0, 0
                while i < len(running):
                    s = running[i]
                    grew = True
                    while not append(s.seq_id):
                        v = policy.select_victim(running)
                        victim = running.pop(v)
                        self._preempt(victim, waiting)
                        num_preempted += 1
                        if victim is s:
                            grew = False
                            break
                        if v < i:
                            i -= 1
                    if grew:
                        s.num_kv_tokens += 1
                        kv_read_tokens += s.num_kv_tokens
                        i += 1

                # 2. admit first come first served
                admitted: list[Sequence] = []
                prefill_tokens, prefill_s, refused = 0, 0.0, False
                while waiting and len(running) + len(admitted) < max_num_seqs:
                    s = waiting[0]
                    context = s.context_tokens
                    if admitted and prefill_tokens + context > max_batched:
                        break
                    shape = SeqShape(context, s.max_tokens, s.final_kv_tokens)
                    # NOTE: the watermark is headroom for the batch to grow; with an empty batch it
                    # would only stop a request that fits from ever running
                    headroom = keep_free if running or admitted else 0
                    if not allocate(s.seq_id, shape, headroom):
                        refusals.append(self._refusal(clock_s, s, shape))
                        refused = True
                        break
                    waiting.popleft()
                    if s.admitted_s < 0:
                        s.admitted_s = clock_s
                        s.prefill_s = cost.prefill_time_s(context)
                        prefill_s += s.prefill_s
                    else:  # readmitted after recompute preemption: all but the newest token were computed before
                        s.num_recomputed_tokens += context - 1
                        prefill_s += cost.prefill_time_s(context)
                    s.num_kv_tokens = context
                    kv_read_tokens += context
                    prefill_tokens += context
                    admitted.append(s)

                if not running and not admitted:
                    raise RuntimeError(  # _check_fits makes this unreachable; a broken allocator would loop forever
                        f"allocator {alloc.name!r} cannot admit request {waiting[0].seq_id} into an empty cache"
                    )

                # 3. execute
                step_s = cost.step_time_s(prefill_s, len(running), kv_read_tokens)
                head = waiting[0].shape() if waiting else None
                led = alloc.ledger(head)
                end_s = clock_s + step_s
                rows.append((
                    step, clock_s, step_s, len(running) + len(admitted), len(admitted), prefill_tokens,
                    len(running), len(waiting), refused or num_preempted > 0, led.token_bytes, led.reserved_future_bytes,
                    led.internal_bytes, led.external_bytes, led.free_bytes, kv_read_tokens * kv_bytes,
                    num_preempted, (led.reserved_future_bytes + led.internal_bytes) // kv_bytes,
                ))  # fmt: skip

                # 4. emit one token each, 5. retire the finished
                for s in admitted:
                    if s.first_token_s < 0:
                        s.first_token_s = end_s
                running.extend(admitted)
                still_running: list[Sequence] = []
                done_now = 0
                for s in running:
                    s.num_generated += 1
                    if s.num_generated >= s.output_tokens:
                        s.finish_s = end_s
                        alloc.free(s.seq_id)
                        s.num_kv_tokens = 0
                        done_now += 1
                    else:
                        still_running.append(s)
                running = still_running
                num_finished += done_now
                if done_now:
                    advance(done_now)
                clock_s = end_s
                step += 1

        return EngineRecord(
            requests=_requests_frame(seqs),
            steps=pd.DataFrame.from_records(rows, columns=STEP_COLUMNS),
            refusals=pd.DataFrame.from_records(refusals, columns=REFUSAL_COLUMNS),
            sim_wall_s=time.perf_counter() - wall_start_s,
        )

    def _refusal(self, clock_s: float, s: Sequence, shape: SeqShape) -> tuple:
        alloc = self.allocator
        largest = alloc.largest_hole_bytes() if hasattr(alloc, "largest_hole_bytes") else -1
        return (
            clock_s,
            s.seq_id,
            alloc.reservation_tokens(shape) * alloc.kv_bytes_per_token,
            # usable free space: the budget's tail below one slot or block is never counted as free
            alloc.ledger().free_bytes,
            largest,
        )


def _requests_frame(seqs: list[Sequence]) -> pd.DataFrame:
    # the request table's columns are the Sequence counters of the same name (request_id = seq_id)
    frame = pd.DataFrame({column: [getattr(s, attr) for s in seqs] for column, attr in REQUEST_COLUMNS})
    return frame.astype({"request_id": np.int64})
