"""Requests: what a workload asks for, immutable once the run starts."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.workload.source import Workload


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the workload: when it arrives, how long it is, how many completions it wants.

    ``branch_output_tokens`` holds each branch's length: one entry for an ordinary request, ``n``
    for parallel sampling or a beam search of width ``n``, whose branches share the prompt and fork
    after its prefill. A beam search (``beam_fork_probability > 0``) also re-forks its beams as it
    goes: after each step, each beam is replaced with that probability by a copy of another beam
    (kvbench has no token model, so which beams survive is drawn from ``seed``).
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    s_max_tokens: int  #: the declared S_max: prompt + output of every branch stays within it
    branch_output_tokens: tuple[int, ...]
    beam_fork_probability: float = 0.0
    seed: int = 0
    #: one id per granule of ``hash_block_tokens`` prompt tokens, chained over the prefix (see
    #: :mod:`kvbench.core.prefix`); () when the workload says nothing of content: nothing is shared
    prefix_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 0
    #: the scheduler's priority queue runs lower values first (vLLM's convention); 0 for all by default
    priority: int = 0

    @property
    def num_branches(self) -> int:
        return len(self.branch_output_tokens)

    @property
    def max_output_tokens(self) -> int:
        """The longest branch: the request runs until it has emitted this many tokens."""
        return max(self.branch_output_tokens)

    @property
    def final_kv_tokens(self) -> int:
        """KV slots its longest branch holds when it finishes (its last token is never fed back)."""
        return self.prompt_tokens + self.max_output_tokens - 1


class RequestList(Sequence[Request]):
    """A workload's rows as requests, made one at a time when asked for: a run holds the requests
    in flight, not a million objects made up front. Indexing gives request ``i`` (``request_id``
    = row); slicing gives a list. Iterating makes each request in turn."""

    def __init__(self, workload: Workload, seed: int = 0) -> None:
        self._workload = workload
        self._seed = seed
        # the workload's own columns read through memoryviews (no copy where they are int64 and
        # float64 already, as the file sources make them): an item reads back as a Python number, at some
        # 40 instructions more than from an array.array; a numpy item costs more still (a scalar)
        self._arrival_s = _values(workload.arrival_s, np.float64)
        self._prompt = _values(workload.prompt_tokens, np.int64)
        self._s_max = _values(workload.s_max_tokens, np.int64)
        self._output = _values(workload.output_tokens, np.int64)
        self._single = workload.num_branches is None and workload.branch_output_tokens is None
        #: where each request's branches start in the flat branch arrays (and its first sequence id)
        self.first_seq_ids: Sequence[int]
        if self._single:  # one sequence a request: request i's is sequence i, nothing to hold
            self.first_seq_ids = range(workload.num_requests)
        else:
            branches = workload.branches()
            self.first_seq_ids = _values(np.concatenate(([0], np.cumsum(branches)[:-1])), np.int64)
            self._num_branches = _values(branches, np.int64)
            self._branch_outputs = _values(
                workload.branch_output_tokens
                if workload.branch_output_tokens is not None
                else np.repeat(workload.output_tokens, branches),
                np.int64,
            )
        self._priority = _values(workload.priority, np.int64) if workload.priority is not None else None
        self._granule = workload.hash_block_tokens if workload.prefix_hashes else 0

    def __len__(self) -> int:
        return self._workload.num_requests

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._make(i) for i in range(*index.indices(len(self)))]
        i = index.__index__()
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"request {index} of {len(self)}")
        return self._make(i)

    def __iter__(self) -> Iterator[Request]:
        return map(self._make, range(len(self)))

    @property
    def arrival_s(self) -> memoryview:
        """Every request's arrival time (seconds), without making the requests."""
        return self._arrival_s

    def any_prefix_hashes(self) -> bool:
        """Whether some request carries prefix hashes (its prompt's content), asked of the
        workload's column: without making a request object per row."""
        hashes = self._workload.prefix_hashes
        return bool(hashes) and any(map(len, hashes))

    def distinct_shapes(self) -> list[Request]:
        """One request of each distinct (prompt, branch lengths, S_max): what a check of every
        request's fit needs to look at."""
        w = self._workload
        if w.branch_output_tokens is None and w.num_branches is None:
            keys = np.stack([self._prompt, w.output_tokens, self._s_max], axis=1)
            _, first = np.unique(keys, axis=0, return_index=True)
            return [self._make(int(i)) for i in np.sort(first)]
        seen: dict[tuple, int] = {}
        for r in self:
            seen.setdefault((r.prompt_tokens, r.branch_output_tokens, r.s_max_tokens), r.request_id)
        return [self._make(i) for i in seen.values()]

    def _make(self, i: int) -> Request:
        w = self._workload
        if self._single:
            outputs = (self._output[i],)
        else:
            start = self.first_seq_ids[i]
            outputs = tuple(self._branch_outputs[start : start + self._num_branches[i]])
        return Request(
            i,
            self._arrival_s[i],
            self._prompt[i],
            self._s_max[i],
            outputs,
            w.beam_fork_probability,
            self._seed,
            tuple(w.prefix_hashes[i]) if w.prefix_hashes else (),
            self._granule,
            self._priority[i] if self._priority is not None else 0,
        )


def _values(values: np.ndarray, dtype: type) -> memoryview:
    """A memoryview of the column ``values`` as ``dtype``: the array's own memory where it already
    is one contiguous ``dtype`` array (a read-only column stays read-only), else a converted copy."""
    return memoryview(np.ascontiguousarray(values, dtype=dtype))


def requests_from_workload(workload: Workload, seed: int = 0) -> RequestList:
    """The workload's rows as requests, in arrival order (``request_id`` = row); ``seed`` (the
    run's) seeds each beam search's draws together with its request id. Made when asked for."""
    return RequestList(workload, seed)


def distinct_shapes(requests: Sequence[Request]) -> list[Request]:
    """One request of each distinct (prompt, branch lengths, S_max) among ``requests``."""
    if isinstance(requests, RequestList):
        return requests.distinct_shapes()
    seen: dict[tuple, Request] = {}
    for r in requests:
        seen.setdefault((r.prompt_tokens, r.branch_output_tokens, r.s_max_tokens), r)
    return list(seen.values())
