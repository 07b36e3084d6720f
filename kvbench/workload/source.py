"""Workloads: the requests a run serves, as columns (one numpy array per field).

A workload *source* plugin turns its config and a seeded ``numpy.random.Generator`` into a
:class:`Workload`. Arrival processes and the declared-S_max mix are shared by every source and live
in :mod:`kvbench.workload.arrivals`, so a new length generator only has to say how long prompts and outputs are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival; request ``i`` is row ``i`` of every per-request array.

    A request with ``num_branches = n > 1`` wants n completions of one prompt (parallel sampling,
    or a beam search of width n). Its branches emit ``output_tokens`` tokens each, unless
    ``branch_output_tokens`` gives every branch its own length (then ``output_tokens`` is the longest).
    """

    arrival_s: np.ndarray  #: float64, seconds from the start of the run
    prompt_tokens: np.ndarray  #: int64, >= 1
    output_tokens: np.ndarray  #: int64, >= 1
    s_max_tokens: np.ndarray  #: int64, the request's declared S_max (prompt + output <= it)
    num_branches: np.ndarray | None = None  #: int64, >= 1; None: one completion each
    #: int64, ``num_branches.sum()`` entries, request by request; None: every branch emits ``output_tokens``
    branch_output_tokens: np.ndarray | None = None
    #: > 0: the branches are a beam search re-forked at every step with this probability per beam
    #: (see :class:`kvbench.core.request.Request`); 0: parallel sampling
    beam_fork_probability: float = 0.0
    #: per request, one id per granule of ``hash_block_tokens`` prompt tokens, chained over the
    #: prefix (equal ids: equal prompt prefixes; see kvbench.core.prefix); None: content unknown,
    #: nothing is shared between requests
    prefix_hashes: list[tuple[int, ...]] | None = None
    hash_block_tokens: int = 0
    #: a closed-loop client's requests in flight: the engine sends request ``i + max_concurrency``
    #: when one in flight finishes, so ``arrival_s`` is only the earliest time (see
    #: ``Engine(max_in_flight=...)``); None: open loop, every request arrives at its ``arrival_s``
    max_concurrency: int | None = None
    #: int64 per request, lower first under ``scheduler.queue=priority``; None: all equal
    priority: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if self.prefix_hashes is not None and len(self.prefix_hashes) != n:
            raise ValueError(f"workload column prefix_hashes has {len(self.prefix_hashes)} rows, expected {n}")
        for name in ("prompt_tokens", "output_tokens", "s_max_tokens", "num_branches", "priority"):
            column = getattr(self, name)
            if column is not None and len(column) != n:
                raise ValueError(f"workload column {name} has {len(column)} rows, expected {n}")
        if self.branch_output_tokens is not None and len(self.branch_output_tokens) != int(self.branches().sum()):
            raise ValueError("workload column branch_output_tokens needs one entry per branch")

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)

    def branches(self) -> np.ndarray:
        """Completions per request (int64)."""
        return np.ones(self.num_requests, dtype=np.int64) if self.num_branches is None else self.num_branches

    def branch_output_tokens_per_request(self) -> list[tuple[int, ...]]:
        """Each request's branch lengths, as tuples."""
        branches = self.branches().tolist()
        if self.branch_output_tokens is None:
            return [(o,) * b for o, b in zip(self.output_tokens.tolist(), branches)]
        flat = self.branch_output_tokens.tolist()
        ends = np.cumsum(branches).tolist()
        return [tuple(flat[end - b : end]) for b, end in zip(branches, ends)]


def read_only(column: np.ndarray) -> np.ndarray:
    """A read-only view of a source's column, for a :class:`Workload` built from rows the source
    keeps: no copy (a million requests' column is 8 MB), and no run can change the source's rows
    through it (a write raises instead), so a second ``generate`` gets the same requests."""
    view = column.view()
    view.flags.writeable = False
    return view


class WorkloadSource:
    """A workload-source plugin: ``name`` matches ``conf/workload/<name>.yaml`` or a preset's ``name``."""

    name: ClassVar[str]
    Config: ClassVar[type | None] = None
    #: whether the source replays a file (its parse costs memory per row: the memory check uses it)
    replays_a_file: ClassVar[bool] = False

    def __init__(self, config: Any) -> None:
        self.config = config

    @classmethod
    def planned_requests(cls, config: Any) -> int | None:
        """How many requests the run will hold, known before the source is built (the memory check
        asks first); None when it cannot say cheaply. A file source counts its rows."""
        return getattr(config, "num_requests", None)

    @classmethod
    def carries_prefix_hashes(cls, config: Any) -> bool:
        """Whether its requests carry prefix hashes (what prefix caching keeps per block)."""
        return False

    def generate(self, rng: np.random.Generator) -> Workload:
        raise NotImplementedError
