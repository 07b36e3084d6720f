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
    """Requests sorted by arrival; request ``i`` is row ``i`` of every array."""

    arrival_s: np.ndarray  #: float64, seconds from the start of the run
    prompt_tokens: np.ndarray  #: int64, >= 1
    output_tokens: np.ndarray  #: int64, >= 1
    max_tokens: np.ndarray  #: int64, the request's declared S_max (prompt + output <= it)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens", "max_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"workload column {name} has {len(getattr(self, name))} rows, expected {n}")

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)


class WorkloadSource:
    """A workload-source plugin: ``name`` matches ``conf/workload/<name>.yaml`` or a preset's ``name``."""

    name: ClassVar[str]
    Config: ClassVar[type | None] = None

    def __init__(self, config: Any) -> None:
        self.config = config

    def generate(self, rng: np.random.Generator) -> Workload:
        raise NotImplementedError
