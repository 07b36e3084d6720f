"""The scheduler: its queues, and the mechanisms every scheduling policy composes.

A scheduling policy (a ``scheduler`` plugin) implements :meth:`Scheduler._schedule`, deciding the
order in which a step runs the running requests, resumes swapped ones and admits waiting ones. The
mechanisms are shared and live here:

- *compute* a request's next tokens: its decodes, or the next chunk of its prefill. A fan-out's
  first live branch computes the shared prompt; when the prompt is complete the other branches
  fork off it (sharing its blocks, or copying into the ranges reserved at admission);
- *grow or preempt*: when the allocator cannot make room, the preemption policy picks a victim
  among the requests not yet run this step (possibly the one growing) and a mechanism; a swap that
  does not fit the host pool falls back to recompute;
- *admit* the head of the waiting queue (first come first served: nobody overtakes a refused
  head), keeping the watermark free unless nothing is running;
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
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from kvbench.core.request import Request
from kvbench.core.sequence import Sequence, SequenceGroup, Status
from kvbench.core.step import AdmissionRefusal, Mechanism, Preemption, PrefillChunk, StepPlan, StepResult
from kvbench.errors import ConfigError, require
from kvbench.exec.costmodel import CostModel
from kvbench.memory.allocator import NO_PROJECTION, Allocator, DecodeProjection, Refusal, SeqShape
from kvbench.memory.host_pool import HostSwapPool
from kvbench.sched.preemption import PreemptionContext, PreemptionPolicy


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


class StepOutcome(NamedTuple):
    num_finished_requests: int
    #: some sequence finished at the end of the step (the next step runs a different batch)
    any_seq_finished: bool


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


class Scheduler:
    """A scheduling-policy plugin: ``name`` matches ``conf/scheduler/<name>.yaml``."""

    name: ClassVar[str]
    Config: ClassVar[type] = SchedulerConfig
    #: a finished sequence keeps its memory until every request of its batch has finished, and the
    #: requests of a batch are returned together (request-level batching)
    holds_finished: ClassVar[bool] = False

    def __init__(
        self,
        config: Any,
        *,
        allocator: Allocator,
        policy: PreemptionPolicy,
        cost: CostModel,
        host_pool: HostSwapPool,
    ) -> None:
        self.config = config if config is not None else self.Config()
        self.allocator = allocator
        self.policy = policy
        self.host_pool = host_pool
        self.preemption = PreemptionContext(allocator, cost, host_pool)
        self.waiting: deque[SequenceGroup] = deque()
        self.swapped: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []  # in admission order
        self.held: list[SequenceGroup] = []  # finished, memory kept until the batch ends
        self._held_seq_ids: list[int] = []
        self.num_running_seqs = 0
        # NOTE: growth headroom only matters to allocators that allocate on demand
        reserves = allocator.capabilities.reserves_future
        self.watermark_bytes = 0 if reserves else int(self.config.watermark_fraction * allocator.budget_bytes)
        self._headroom_bytes = 0
        self._refused: tuple[SeqShape, Refusal] | None = None  # why the last admission failed
        self._caches_prefixes = allocator.capabilities.caches_prefixes
        # the cache hit counted by the admission in progress, to take back if it is refused:
        # (group, lost positions served back from the cache, new prompt positions served)
        self._admission_hit: tuple[SequenceGroup, int, int] | None = None
        self._work: _Work | None = None  # the request whose tokens are being scheduled
        self._step = 0

    # --- what the engine calls -------------------------------------------------------------------

    def check_fits(self, requests: Seq[Request]) -> None:
        """Refuse up front a request that could never run, instead of letting it wait forever."""
        seen: set[tuple] = set()
        for r in requests:
            key = (r.prompt_tokens, r.branch_output_tokens, r.s_max_tokens)
            if key in seen:
                continue
            seen.add(key)
            shape = SeqShape(r.prompt_tokens, r.s_max_tokens, r.final_kv_tokens, r.num_branches, r.prompt_tokens)
            what = (
                f"request {r.request_id} (prompt {r.prompt_tokens} + output {r.max_output_tokens} tokens"
                f"{f' x {r.num_branches} branches' if r.num_branches > 1 else ''}, declared S_max {r.s_max_tokens})"
            )
            if r.prompt_tokens + r.max_output_tokens > r.s_max_tokens:
                raise ConfigError(f"{what} is longer than its declared S_max; shorten it or raise S_max")
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

    def add(self, group: SequenceGroup, clock_s: float) -> None:
        """A request arrives at the step boundary ``clock_s``."""
        group.boundary_s = clock_s
        self.waiting.append(group)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.swapped or self.held)

    def schedule(self, clock_s: float) -> StepPlan:
        """Decide the next step."""
        plan = StepPlan(self._step, clock_s)
        self._schedule(plan)
        plan.copies.extend(self.allocator.drain_copies())
        plan.ledger = self.allocator.ledger(self._head_shape())
        plan.num_running = self.num_running_seqs
        plan.num_waiting = len(self.waiting)
        plan.num_swapped = len(self.swapped)
        if not (plan.prefills or plan.decodes or plan.samples or plan.swap_in or plan.swap_out or plan.preemptions):
            raise RuntimeError(  # check_fits makes this unreachable; a broken plugin would loop forever
                f"scheduler {self.name!r} made no progress at step {self._step} "
                f"({len(self.running)} running, {len(self.waiting)} waiting, {len(self.swapped)} swapped)"
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
        if not plan.is_quiet or plan.has_beam_search:
            return NO_PROJECTION
        until_finish = min([seq.end_tokens - seq.num_tokens for seq in plan.decodes]) - 1
        limit = min(until_finish, max_steps)
        if limit <= 0:
            return NO_PROJECTION
        return self.allocator.project_decode([seq.seq_id for seq in plan.decodes], limit, self._head_shape())

    def extend(self, plan: StepPlan, projection: DecodeProjection, num_extra_steps: int) -> None:
        """Make a quiet plan stand for ``num_extra_steps`` more decode steps (``decode_span`` said they fit)."""
        for seq in plan.decodes:
            if not self.allocator.append(seq.seq_id, num_extra_steps):
                raise RuntimeError(f"allocator {self.allocator.name!r} refused a step its projection allowed")
            seq.num_computed_tokens += num_extra_steps
        plan.num_steps += num_extra_steps
        plan.span_ledgers = {name: values[:num_extra_steps] for name, values in projection.ledgers.items()}

    # --- the policy ------------------------------------------------------------------------------

    def _schedule(self, plan: StepPlan) -> None:
        """Fill ``plan`` with this step's work, using the mechanisms below."""
        raise NotImplementedError

    # --- mechanisms ------------------------------------------------------------------------------

    def _run_running(self, plan: StepPlan, token_budget: int | None = None) -> int:
        """Compute the running requests' next tokens in admission order (decodes, or prefill
        chunks within ``token_budget``), preempting when memory runs out. Returns tokens used."""
        used, index = 0, 0
        running, append, decodes = self.running, self.allocator.append, plan.decodes
        while index < len(running):
            if token_budget is not None and used >= token_budget:
                break
            group = running[index]
            seqs = group.seqs
            if len(seqs) == 1:
                # NOTE: the hot path (a one-sequence request decoding, room in the cache) inline;
                # anything else goes through _compute
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
            tokens = self._compute(plan, group, budget, index)
            if tokens is None:
                continue  # the group itself was preempted: the next one is now at `index`
            used += tokens
            index += 1
        return used

    def _admit(self, plan: StepPlan, token_budget: int | None, chunked: bool = False) -> None:
        """Admit waiting requests first come first served, within the sequence cap and the token
        budget: whole prompts (a longer one alone still runs), or chunks when ``chunked``."""
        used = 0
        cap = self.config.max_num_seqs
        while self.waiting:
            group = self.waiting[0]
            if self.num_running_seqs + group.num_live > cap:
                break
            if chunked:
                budget = token_budget - used
                if budget <= 0:
                    break
            else:
                budget = None
                if token_budget is not None and used and used + self._uncached_admission_tokens(group) > token_budget:
                    break
            tokens = self._admit_group(plan, group, budget)
            if tokens is None:
                break
            self.waiting.popleft()
            used += tokens

    def _resume_swapped(self, plan: StepPlan) -> bool:
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

    def _admit_group(self, plan: StepPlan, group: SequenceGroup, budget: int | None) -> int | None:
        self._headroom_bytes = self.watermark_bytes if self.num_running_seqs else 0
        self._admission_hit = None
        seqs = group.seqs
        if len(seqs) == 1:
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
        """Whether a re-admitted fan-out (its branches past the prompt, preempted since) surely fits: every live
        branch's tokens in blocks of its own, plus one block each for a copy-on-write, within what
        the allocator has not allocated (cached blocks included) less the watermark.

        Re-admitting it allocates the shared prompt first, then each branch; when a branch does not
        fit, the admission is taken back. Under a prefix cache taking back is not neutral: the
        prompt's allocation has reused and evicted cached blocks. An admission that is refused must
        change nothing (the event-driven loop skips the steps where it is retried), so a prefix
        cache only starts a re-admission that cannot fail. The bound counts the prompt's full blocks
        once and every branch's own blocks plus one, so it may refuse one that would have fitted:
        it waits for memory instead. With nothing running it is not applied (nothing would free
        memory, and no decode run is skipped meanwhile)."""
        if not self.num_running_seqs:  # nothing runs: nothing to skip, and waiting would wait forever
            return True
        alloc = self.allocator
        size = alloc.block_size_tokens
        shared = group.request.prompt_tokens // size  # the prompt's full blocks, held once
        blocks = shared + sum(-(-seq.num_tokens // size) - shared + 1 for seq in group.live_seqs())
        if alloc.unallocated_bytes() - self._headroom_bytes >= blocks * size * alloc.kv_bytes_per_token:
            return True
        shape = group.shape(self._first_allocation_tokens(group))
        self._refused = shape, Refusal.NO_MEMORY
        return False

    def _cache_hit(self, group: SequenceGroup, num_tokens: int) -> int:
        """Leading tokens of a sequence of ``num_tokens`` the prefix cache would serve if it were
        allocated now (never all of them: one is computed, for its logits)."""
        if not group.request.prefix_hashes:
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

    def _preempt(self, plan: StepPlan, index: int) -> SequenceGroup:
        """Evict one request among ``running[index:]`` (not yet run this step) as the policy decides."""
        candidates = self.running[index:]
        choice, answer = self.policy.choose(candidates, self.preemption)
        try:
            mechanism = Mechanism(answer)  # an outside policy may answer the plain string "swap"
        except ValueError:
            raise ConfigError(
                f"preemption={self.policy.name!r} answered the mechanism {answer!r}: answer "
                "Mechanism.RECOMPUTE or Mechanism.SWAP (kvbench.core.step)"
            ) from None
        victim = candidates[choice]
        del self.running[index + choice]
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
            self.waiting.appendleft(victim)
        self.num_running_seqs -= victim.num_live
        # the plan is the record of the event: the recorder counts the request's preemptions from it
        plan.preemptions.append(Preemption(victim, kv_tokens, mechanism, fell_back, swap_out_bytes))
        return victim

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
        return 1

    def _end_batch(self, end_s: float) -> int:
        """Request-level batching: the batch is done; release its memory and return its requests."""
        for seq_id in self._held_seq_ids:
            self.allocator.free(seq_id)
        self._held_seq_ids.clear()
        for group in self.held:
            group.status = Status.FINISHED
            group.finish_s = end_s
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
        group = self.waiting[0]
        return group.shape(self._first_allocation_tokens(group))
