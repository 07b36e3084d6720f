"""Sequences and the groups the scheduler moves: counters, not token lists (no per-token objects).

A :class:`Sequence` is one completion being generated: ``num_tokens`` (prompt + generated) and
``num_computed_tokens`` (how many of them have K/V in the cache), vLLM v1's unified token model:
there is no prefill or decode phase, only how many new tokens a sequence computes in a step. A
sequence samples a token whenever a step leaves it with every token computed.

A :class:`SequenceGroup` is one request's sequences (its branches) plus what the run records about
the request. Groups are the unit the scheduler queues, admits and preempts: a victim is a whole
request.
"""

from __future__ import annotations

import enum

from kvbench.core.kv import SeqShape
from kvbench.core.request import Request


class Status(enum.Enum):
    WAITING = "waiting"  #: not admitted (or preempted by recompute); holds no memory
    RUNNING = "running"  #: admitted: holds memory and computes in steps
    SWAPPED = "swapped"  #: preempted by swap: its KV is in host memory
    FINISHED = "finished"


class Sequence:
    """One branch of a request. Its KV slots in the allocator are ``num_computed_tokens``."""

    __slots__ = (
        "seq_id",
        "group",
        "prompt_tokens",
        "output_tokens",
        "end_tokens",
        "num_tokens",
        "num_computed_tokens",
        "status",
    )

    def __init__(self, seq_id: int, group: SequenceGroup, prompt_tokens: int, output_tokens: int) -> None:
        self.seq_id = seq_id
        self.group = group
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        #: ``num_tokens`` once it has emitted its last token
        self.end_tokens = prompt_tokens + output_tokens
        self.num_tokens = prompt_tokens
        self.num_computed_tokens = 0
        #: WAITING until the allocator holds it (a branch stays WAITING until its group forks)
        self.status = Status.WAITING

    @property
    def num_generated(self) -> int:
        return self.num_tokens - self.prompt_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Tokens to compute before it can sample again (1 for a decode)."""
        return self.num_tokens - self.num_computed_tokens


#: the request-table columns: what the run records about every request (one source for the table)
REQUEST_COLUMNS = (
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "s_max_tokens",
    "num_branches",
    "max_branch_output_tokens",
    "output_tokens",
    "num_generated",
    "boundary_s",
    "admitted_s",
    "prefill_compute_s",
    "first_token_s",
    "finish_s",
    "num_preemptions",
    "num_recompute_preemptions",
    "num_swap_preemptions",
    "num_swap_fallbacks",
    "num_computed_tokens",
    "num_recomputed_tokens",
    "swap_out_bytes",
    "swap_in_bytes",
    "cached_prompt_tokens",
    "recompute_cached_tokens",
)
#: the request table's columns the recorder counts from the step plans (each preemption, swap out
#: and swap in is in a plan): the scheduler keeps only the state it schedules by
EVENT_COLUMNS = (
    "num_preemptions",
    "num_recompute_preemptions",
    "num_swap_preemptions",
    "num_swap_fallbacks",
    "swap_out_bytes",
    "swap_in_bytes",
)
#: the columns a request's group fills itself, in REQUEST_COLUMNS order
GROUP_COLUMNS = tuple(name for name in REQUEST_COLUMNS if name not in EVENT_COLUMNS)
#: the request-table columns that hold times (seconds): floats; the others count
FLOAT_GROUP_COLUMNS = frozenset(
    ("arrival_s", "boundary_s", "admitted_s", "prefill_compute_s", "first_token_s", "finish_s")
)


class SequenceGroup:
    """A request's branches, the queue it is in, and its counters.

    Timestamps are -1 until they happen. ``boundary_s`` is the first step boundary at or after
    arrival (scheduling delay ends there), ``admitted_s`` the start of the step that first
    allocated it, ``prefill_compute_s`` the compute time of its first prefill.

    Prefix-cache counters (0 without a prefix cache): ``cached_prompt_tokens`` are prompt positions
    served from the cache that the request had never computed itself (its hits: at first
    admission, or past what it had computed when readmitted); ``recompute_cached_tokens`` are
    positions it lost to a recompute preemption and got back from the cache when readmitted
    (never hits: it had computed them). ``num_recomputed_tokens`` counts only lost positions that
    were computed again, so lost = recomputed + recompute_cached.
    """

    __slots__ = (
        "request",
        "seqs",
        "status",
        "is_forked",
        "num_live",
        "num_lost_tokens",
        "beam_rng",
        "boundary_s",
        "admitted_s",
        "prefill_compute_s",
        "first_token_s",
        "finish_s",
        "num_recomputed_tokens",
        "cached_prompt_tokens",
        "recompute_cached_tokens",
    )

    def __init__(self, request: Request, first_seq_id: int) -> None:
        self.request = request
        prompt, outputs = request.prompt_tokens, request.branch_output_tokens
        self.seqs = [Sequence(first_seq_id + i, self, prompt, out) for i, out in enumerate(outputs)]
        self.status = Status.WAITING
        #: the branches share the prompt's KV; until the fork only the first live branch holds memory
        self.is_forked = False
        self.num_live = len(self.seqs)
        #: KV positions lost to recompute preemptions and not yet computed again
        self.num_lost_tokens = 0
        #: a beam search's draws (which beams are replaced), made on its first re-fork
        self.beam_rng = None
        self.boundary_s = self.admitted_s = self.first_token_s = self.finish_s = -1.0
        self.prefill_compute_s = 0.0
        self.num_recomputed_tokens = 0
        self.cached_prompt_tokens = self.recompute_cached_tokens = 0

    @property
    def request_id(self) -> int:
        return self.request.request_id

    def live_seqs(self) -> list[Sequence]:
        """Branches that have not finished."""
        return [s for s in self.seqs if s.status is not Status.FINISHED]

    def held_seqs(self) -> list[Sequence]:
        """Branches the allocator holds."""
        return [s for s in self.seqs if s.status is Status.RUNNING]

    def root(self) -> Sequence:
        """The branch that computes the shared prompt (the first live one)."""
        return next(s for s in self.seqs if s.status is not Status.FINISHED)

    def needs_fork(self) -> bool:
        """Whether live branches still wait to be forked off the prompt."""
        return not self.is_forked and self.num_live > 1

    def shape(self, num_tokens: int) -> SeqShape:
        """What the allocator is told when the group's first ``num_tokens`` are allocated."""
        request = self.request
        prompt = request.prompt_tokens
        hashes, granule = request.prefix_hashes, request.hash_block_tokens
        if len(self.seqs) == 1:
            final = prompt + self.seqs[0].output_tokens - 1
            return SeqShape(num_tokens, request.s_max_tokens, final, 1, prompt, hashes, granule, request.request_id)
        longest = max(s.output_tokens for s in self.seqs if s.status is not Status.FINISHED)
        return SeqShape(num_tokens, request.s_max_tokens, prompt + longest - 1, self.num_live, prompt, hashes, granule)

    def num_cached_positions(self) -> int:
        """Distinct token positions whose KV the group holds (the prompt counts once once forked)."""
        held = self.held_seqs()
        if not self.is_forked:
            return sum(s.num_computed_tokens for s in held)
        prompt = self.request.prompt_tokens
        return prompt + sum(s.num_computed_tokens - prompt for s in held)

    @property
    def num_computed_tokens(self) -> int:
        """Token positions computed for it, recomputations included: every position of the prompt
        once but those served from the prefix cache, every generated token but each branch's last
        (never fed back) once, plus what recompute preemptions lost and computed again (complete
        once the request has finished)."""
        prompt = self.request.prompt_tokens
        generated = sum(max(s.num_tokens - prompt - 1, 0) for s in self.seqs)
        prompt_computed = prompt - self.cached_prompt_tokens if self.admitted_s >= 0 else 0
        return prompt_computed + generated + self.num_recomputed_tokens

    def row(self) -> tuple:
        """Its request-table row, in :data:`GROUP_COLUMNS` order (the columns of what it knows;
        the recorder adds the :data:`EVENT_COLUMNS` it counted from the step plans)."""
        r = self.request
        outputs = r.branch_output_tokens
        return (
            r.request_id,
            r.arrival_s,
            r.prompt_tokens,
            r.s_max_tokens,
            len(outputs),
            max(outputs),
            sum(outputs),
            sum(s.num_tokens for s in self.seqs) - len(outputs) * r.prompt_tokens,
            self.boundary_s,
            self.admitted_s,
            self.prefill_compute_s,
            self.first_token_s,
            self.finish_s,
            self.num_computed_tokens,
            self.num_recomputed_tokens,
            self.cached_prompt_tokens,
            self.recompute_cached_tokens,
        )
