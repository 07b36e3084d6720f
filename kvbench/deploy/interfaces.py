"""The contracts between the deployment's loop, its routers and its KV links.

A router (a ``router`` plugin) picks the worker a request goes to, from a snapshot of each worker
of one role taken at the moment it routes. A KV link prices and orders the transfers of one
prefill worker's KV to the decode workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

from kvbench.core.request import Request

Role = Literal["prefill", "decode"]


@dataclass(frozen=True)
class WorkerView:
    """One worker as a router sees it when it routes (the worker's state at its last step
    boundary: workers advance one at a time, so another worker's clock may be a step ahead)."""

    index: int  #: the worker's position among the workers of its role, from 0
    role: Role
    num_waiting: int  #: requests routed to it and not admitted yet
    num_running: int  #: requests admitted and not finished (decode: those receiving their KV too)
    free_kv_bytes: int  #: what an admission could take now: the ledger's free and cached bytes
    #: how many of the request's prompt tokens this worker's prefix cache holds (0 without a cache)
    cached_prefix_tokens: Callable[[Request], int]


class Router(Protocol):
    """A routing policy: ``name`` matches ``conf/router/<name>.yaml``. ``route`` returns the
    ``index`` of one of ``workers`` (the loop refuses any other value in one line)."""

    name: ClassVar[str]

    def route(self, request: Request, role: Role, workers: Sequence[WorkerView]) -> int: ...


@dataclass(frozen=True)
class Transfer:
    """One request's KV on its way from a prefill worker to a decode worker."""

    start_s: float  #: the first byte leaves
    end_s: float  #: the last byte has landed: the decode worker may run the request from here
    kv_bytes: int


class KvLink(Protocol):
    """The link one prefill worker sends its KV over. ``source`` names where its bandwidth and
    latency come from (a measured table, or the hardware config's link)."""

    source: str

    def schedule(
        self, kv_bytes: int, *, ready_s: float, prefill_start_s: float, prefill_end_s: float, num_layers: int
    ) -> Transfer:
        """Order one transfer: ``ready_s`` is when the decode side has reserved its blocks (the
        transfer cannot start before), ``prefill_start_s``/``prefill_end_s`` when the prompt's
        prefill ran (a layer-by-layer transfer overlaps it). Transfers over one link run one after
        another, in the order they are scheduled."""
        ...
