"""The scheduler: its queues, and the mechanisms every scheduling policy composes.

A scheduling policy (a ``scheduler`` plugin) implements :meth:`Scheduler.schedule_step`, deciding
the order in which a step runs the running requests, resumes swapped ones and admits waiting ones,
by calling the public mechanisms :meth:`Scheduler.run_running`, :meth:`Scheduler.admit` and
:meth:`Scheduler.resume_swapped`. Which waiting request is offered first is the admission queue's
choice (:mod:`kvbench.sched.queue`: ``scheduler.queue=fcfs|priority|shortest_prompt`` or a
plugin's), not the policy's. The mechanisms are shared and live here:

- *compute* a request's next tokens: its decodes, or the next chunk of its prefill. A fan-out's
  first live branch computes the shared prompt; when the prompt is complete the other branches
  fork off it (sharing its blocks, or copying into the ranges reserved at admission);
- *grow or preempt*: when the allocator cannot make room, the preemption policy picks a victim
  among the requests not yet run this step (possibly the one growing) and a mechanism; a swap that
  does not fit the host pool falls back to recompute;
- *admit* the head of the waiting queue (nobody overtakes a refused head), keeping the watermark
  free unless nothing is running;
- *resume* swapped requests, oldest preempted first;
- *reuse cached prefixes* (allocators that ``caches_prefixes``): before a request's first
  allocation the scheduler asks how many leading tokens the cache holds; the sequence starts with
  that many computed, the allocation covers them plus the chunk computed now, and the step (and
  the prompt-token budget) is charged only for the uncached tokens.

Tokens are counted as vLLM v1 does: every sequence has ``num_tokens`` and
``num_computed_tokens``; a step computes some of the difference, and a sequence whose tokens are
all computed samples one more. Admission, growth and preemption all happen while the plan is
built; :meth:`update` then applies what the executor did (samples, finishes, releases).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from kvbench.core.request import Request, distinct_shapes
from kvbench.core.sequence import Sequence, SequenceGroup, Status
from kvbench.core.step import AdmissionRefusal, Mechanism, Preemption, PrefillChunk, StepPlan, StepResult
from kvbench.errors import ConfigError, require
from kvbench.exec.costmodel import CostModel
from kvbench.memory.allocator import NO_PROJECTION, Allocator, DecodeProjection, Refusal, SeqShape
from kvbench.memory.host_pool import HostSwapPool
from kvbench.sched.host_reload import HostReloads
from kvbench.sched.preemption import PreemptionContext, PreemptionPolicy
from kvbench.sched.queue import FcfsQueue, RequestQueue


@dataclass
class SchedulerConfig:
    #: most sequences computing at once (vLLM's max_num_seqs); a fan-out counts each branch
    max_num_seqs: int = 1024
    #: tokens computed per step: prompt tokens admitted (a longer prompt alone still runs), or for
    #: chunked prefill the whole step's budget, decodes included (vLLM's max_num_batched_tokens)
    max_num_batched_tokens: int = 8192
    #: fraction of the KV budget kept free when admitting, so running sequences can grow (vLLM's
    #: watermark; 0 allowed); allocators that reserve a sequence's whole future ignore it
    watermark_fraction: float = 0.01
    #: the admission queue, by name (kvbench.sched.queue): fcfs, priority, shortest_prompt, or a plugin's
    queue: str = "fcfs"
    #: the watermark is int(watermark_fraction x blocks) whole blocks, counting every block the budget
    #: holds (vLLM's rule); false: watermark_fraction of the budget's bytes
    watermark_in_blocks: bool = False
    #: admit a waiting request only when blocks for all its known tokens (its whole prompt, and its
    #: output so far after a preemption) fit now, less any cache hit, even when only a first chunk
    #: is computed (vLLM V1's scheduler_reserve_full_isl); false: the first chunk must fit
    full_prompt_admission: bool = False
    #: most tokens one request computes in a step when more than one request is running or waiting
    #: (vLLM's long_prefill_token_threshold); 0: no cap
    long_prefill_token_threshold: int = 0
    #: a strict, shared token budget without chunking: decodes are charged to max_num_batched_tokens
    #: too (mixed) and a prompt is admitted only if it fits what is left, whole, even the step's
    #: first (vLLM V1 with chunked prefill off; nano-vllm); false: the budget counts prompt tokens
    #: only and a longer prompt alone still runs
    decodes_in_budget: bool = False
    #: max_num_seqs caps the sequences one step computes, not the running set: running requests
    #: beyond the cap wait (in order) for a later step (nano-vllm's rule); false: the running set
    step_seq_cap: bool = False
    #: prefill_first admits at most one chunked prompt per step: the head prompt, if it needs more
    #: than the budget left, takes what is left and continues over the next steps, and only a step's
    #: first prompt may be chunked (nano-vllm's rule); false: whole prompts only
    head_only_chunking: bool = False

    def validate(self) -> None:
        require(self.max_num_seqs >= 1, "scheduler.max_num_seqs", self.max_num_seqs, "use an integer >= 1")
        require(
            self.max_num_batched_tokens >= 1,
            "scheduler.max_num_batched_tokens",
            self.max_num_batched_tokens,
            "use an integer >= 1",
        )
        require(
            0.0 <= self.watermark_fraction < 1.0,
            "scheduler.watermark_fraction",
            self.watermark_fraction,
            "use a fraction in [0, 1)",
        )
        require(
            isinstance(self.queue, str) and bool(self.queue), "scheduler.queue", self.queue, "name a queue, e.g. fcfs"
        )
        for key in ("watermark_in_blocks", "full_prompt_admission", "decodes_in_budget", "step_seq_cap"):
            require(isinstance(getattr(self, key), bool), f"scheduler.{key}", getattr(self, key), "use true or false")
        require(
            isinstance(self.head_only_chunking, bool),
            "scheduler.head_only_chunking",
            self.head_only_chunking,
            "use true or false",
        )
        require(
            self.long_prefill_token_threshold >= 0,
            "scheduler.long_prefill_token_threshold",
            self.long_prefill_token_threshold,
            "use 0 (no cap) or a token count >= 1",
        )


class StepOutcome(NamedTuple):
    num_finished_requests: int
    #: some sequence finished at the end of the step (the next step runs a different batch)
    any_seq_finished: bool


def _available_bytes(ledger) -> int:
    """Bytes an allocation may take: free, and cached but evictable."""
    return ledger.free_bytes + ledger.cached_bytes


def _before_memory_rises(projection: DecodeProjection, available_bytes: int) -> DecodeProjection:
    """The steps of a projected run before the first whose free and cached bytes exceed
    ``available_bytes`` (what the step's decisions saw, at its start and at its end). A scheduler
    decides at a step's start or end, and every such decision (an admission, a swap-in, a prompt
    chunk) is refused with less memory if it was refused with more, so these steps repeat the
    first one's decisions; the step that would see more memory is taken on its own."""
    if not projection.num_steps:
        return projection
    free, cached = projection.ledgers["free_bytes"], projection.ledgers["cached_bytes"]
    if isinstance(free, list):
        num_steps = next((j for j, (f, c) in enumerate(zip(free, cached)) if f + c > available_bytes), len(free))
    else:
        over = np.flatnonzero(np.asarray(free) + np.asarray(cached) > available_bytes)
        num_steps = int(over[0]) if len(over) else len(free)
    if num_steps == projection.num_steps:
        return projection
    if not num_steps:
        return NO_PROJECTION
    pages = projection.pages_mapped
    return DecodeProjection(
        num_steps,
        {name: values[:num_steps] for name, values in projection.ledgers.items()},
        None if pages is None else pages[:num_steps],
    )


class _Work:
    """One request's share of a step, committed to the plan only once all of it fits."""

    __slots__ = ("group", "decodes", "chunks", "samples", "forks", "kv_read_tokens", "grown")

    def __init__(self, group: SequenceGroup) -> None:
        self.group = group
        #: (sequence, tokens computed before this step) for every growth, to take it back
        self.grown: list[tuple[Sequence, int]] = []
        self.decodes: list[Sequence] = []
        self.chunks: list[PrefillChunk] = []
        self.samples: list[Sequence] = []
        self.forks: list[tuple[Sequence, Sequence]] = []
        self.kv_read_tokens = 0


def _decoding_run(running: list[SequenceGroup], start: int, end: int) -> tuple[list[Sequence], list[int]]:
    """The sequences of ``running[start:end]`` up to the first group that is not a one-sequence
    request decoding (its next token is its only one to compute), and their ids: a decode step's
    common case."""
    run, seq_ids = [], []
    for group in running[start:end]:
        seqs = group.seqs
        if len(seqs) != 1:
            break
        seq = seqs[0]
        context = seq.num_computed_tokens
        if seq.num_tokens != context + 1 or context < seq.prompt_tokens:
            break
        run.append(seq)
        seq_ids.append(seq.seq_id)
    return run, seq_ids


class Scheduler:
    """A scheduling-policy plugin: ``name`` matches ``conf/scheduler/<name>.yaml``.

    The contract: a subclass implements :meth:`schedule_step` with the mechanisms
    :meth:`run_running`, :meth:`admit` and :meth:`resume_swapped` (and may read, never reorder,
    ``running``, ``waiting`` and ``swapped``). Everything else (admission order, growth,
    preemption, forks, prefix-cache hits, finishing) is the base class's, so the engine, the
    event-driven loop and the recorder work for any policy. ``kvbench.testing.SchedulingConformance``
    checks a subclass.
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
        # NOTE: growth headroom only matters to allocators that allocate on demand
        reserves = allocator.capabilities.reserves_future
        self.watermark_bytes = 0 if reserves else self._watermark_bytes()
        self._headroom_bytes = 0
        self._refused: tuple[SeqShape, Refusal] | None = None  # why the last admission failed
        self._caches_prefixes = allocator.capabilities.caches_prefixes
        # a run of decode steps may free memory (sliding windows): what was free and cached when
        # the step began, so that a projected run stops before a refused request could fit
        self._frees_during_decode = allocator.capabilities.frees_during_decode
        self._available_at_start_bytes = 0
        # the cache hit counted by the admission in progress, to take back if it is refused:
        # (group, lost positions served back from the cache, new prompt positions served)
        self._admission_hit: tuple[SequenceGroup, int, int] | None = None
        self._work: _Work | None = None  # the request whose tokens are being scheduled
        self._step = 0
        #: requests running or waiting when the step began (who a long prefill would starve)
        self._num_eligible = 0
        # victims taken this step from requests that had already run, and the tokens they gave back
        self._num_earlier_victims = self._returned_tokens = 0
        #: preemptions since a step last sampled a token
        self._preemptions_without_a_token = 0
        #: reloads from the allocator's host tier of evicted prefix blocks (None: no host tier)
        host_cache = getattr(allocator, "host_cache", None)
        self.host_reloads = (
            None
            if host_cache is None
            else HostReloads(allocator, cost, blocking=getattr(allocator.config, "host_reload", "") == "blocking")
        )

    # --- what the engine calls -------------------------------------------------------------------

    def check_fits(self, requests: Seq[Request]) -> None:
        """Refuse up front a request that could never run, instead of letting it wait forever."""
        for r in distinct_shapes(requests):  # one of each shape, the first of it in arrival order
            shape = SeqShape(r.prompt_tokens, r.s_max_tokens, r.final_kv_tokens, r.num_branches, r.prompt_tokens)
            what = (
                f"request {r.request_id} (prompt {r.prompt_tokens} + output {r.max_output_tokens} tokens"
                f"{f' x {r.num_branches} branches' if r.num_branches > 1 else ''}, declared S_max {r.s_max_tokens})"
            )
            if r.prompt_tokens + r.max_output_tokens > r.s_max_tokens:
                raise ConfigError(f"{what} is longer than its declared S_max; shorten it or raise S_max")
            budget = self.config.max_num_batched_tokens
            if (
                self.config.decodes_in_budget
                and not self.chunks_prompts
                and r.prompt_tokens + sum(o - 1 for o in r.branch_output_tokens)
                > budget  # a readmission: all but the last tokens
            ):
                raise ConfigError(
                    f"{what} can never be admitted whole within scheduler.max_num_batched_tokens={budget} "
                    "(decodes_in_budget: a prompt, or a preempted request's prompt and output, runs in one "
                    "step); raise it to the longest request or set scheduler.decodes_in_budget=false"
                )
            if r.num_branches > self.config.max_num_seqs:
                raise ConfigError(
                    f"{what} has more branches than scheduler.max_num_seqs={self.config.max_num_seqs}; "
                    "raise it or lower the fan-out"
                )
            if not self.allocator.fits_in_empty(shape):
                limit = self.allocator.max_sequence_tokens(shape)
                room = (
                    f"holds at most {limit} tokens per sequence" if limit else "cannot hold it in the whole KV budget"
                )
                if limit and shape.final_kv_tokens <= limit:
                    room = "cannot hold all its branches at once in the whole KV budget"
                raise ConfigError(
                    f"{what} does not fit: allocator {self.allocator.name!r} {room}; shorten the "
                    "workload's lengths or raise S_max or hardware.kv_budget_bytes"
                )

    def add_arrivals(self, num_requests: int, make: Callable[[], SequenceGroup]) -> None:
        """``num_requests`` requests arrive; each call of ``make`` makes the next one's group, its
        ``boundary_s`` set, in arrival order. The queue makes them when it needs them: a
        first-come-first-served queue only when each reaches its head."""
        self.waiting.add_deferred(num_requests, make)

    def wake_s(self) -> float | None:
        """When a host-tier reload in flight lands, so that the waiting request may be admitted at
        the next step boundary (the engine ends a run of decode steps there, and an idle engine
        waits for it); None when none is in flight."""
        return None if self.host_reloads is None else self.host_reloads.wake_s()

    def _reload_lands_after(self, clock_s: float) -> bool:
        wake_s = self.wake_s()
        return wake_s is not None and wake_s > clock_s

    def arrival_may_join(self) -> bool:
        """Whether a request arriving now could be admitted ahead of everything waiting: the queue
        is empty, or it lets later arrivals overtake (the engine then ends a quiet run at arrivals)."""
        return not self.waiting or not self.waiting.fifo

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.swapped or self.held)

    def schedule(self, clock_s: float) -> StepPlan:
        """Decide the next step."""
        plan = StepPlan(self._step, clock_s)
        self._num_eligible = len(self.running) + len(self.waiting)
        if self.host_reloads is not None:
            self.host_reloads.start_step(clock_s, self.waiting.peek() if self.waiting else None)
        if self._frees_during_decode:
            self._available_at_start_bytes = _available_bytes(self.allocator.ledger())
        self.schedule_step(plan)
        plan.copies.extend(self.allocator.drain_copies())
        if self.allocator.capabilities.maps_pages:  # vAttention: the pages this step mapped, to be priced
            plan.page_mapping = self.allocator.drain_page_mapping()
        plan.ledger = self.allocator.ledger(self._head_shape())
        plan.num_shared_blocks = self.allocator.num_shared_blocks()
        plan.shared_bytes_saved = self.allocator.shared_bytes_saved()
        plan.num_running = self.num_running_seqs
        plan.num_waiting = len(self.waiting)
        plan.num_swapped = len(self.swapped)
        if not plan.has_work and not self._reload_lands_after(clock_s):
            raise RuntimeError(  # check_fits makes this unreachable; a broken plugin would loop forever
                f"scheduler {self.name!r} made no progress at step {self._step} "
                f"({len(self.running)} running, {len(self.waiting)} waiting, {len(self.swapped)} swapped)"
            )
        if plan.decodes or plan.samples:
            self._preemptions_without_a_token = 0
        elif plan.preemptions:
            self._preemptions_without_a_token += len(plan.preemptions)
            if self._preemptions_without_a_token > self.max_preemptions_without_a_token:
                victim = getattr(self.policy.config, "victim", None)
                raise RuntimeError(
                    f"scheduler {self.name!r}, preemption {self.policy.name!r}"
                    f"{f' (victim {victim!r})' if victim else ''}: {self._preemptions_without_a_token:,} "
                    f"preemptions in a row without a token sampled, at step {self._step} ({len(self.running)} "
                    f"running, {len(self.waiting)} waiting, {len(self.swapped)} swapped): the requests "
                    "preempt each other for ever"
                )
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

    def decode_span(self, plan: StepPlan, max_steps: int) -> DecodeProjection:
        """How many more identical decode steps a quiet plan can stand for (the first finish is
        the last of them), and the ledger after each, without taking them."""
        return self.project_span(plan, self.decode_span_limit(plan, max_steps))

    def decode_span_limit(self, plan: StepPlan, max_steps: int) -> int:
        """At most how many more identical decode steps a quiet plan may stand for, memory aside:
        up to the step before the first of its sequences finishes (0: none)."""
        if not plan.is_quiet or plan.has_beam_search:
            return 0
        until_finish = min([seq.end_tokens - seq.num_tokens for seq in plan.decodes]) - 1
        return max(0, min(until_finish, max_steps))

    def project_span(self, plan: StepPlan, limit: int) -> DecodeProjection:
        """The next ``limit`` (at most) decode steps of a quiet plan's sequences, as memory allows."""
        if limit <= 0:
            return NO_PROJECTION
        seq_ids = [seq.seq_id for seq in plan.decodes]
        if self._frees_during_decode and self._memory_may_change_plan(plan):
            available_bytes = _available_bytes(plan.ledger)
            if available_bytes > self._available_at_start_bytes:
                return NO_PROJECTION  # the next step's decisions already see more than this one's
            return _before_memory_rises(
                self.allocator.project_decode(seq_ids, limit, self._head_shape()), available_bytes
            )
        return self.allocator.project_decode(seq_ids, limit, self._head_shape())

    def _memory_may_change_plan(self, plan: StepPlan) -> bool:
        """Whether memory freed during a run of decode steps could change a later step: a request
        waits or is swapped out, or a running sequence did not compute this step (a prompt chunk
        that did not fit, or one past the step's sequence cap)."""
        return bool(self.waiting or self.swapped or len(plan.decodes) < self.num_running_seqs)

    def extend(self, plan: StepPlan, projection: DecodeProjection, num_extra_steps: int) -> None:
        """Make a quiet plan stand for ``num_extra_steps`` more decode steps (``decode_span`` said they fit)."""
        decodes = plan.decodes
        seq_ids = [seq.seq_id for seq in decodes]
        if self._frees_during_decode and self._caches_prefixes:
            # windows give cached blocks back while other sequences take blocks: which cached block
            # a take evicts depends on the order of the steps, so they are appended step by step
            fitted = all(self.allocator.append_each(seq_ids, 1) == len(seq_ids) for _ in range(num_extra_steps))
        else:
            fitted = self.allocator.append_each(seq_ids, num_extra_steps) == len(seq_ids)
        if not fitted:
            raise RuntimeError(f"allocator {self.allocator.name!r} refused a step its projection allowed")
        for seq in decodes:
            seq.num_computed_tokens += num_extra_steps
        plan.num_steps += num_extra_steps
        plan.span_ledgers = {name: values[:num_extra_steps] for name, values in projection.ledgers.items()}
        if plan.page_mapping is not None:  # the steps' pages were projected; the appends mapped them at once
            plan.span_pages_mapped = projection.pages_mapped[:num_extra_steps]
            num_pages = self.allocator.drain_page_mapping().num_pages
            if num_pages != int(np.sum(plan.span_pages_mapped)):
                raise RuntimeError(f"allocator {self.allocator.name!r} mapped other pages than it projected")

    # --- the policy ------------------------------------------------------------------------------

    def schedule_step(self, plan: StepPlan) -> None:
        """Fill ``plan`` with this step's work, calling :meth:`run_running`, :meth:`admit` and
        :meth:`resume_swapped` in the policy's order. The one method a scheduler plugin writes."""
        legacy = getattr(self, "_schedule", None)  # a plugin written before the contract was public
        if legacy is None:
            raise NotImplementedError(f"scheduler {self.name!r} does not implement schedule_step")
        legacy(plan)

    # --- mechanisms ------------------------------------------------------------------------------

    def run_running(self, plan: StepPlan, token_budget: int | None = None) -> int:
        """Compute the running requests' next tokens in admission order (decodes, or prefill
        chunks within ``token_budget``), preempting when memory runs out. Returns tokens used.
        With ``step_seq_cap`` at most ``max_num_seqs`` sequences compute; the rest wait their turn
        in order."""
        used, index = 0, 0
        running, append, decodes = self.running, self.allocator.append, plan.decodes
        cap = self.config.max_num_seqs if self.config.step_seq_cap else None
        while index < len(running):
            if token_budget is not None and used >= token_budget:
                break
            if cap is not None and self._seqs_counted(plan) >= cap:
                break
            if cap is None:
                # NOTE: the hot path: the run of one-sequence requests decoding from here on (a token
                # each, within the budget), appended in one call. The first that finds no room, and
                # any other request, goes through _compute
                end = len(running) if token_budget is None else min(len(running), index + token_budget - used)
                batch, seq_ids = _decoding_run(running, index, end)
                if batch:
                    num_fitted = self.allocator.append_each(seq_ids, 1)
                    all_fitted = num_fitted == len(batch)
                    if not all_fitted:
                        del batch[num_fitted:]
                    read_tokens = 0
                    for seq in batch:
                        context = seq.num_computed_tokens + 1
                        seq.num_computed_tokens = context
                        read_tokens += context
                    decodes.extend(batch)
                    plan.kv_read_tokens += read_tokens
                    used += num_fitted
                    index += num_fitted
                    if all_fitted:
                        continue
            group = running[index]
            seqs = group.seqs
            if cap is not None and len(seqs) == 1:
                # NOTE: the hot path with the step's sequences capped (step_seq_cap), one at a time
                seq = seqs[0]
                context = seq.num_computed_tokens
                if seq.num_tokens == context + 1 and context >= seq.prompt_tokens and append(seq.seq_id, 1):
                    seq.num_computed_tokens = context + 1
                    decodes.append(seq)
                    plan.kv_read_tokens += context + 1
                    used += 1
                    index += 1
                    continue
            budget = None if token_budget is None else token_budget - used
            budget = self._chunk_cap(budget)
            tokens = self._compute(plan, group, budget, index)
            index, used = self._after_earlier_victims(index, used)
            if tokens is None:
                continue  # the group itself was preempted: the next one is now at `index`
            used += tokens
            index += 1
        return used

    def admit(self, plan: StepPlan, token_budget: int | None, chunked: bool = False, chunk_head: bool = False) -> int:
        """Admit waiting requests from the head of the queue, within the sequence cap and
        ``token_budget`` (None: no budget), stopping at the first that does not fit: whole prompts
        (a longer one alone still runs, unless ``decodes_in_budget``), or chunks when ``chunked``.
        ``chunk_head``: the step's first prompt (none computed yet this step) may be a chunk of
        what the budget leaves, later ones must fit whole (nano-vllm). Returns the tokens scheduled."""
        cfg = self.config
        used = 0
        # the prompt must fit what is left, even the step's first (unless that one may be chunked)
        whole_only = cfg.decodes_in_budget or chunk_head
        while self.waiting:
            group = self.waiting.peek()
            if self._seqs_counted(plan) + group.num_live > cfg.max_num_seqs:
                break
            if chunked or (chunk_head and not plan.prefills):
                budget = token_budget - used
                if budget <= 0:
                    break
                budget = self._chunk_cap(budget)
            else:
                budget = None
                if token_budget is not None and (used or whole_only):
                    if used + self._uncached_admission_tokens(group) > token_budget:
                        break
            reloads = self.host_reloads
            if reloads is not None:
                headroom = self.watermark_bytes if self.num_running_seqs else 0
                shape = group.shape(self._first_allocation_tokens(group))
                if not reloads.before_admission(plan, group, shape, headroom):
                    break  # its blocks are on their way from host memory: nobody overtakes it
            tokens = self._admit_group(plan, group, budget)
            if reloads is not None:
                hit = self._admission_hit
                reloads.after_admission(plan, group, tokens is not None, hit[1] if hit and hit[0] is group else 0)
            if tokens is None:
                break
            self.waiting.pop()
            used += tokens
        return used

    def continue_prefills(self, plan: StepPlan, token_budget: int) -> int:
        """Compute the next chunk of every running request whose prompt (or recomputation) is
        not complete yet, in admission order, within ``token_budget``; decoding requests are
        left alone. A chunk that does not fit waits for memory (no one is preempted for it: the
        step then decodes, which frees memory as requests finish). Returns the tokens used."""
        used = 0
        for group in list(self.running):
            if used >= token_budget:
                break
            if not any(s.num_pending_tokens > 1 or s.num_computed_tokens < s.prompt_tokens for s in group.live_seqs()):
                continue
            tokens = self._compute(plan, group, self._chunk_cap(token_budget - used), None)
            if tokens is None:
                break  # refused, changing nothing: later ones wait behind it
            used += tokens
        return used

    def resume_swapped(self, plan: StepPlan) -> bool:
        """Swap requests back in, oldest preempted first, while they fit (keeping the watermark
        free unless nothing runs). They compute from the next step on. True when none is left."""
        while self.swapped:
            group = self.swapped[0]
            if self.num_running_seqs + group.num_live > self.config.max_num_seqs:
                return False
            seqs = [s for s in group.seqs if s.status is Status.SWAPPED]
            headroom = self.watermark_bytes if self.num_running_seqs else 0
            transfer = self.allocator.swap_in([s.seq_id for s in seqs], headroom)
            if transfer is None:
                return False
            self.swapped.popleft()
            self.host_pool.release(group.request_id)
            for seq in seqs:
                seq.status = Status.RUNNING
            group.status = Status.RUNNING
            self.running.append(group)
            self.num_running_seqs += group.num_live
            plan.swap_in.append(transfer)
            plan.swap_in_request_ids.append(group.request_id)
        return True

    # --- computing one request's tokens ------------------------------------------------------------

    # the names the built-in policies used before the contract was public (kept for older plugins)
    _run_running = run_running
    _admit = admit
    _resume_swapped = resume_swapped

    def _seqs_counted(self, plan: StepPlan) -> int:
        """What ``max_num_seqs`` caps: the running set, or with ``step_seq_cap`` this step's batch."""
        if self.config.step_seq_cap:
            return len(plan.decodes) + len({id(chunk.seq) for chunk in plan.prefills})
        return self.num_running_seqs

    def _chunk_cap(self, budget: int | None) -> int | None:
        """``long_prefill_token_threshold``: one request's share of a step, when others compete."""
        cap = self.config.long_prefill_token_threshold
        if cap and self._num_eligible > 1:
            return cap if budget is None or cap < budget else budget
        return budget

    def _watermark_bytes(self) -> int:
        """The headroom kept free at admission: a share of the budget's bytes, or of its blocks."""
        cfg, alloc = self.config, self.allocator
        if not cfg.watermark_in_blocks:
            return int(cfg.watermark_fraction * alloc.budget_bytes)
        block_bytes = alloc.block_size_tokens * alloc.kv_bytes_per_token
        return int(cfg.watermark_fraction * (alloc.budget_bytes // block_bytes)) * block_bytes

    def _whole_fits(self, group: SequenceGroup) -> bool:
        """``full_prompt_admission``: blocks for every token the request knows (its prompt, and
        its output so far after a preemption) can be taken now, the watermark kept. Allocators that
        reserve the future check the whole request at its first allocation anyway."""
        if self.allocator.capabilities.reserves_future:
            return True
        shape = group.shape(self._first_allocation_tokens(group))
        if self.allocator.can_allocate(shape, self._headroom_bytes):
            return True
        self._refused = shape, self.allocator.refusal_reason(shape, self._headroom_bytes)
        return False

    def _admit_group(self, plan: StepPlan, group: SequenceGroup, budget: int | None) -> int | None:
        self._headroom_bytes = self.watermark_bytes if self.num_running_seqs else 0
        self._admission_hit = None
        seqs = group.seqs
        if self.config.full_prompt_admission and not self._whole_fits(group):
            tokens = None
        elif len(seqs) == 1:
            tokens = self._compute_one(plan, group, seqs[0], budget, None)
        elif self._caches_prefixes and self._is_readmission(group) and not self._forked_fits(group):
            tokens = None  # refused before touching the cache (see _forked_fits)
        else:
            tokens = self._compute(plan, group, budget, None)
        if tokens is None:
            if self._admission_hit is not None:  # a fan-out whose branches did not fit: not admitted
                self._undo_hit(*self._admission_hit)
            shape, reason = self._refused
            self._release(group)
            self.allocator.drain_copies()  # copies of an admission that did not happen
            alloc = self.allocator
            plan.refusal = AdmissionRefusal(
                group,
                reason,
                alloc.reservation_tokens(shape) * alloc.kv_bytes_per_token,
                alloc.ledger().free_bytes,
                alloc.largest_hole_bytes(),
            )
            return None
        group.status = Status.RUNNING
        plan.num_admitted += 1
        if group.admitted_s < 0:
            group.admitted_s = plan.start_s
        self.running.append(group)
        self.num_running_seqs += group.num_live
        return tokens

    def _compute(self, plan: StepPlan, group: SequenceGroup, budget: int | None, index: int | None) -> int | None:
        """Schedule up to ``budget`` (None: all) new tokens of ``group``. ``index`` is its place in
        ``running`` (growth may preempt ``running[index:]``); None while admitting it (nothing is
        preempted then). Returns the tokens scheduled, or None if the group could not run."""
        if len(group.seqs) == 1:
            return self._compute_one(plan, group, group.seqs[0], budget, index)
        plan.copies.extend(self.allocator.drain_copies())
        work = self._work = _Work(group)
        remaining = budget
        if group.needs_fork():  # the shared prompt first, on the first live branch
            root = group.root()
            if root.status is Status.WAITING and self._caches_prefixes:
                root.num_computed_tokens = self._cache_hit(group, group.request.prompt_tokens)
            n = group.request.prompt_tokens - root.num_computed_tokens
            if remaining is not None:
                n = min(n, remaining)
            if n > 0:
                if not self._grow(plan, work, group, root, n, index):
                    return self._drop(index is None)
                remaining = None if remaining is None else remaining - n
            if root.num_computed_tokens < group.request.prompt_tokens:
                return self._commit(plan, group, work)
            self._fork(work, group, root)
        for seq in group.seqs:
            if seq.status is Status.FINISHED or seq.status is Status.SWAPPED:
                continue
            if seq.status is Status.WAITING and self._caches_prefixes and not group.needs_fork():
                seq.num_computed_tokens = self._cache_hit(group, seq.num_tokens)  # a readmitted last branch
            n = seq.num_pending_tokens
            if remaining is not None:
                n = min(n, remaining)
            if n <= 0 or (seq.status is Status.WAITING and group.needs_fork()):
                continue
            if not self._grow(plan, work, group, seq, n, index):
                return self._drop(index is None)
            remaining = None if remaining is None else remaining - n
        if group.request.beam_fork_probability and group.is_forked:
            plan.has_beam_search = True
            if work.decodes and not work.chunks:
                self._reshuffle_beams(work, group)
        return self._commit(plan, group, work)

    def _allocate(self, group: SequenceGroup, seq: Sequence, n: int) -> bool:
        """A request's first allocation (admission): refused rather than preempting anyone. The
        sequence already counts the tokens the cache said it holds (:meth:`_cache_hit`); the
        allocation covers them and the ``n`` computed now."""
        cached = seq.num_computed_tokens
        shape = group.shape(cached + n)
        answer = self.allocator.allocate(seq.seq_id, shape, self._headroom_bytes)
        if answer is None:
            self._refused = shape, self.allocator.refusal_reason(shape, self._headroom_bytes)
            return False
        if answer != cached:
            raise RuntimeError(
                f"allocator {self.allocator.name!r} served {answer} cached tokens of request "
                f"{group.request_id}, having said {cached}"
            )
        seq.status = Status.RUNNING
        if cached:
            self._count_hit(group, cached)
        return True

    @staticmethod
    def _is_readmission(group: SequenceGroup) -> bool:
        """A fan-out preempted after its branches had emitted tokens: re-admitting it allocates
        the prompt, then grows every branch (a first admission only allocates the prompt)."""
        prompt = group.request.prompt_tokens
        return any(seq.num_tokens > prompt for seq in group.live_seqs())

    def _forked_fits(self, group: SequenceGroup) -> bool:
        """Whether a re-admitted fan-out (its branches past the prompt, preempted since) surely
        fits, as the allocator counts it (:meth:`Allocator.can_readmit_branches`), the watermark
        kept. Re-admitting it allocates the shared prompt first, then each branch; when a branch
        does not fit, the admission is taken back. Under a prefix cache taking back is not
        neutral: the prompt's allocation has reused and evicted cached blocks. An admission that is
        refused must change nothing (the event-driven loop skips the steps where it is retried), so
        a prefix cache only starts a re-admission that cannot fail. With nothing running it is not
        applied (nothing would free memory, and no decode run is skipped meanwhile)."""
        if not self.num_running_seqs:  # nothing runs: nothing to skip, and waiting would wait forever
            return True
        branch_tokens = [seq.num_tokens for seq in group.live_seqs()]
        if self.allocator.can_readmit_branches(group.request.prompt_tokens, branch_tokens, self._headroom_bytes):
            return True
        shape = group.shape(self._first_allocation_tokens(group))
        self._refused = shape, Refusal.NO_MEMORY
        return False

    def _cache_hit(self, group: SequenceGroup, num_tokens: int) -> int:
        """Leading tokens of a sequence of ``num_tokens`` the prefix cache would serve if it were
        allocated now (never all of them: one is computed, for its logits)."""
        if not group.request.prefix_hashes and not self.allocator.capabilities.caches_own_blocks:
            return 0
        return self.allocator.num_cached_tokens(group.shape(num_tokens))

    def _count_hit(self, group: SequenceGroup, cached: int) -> None:
        """Positions served from the cache: those a recompute preemption lost come back without
        being computed again (not hits), the rest are prompt positions never computed (hits)."""
        restored = min(cached, group.num_lost_tokens)
        group.num_lost_tokens -= restored
        group.num_recomputed_tokens -= restored
        group.recompute_cached_tokens += restored
        group.cached_prompt_tokens += cached - restored
        self._admission_hit = (group, restored, cached - restored)

    def _undo_hit(self, group: SequenceGroup, restored: int, new: int) -> None:
        group.num_lost_tokens += restored
        group.num_recomputed_tokens += restored
        group.recompute_cached_tokens -= restored
        group.cached_prompt_tokens -= new
        self._admission_hit = None

    def _compute_one(
        self, plan: StepPlan, group: SequenceGroup, seq: Sequence, budget: int | None, index: int | None
    ) -> int | None:
        """:meth:`_compute` for the common request of one sequence: its work goes straight into
        the plan (nothing to fork, and a refused growth took nothing, so nothing to take back)."""
        if seq.status is Status.WAITING and self._caches_prefixes:
            seq.num_computed_tokens = self._cache_hit(group, seq.num_tokens)  # 0 until now: it held nothing
        context = seq.num_computed_tokens
        n = seq.num_tokens - context
        if budget is not None and n > budget:
            n = budget
        if n <= 0:
            return 0
        if seq.status is Status.WAITING:
            if not self._allocate(group, seq, n):
                return None
        elif not self.allocator.append(seq.seq_id, n) and not self._room(plan, group, seq, n, index):
            return None
        seq.num_computed_tokens = context + n
        if n == 1 and seq.num_tokens == context + 1 and seq.num_tokens > seq.prompt_tokens:
            plan.decodes.append(seq)
            plan.kv_read_tokens += context + 1
            return 1
        recomputed = group.num_lost_tokens
        if recomputed:
            recomputed = n if n < recomputed else recomputed
            group.num_lost_tokens -= recomputed
        plan.prefills.append(PrefillChunk(seq, n, context, recomputed))
        if seq.num_computed_tokens == seq.num_tokens:
            plan.samples.append(seq)
        return n

    def _grow(
        self, plan: StepPlan, work: _Work, group: SequenceGroup, seq: Sequence, n: int, index: int | None
    ) -> bool:
        """Room for ``n`` more tokens of ``seq`` (preempting when it does not fit), recorded in ``work``."""
        if not self._room(plan, group, seq, n, index):
            return False
        context = seq.num_computed_tokens
        work.grown.append((seq, context))
        seq.num_computed_tokens = context + n
        if n == 1 and seq.num_tokens == context + 1 and seq.num_tokens > seq.prompt_tokens:
            work.decodes.append(seq)
            work.kv_read_tokens += context + 1
            return True
        recomputed = min(n, group.num_lost_tokens - sum(c.num_recomputed_tokens for c in work.chunks))
        work.chunks.append(PrefillChunk(seq, n, context, recomputed))
        if seq.num_computed_tokens == seq.num_tokens:
            work.samples.append(seq)
        return True

    def _room(self, plan: StepPlan, group: SequenceGroup, seq: Sequence, n: int, index: int | None) -> bool:
        """Room in the allocator for ``n`` more tokens of ``seq``: its first allocation (admission,
        refused rather than preempting) or growth (preempting ``running[index:]`` until it fits,
        which may be the group itself)."""
        if seq.status is Status.WAITING:  # the request's first allocation: admission
            return self._allocate(group, seq, n)
        while not self.allocator.append(seq.seq_id, n):
            if index is None:  # a readmitted fan-out whose branches do not fit after its prompt
                self._refused = group.shape(self._admission_tokens(group)), Refusal.NO_MEMORY
                return False
            if self.policy.considers_scheduled:  # an earlier victim (lowest_priority) may have moved it up
                index = self.running.index(group)
            if self._preempt(plan, index) is group:
                return False
        return True

    def _fork(self, work: _Work, group: SequenceGroup, root: Sequence) -> None:
        """The prompt is computed: every other live branch shares (or copies) it."""
        prompt = group.request.prompt_tokens
        for seq in group.seqs:
            if seq is root or seq.status is not Status.WAITING:
                continue
            self.allocator.fork(root.seq_id, seq.seq_id, prompt + seq.output_tokens - 1)
            seq.status = Status.RUNNING
            seq.num_computed_tokens = prompt
            work.forks.append((root, seq))
            if seq.num_tokens == prompt:  # a new branch samples its first token with the root
                work.samples.append(seq)
        group.is_forked = True

    def _reshuffle_beams(self, work: _Work, group: SequenceGroup) -> None:
        """Beam search keeps the best continuations: after the step, each beam is replaced with
        probability ``beam_fork_probability`` by a copy of another beam (drawn uniformly), which
        shares (paged) or copies (contiguous) that beam's whole cache."""
        if group.beam_rng is None:
            group.beam_rng = np.random.default_rng([group.request.seed, group.request_id])
        beams = group.held_seqs()
        if len(beams) < 2:
            return
        if len({beam.num_computed_tokens for beam in beams}) > 1:
            # a step's token budget can leave the beams at different lengths (chunked steps schedule
            # a group's branches in turn): a beam replaced by a copy of a shorter or longer one would
            # hold a cache that is not its length, so beams out of step are not reshuffled
            return
        rng = group.beam_rng
        replaced = rng.random(len(beams)) < group.request.beam_fork_probability
        others = rng.integers(0, len(beams) - 1, size=len(beams))
        for j, beam in enumerate(beams):
            if replaced[j]:
                parent = beams[others[j] + (others[j] >= j)]  # any beam but itself
                self.allocator.fork(parent.seq_id, beam.seq_id, beam.end_tokens - 1)
                work.forks.append((parent, beam))

    def _commit(self, plan: StepPlan, group: SequenceGroup, work: _Work) -> int:
        self._work = None
        plan.decodes.extend(work.decodes)
        plan.kv_read_tokens += work.kv_read_tokens
        plan.prefills.extend(work.chunks)
        plan.samples.extend(work.samples)
        plan.forks.extend(work.forks)
        group.num_lost_tokens -= sum(c.num_recomputed_tokens for c in work.chunks)
        return len(work.decodes) + sum(c.num_new_tokens for c in work.chunks)

    def _drop(self, refused_admission: bool = False) -> None:
        """The request could not run: preempted (its growth was taken back by then) or refused at
        admission (the caller releases it). A refused admission's growth is taken back first, so
        that blocks it filled are not left keyed in a prefix cache: their KV was never computed."""
        if refused_admission and self._work is not None:
            self._take_back(self._work)
        self._work = None

    # --- preemption ------------------------------------------------------------------------------

    def _after_earlier_victims(self, index: int, used: int) -> tuple[int, int]:
        """The loop's place and tokens used after victims taken from the part of ``running`` that
        had already run this step (their places and tokens are given back)."""
        index, used = index - self._num_earlier_victims, used - self._returned_tokens
        self._num_earlier_victims = self._returned_tokens = 0
        return index, used

    def _preempt(self, plan: StepPlan, index: int) -> SequenceGroup:
        """Evict one request as the policy decides: among ``running[index:]`` (not yet run this
        step), or, for a policy that ``considers_scheduled`` (vLLM's priority victim), among every
        running request, one that already ran this step giving its tokens back (one-sequence
        requests only: a fan-out's forks are not taken back)."""
        if self.policy.considers_scheduled:
            positions = [i for i, g in enumerate(self.running) if i >= index or len(g.seqs) == 1]
        else:
            positions = list(range(index, len(self.running)))
        candidates = [self.running[i] for i in positions]
        choice, answer = self.policy.choose(candidates, self.preemption)
        try:
            mechanism = Mechanism(answer)  # an outside policy may answer the plain string "swap"
        except ValueError:
            raise ConfigError(
                f"preemption={self.policy.name!r} answered the mechanism {answer!r}: answer "
                "Mechanism.RECOMPUTE or Mechanism.SWAP (kvbench.core.step)"
            ) from None
        victim = candidates[choice]
        if positions[choice] < index:
            self._take_back_step(plan, victim)
            self._num_earlier_victims += 1
        del self.running[positions[choice]]
        if self._work is not None and self._work.group is victim:
            self._take_back(self._work)
        fell_back = mechanism == Mechanism.SWAP and not self.preemption.can_swap(victim)
        if fell_back:
            mechanism = Mechanism.RECOMPUTE
        held = victim.held_seqs()
        kv_tokens = victim.num_cached_positions()
        swap_out_bytes = 0
        if mechanism == Mechanism.SWAP:
            transfer = self.allocator.swap_out([s.seq_id for s in held])
            if not self.host_pool.reserve(victim.request_id, transfer.num_bytes):
                raise RuntimeError("the host pool refused a swap it had room for")
            for seq in held:
                seq.status = Status.SWAPPED
            victim.status = Status.SWAPPED
            swap_out_bytes = transfer.num_bytes
            self.swapped.appendleft(victim)
            plan.swap_out.append(transfer)
        else:
            self._release(victim)
            victim.num_lost_tokens += kv_tokens
            victim.num_recomputed_tokens += kv_tokens
            victim.status = Status.WAITING
            self.waiting.add_preempted(victim)
        self.num_running_seqs -= victim.num_live
        # the plan is the record of the event: the recorder counts the request's preemptions from it
        plan.preemptions.append(Preemption(victim, kv_tokens, mechanism, fell_back, swap_out_bytes))
        return victim

    def _take_back_step(self, plan: StepPlan, group: SequenceGroup) -> None:
        """Take a one-sequence request that already ran this step out of the plan: its decode or
        chunk, its sample and its growth (the tokens go back to the step's budget)."""
        (seq,) = group.seqs
        if seq in plan.decodes:
            plan.decodes.remove(seq)
            plan.kv_read_tokens -= seq.num_computed_tokens
            seq.num_computed_tokens -= 1
            self._returned_tokens += 1
        for chunk in [c for c in plan.prefills if c.seq is seq]:
            plan.prefills.remove(chunk)
            seq.num_computed_tokens = chunk.num_context_tokens
            group.num_lost_tokens += chunk.num_recomputed_tokens
            self._returned_tokens += chunk.num_new_tokens
        if seq in plan.samples:
            plan.samples.remove(seq)
        if seq.status is Status.RUNNING:
            self.allocator.truncate(seq.seq_id, seq.num_computed_tokens)

    def _take_back(self, work: _Work) -> None:
        """Undo the step's growth of the request being preempted: it leaves with what it had."""
        for _, child in work.forks:
            self.allocator.free(child.seq_id)
            child.status = Status.WAITING
            child.num_computed_tokens = 0
        if work.forks:
            work.group.is_forked = False
        for seq, before in reversed(work.grown):
            if seq.status is Status.RUNNING:
                self.allocator.truncate(seq.seq_id, before)
            seq.num_computed_tokens = before

    def _release(self, group: SequenceGroup) -> None:
        """Free every branch the allocator holds; the group keeps its tokens, not its cache."""
        for seq in group.held_seqs():
            self.allocator.free(seq.seq_id)
            seq.status = Status.WAITING
        for seq in group.live_seqs():
            seq.num_computed_tokens = 0
        group.is_forked = False

    # --- finishing -------------------------------------------------------------------------------

    def _finish(self, seq: Sequence, end_s: float) -> int:
        """A branch emitted its last token; returns 1 when its request is now complete."""
        group = seq.group
        seq.status = Status.FINISHED
        group.num_live -= 1
        self.num_running_seqs -= 1
        if self.holds_finished:
            self._held_seq_ids.append(seq.seq_id)
        else:
            self.allocator.free(seq.seq_id)
        if group.num_live:
            return 0
        if self.holds_finished:
            self.held.append(group)
            return 0
        group.status = Status.FINISHED
        group.finish_s = end_s
        self.finished.append(group)
        return 1

    def _end_batch(self, end_s: float) -> int:
        """Request-level batching: the batch is done; release its memory and return its requests."""
        for seq_id in self._held_seq_ids:
            self.allocator.free(seq_id)
        self._held_seq_ids.clear()
        for group in self.held:
            group.status = Status.FINISHED
            group.finish_s = end_s
        self.finished.extend(self.held)
        num_finished = len(self.held)
        self.held.clear()
        return num_finished

    # --- helpers ---------------------------------------------------------------------------------

    def _admission_tokens(self, group: SequenceGroup) -> int:
        """Tokens the (re)admission of ``group`` computes: the prompt once, then each branch's own."""
        if len(group.seqs) == 1:
            return group.seqs[0].num_tokens
        prompt = group.request.prompt_tokens
        return prompt + sum(s.num_tokens - prompt for s in group.live_seqs())

    def _uncached_admission_tokens(self, group: SequenceGroup) -> int:
        """:meth:`_admission_tokens` less what the prefix cache would serve now."""
        tokens = self._admission_tokens(group)
        if self._caches_prefixes:
            tokens -= self._cache_hit(group, self._first_allocation_tokens(group))
        return tokens

    def _first_allocation_tokens(self, group: SequenceGroup) -> int:
        """The length of the sequence a (re)admission allocates first: the prompt for a fan-out
        still to fork, otherwise the live branch's whole length."""
        return group.request.prompt_tokens if group.needs_fork() else group.root().num_tokens

    def _head_shape(self) -> SeqShape | None:
        """The waiting head's first allocation: what decides which free bytes are fragmented."""
        if not self.waiting:
            return None
        group = self.waiting.peek()
        return group.shape(self._first_allocation_tokens(group))
