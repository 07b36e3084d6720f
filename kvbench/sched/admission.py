"""Admission and chunking: which waiting request starts, with how many of its tokens.

- *refuse up front* a request that could never run (:meth:`AdmissionMixin.check_fits`), instead of
  letting it wait for ever;
- *admit* the head of the waiting queue (nobody overtakes a refused head), keeping the watermark
  free unless nothing is running, within the sequence cap and the step's token budget: whole
  prompts, or a first chunk (``chunked``, or ``chunk_head`` for the step's first prompt only);
- *continue prefills*: the next chunk of every running request whose prompt is not complete;
- a request's *first allocation* (:meth:`AdmissionMixin._allocate`) is refused rather than
  preempting anyone, and a refused admission changes nothing: its memory, its copies and its
  counted cache hit are taken back, and the plan records why (``plan.refusal``).

``long_prefill_token_threshold`` caps one request's chunk while others compete
(:meth:`AdmissionMixin._chunk_cap`). The admission in progress keeps its headroom in
``_headroom_bytes`` and, when refused, its shape and reason in ``_refused``.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from kvbench.core.request import Request, distinct_shapes
from kvbench.core.sequence import Sequence, SequenceGroup, Status
from kvbench.core.step import AdmissionRefusal, StepPlan
from kvbench.errors import ConfigError
from kvbench.memory.allocator import SeqShape


class AdmissionMixin:
    """The :class:`~kvbench.sched.scheduler.Scheduler`'s admission and chunking (its state is set
    by ``Scheduler.__init__``)."""

    # --- what the engine calls before the run ------------------------------------------------------

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
            # a readmission computes the prompt and all but the last output tokens in one step; under
            # a full-output reservation (GUARANTEED_NO_EVICT) nothing is ever preempted, so only the
            # prompt must fit
            readmitted = (
                0 if self.config.admission_reserve == "full_output" else sum(o - 1 for o in r.branch_output_tokens)
            )
            if self.config.decodes_in_budget and not self.chunks_prompts and r.prompt_tokens + readmitted > budget:
                raise ConfigError(
                    f"{what} can never be admitted whole within scheduler.max_num_batched_tokens={budget} "
                    "(decodes_in_budget: a prompt, or a preempted request's prompt and output, runs in one "
                    "step); raise it to the longest request or set scheduler.decodes_in_budget=false"
                )
            self._check_reservation_fits(what, r.prompt_tokens, r.max_output_tokens)
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

    # --- mechanisms a policy calls -------------------------------------------------------------------

    def admit(self, plan: StepPlan, token_budget: int | None, chunked: bool = False, chunk_head: bool = False) -> int:
        """Admit waiting requests from the head of the queue, within the sequence cap and
        ``token_budget`` (None: no budget), stopping at the first that does not fit: whole prompts
        (a longer one alone still runs, unless ``decodes_in_budget``), or chunks when ``chunked``.
        ``chunk_head``: the step's first prompt (none computed yet this step) may be a chunk of
        what the budget leaves, later ones must fit whole (nano-vllm). Returns the tokens scheduled."""
        cfg = self.config
        used = 0
        if self._reserve != "none" and self.waiting:
            self._start_reservation(plan)
        # the prompt must fit what is left, even the step's first (unless that one may be chunked)
        whole_only = cfg.decodes_in_budget or chunk_head
        while self.waiting:
            group = self.waiting.peek()
            if self._seqs_counted(plan) + group.num_live > cfg.max_num_seqs:
                break
            if self._prefilled and group.request_id in self._prefilled:
                # a decode worker: its prompt was computed elsewhere; it reserves its blocks, and
                # computes nothing in this step (kvbench.sched.roles)
                if not self._reserve_for_kv(plan, group):
                    break
                self.waiting.pop()
                continue
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
            if reloads is not None and not self._reload_before_admission(plan, group):
                break  # its blocks are on their way from host memory: nobody overtakes it
            tokens = self._admit_group(plan, group, budget)
            if reloads is not None:
                self._reload_after_admission(plan, group, tokens is not None)
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

    # --- one admission -------------------------------------------------------------------------------

    def _admit_group(self, plan: StepPlan, group: SequenceGroup, budget: int | None) -> int | None:
        self._headroom_bytes = self.watermark_bytes if self.num_running_seqs else 0
        self._admission_hit = None
        seqs = group.seqs
        if self._reserve != "none" and self._reservation_refuses(group):
            tokens = None
        elif self.config.full_prompt_admission and not self._whole_fits(group):
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
        if self._reserve != "none":
            self._reserve_admitted(group)
        group.status = Status.RUNNING
        plan.num_admitted += 1
        if group.admitted_s < 0:
            group.admitted_s = plan.start_s
        self.running.append(group)
        self.num_running_seqs += group.num_live
        return tokens

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

    # --- caps and sizes ------------------------------------------------------------------------------

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
