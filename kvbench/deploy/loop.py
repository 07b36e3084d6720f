"""The deployment's loop: prefill and decode workers advanced together, one turn at a time.

Each worker is its own engine (:class:`kvbench.deploy.worker.Worker`) with its own clock. The loop
is a conservative co-simulation: it always advances the worker whose next event is earliest, and
lets it take only steps that start no later than the next event of any other worker or of the
client (its *horizon*). Whatever another worker still produces (a prompt prefilled, blocks
reserved, a request finished) lies after its own next event, so nothing a worker has not been told
yet can change a step that starts at or before the horizon: the loop's result is the one a loop
of all workers advanced step by step in global time order would give.

A request's path (:mod:`kvbench.deploy`): the client sends it, the router picks a prefill worker,
the prefill worker computes its prompt and holds the KV; the router then picks a decode worker, the
decode worker reserves the prompt's blocks through its admission (waiting in its queue while memory
is short), the prefill worker's link moves the KV (:class:`kvbench.deploy.interfaces.KvLink`), and
at the transfer's end the decode worker runs the request and the prefill worker frees its copy.

``transfer=layerwise`` goes decode first, as NVIDIA Dynamo does: the decode worker is picked when
the client sends, reserves the blocks, and only then is the prompt sent to a prefill worker, whose
link moves each layer's KV as soon as it is computed. Decode first is also what keeps a layer-wise
deployment from deadlocking: were prompts prefilled before their decode blocks existed, a decode
worker full of reservations for prompts still queued could wait on a prefill worker full of KV
held for requests queued behind them. The decode worker's first step makes the first
token, as in vLLM's and Dynamo's P/D serving (the prefill side's sampled token is not sent).

Closed loop (``max_in_flight=C``): as :class:`kvbench.engine.Engine`, the first C requests are sent
at their arrival and each finish sends the next one at its finish time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.core.request import Request
from kvbench.deploy.interfaces import KvLink, Role, Router, Transfer
from kvbench.deploy.routers import checked_route
from kvbench.deploy.worker import Admitted, Finished, FirstToken, Prefilled, Worker
from kvbench.errors import ConfigError
from kvbench.io.table import ColumnTable
from kvbench.metrics.recorder import RunRecord

TRANSFER_MODES = ("after_prefill", "layerwise")

#: the deployment's request table: one row per request, its path through the workers (seconds from
#: the run's start; -1 where it did not happen)
PATH_COLUMNS = (
    "request_id",
    "arrival_s",  # the client sent it
    "prefill_worker",
    "decode_worker",
    "prefill_start_s",  # the first step that computed part of its prompt began
    "prefill_end_s",  # the step that computed its last prompt token ended: the KV is complete
    "decode_admitted_s",  # the decode worker reserved its blocks
    "transfer_start_s",
    "transfer_end_s",  # its KV has landed on the decode worker
    "first_token_s",  # the decode worker's first step for it ended
    "finish_s",
    "kv_transfer_bytes",
)


@dataclass
class _Path:
    """One request's way through the deployment, filled in as its events come."""

    request: Request
    arrival_s: float
    prefill_worker: int = -1
    decode_worker: int = -1
    prefill_start_s: float = -1.0
    prefill_end_s: float = -1.0
    decode_admitted_s: float = -1.0
    transfer: Transfer | None = None
    first_token_s: float = -1.0
    finish_s: float = -1.0
    kv_bytes: int = 0

    def row(self) -> tuple:
        t = self.transfer
        return (
            self.request.request_id,
            self.arrival_s,
            self.prefill_worker,
            self.decode_worker,
            self.prefill_start_s,
            self.prefill_end_s,
            self.decode_admitted_s,
            -1.0 if t is None else t.start_s,
            -1.0 if t is None else t.end_s,
            self.first_token_s,
            self.finish_s,
            0 if t is None else t.kv_bytes,
        )


@dataclass
class DeploymentRecord:
    """What a deployment's run produced: the request paths (:data:`PATH_COLUMNS`) and each
    worker's own record (its request table, and its step table with its memory ledger)."""

    paths: ColumnTable
    prefill: list[RunRecord]
    decode: list[RunRecord]
    num_layers: int = 0


def _next_s(worker: Worker) -> float:
    t = worker.next_event_s()
    return math.inf if t is None else t


def check_single_branch(requests: Sequence[Request]) -> None:
    for r in requests:
        if r.num_branches != 1 or r.beam_fork_probability:
            raise ConfigError(
                f"request {r.request_id} asks for {r.num_branches} completions or beams: deployment=disagg "
                "runs one completion per request (set workload.num_branches=1, or use deployment=aggregated)"
            )


class Deployment:
    """Prefill and decode workers, a router and one KV link per prefill worker (see the module
    docstring). ``on_finished`` is called with the number of requests each turn finished."""

    def __init__(
        self,
        prefill: Sequence[Worker],
        decode: Sequence[Worker],
        router: Router,
        links: Sequence[KvLink],
        *,
        transfer: str = "after_prefill",
        num_layers: int,
        max_in_flight: int | None = None,
        on_finished: Callable[[int], None] = lambda n: None,
    ) -> None:
        if not prefill or not decode:
            raise ConfigError(
                f"a disaggregated deployment needs at least one prefill and one decode worker, got "
                f"{len(prefill)} and {len(decode)}: set deployment.prefill_workers and deployment.decode_workers >= 1"
            )
        if len(links) != len(prefill):
            raise ValueError(f"one link per prefill worker: {len(links)} links for {len(prefill)} workers")
        if transfer not in TRANSFER_MODES:
            raise ConfigError(f"deployment.transfer={transfer!r} is not one of: {', '.join(TRANSFER_MODES)}")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1 or None, got {max_in_flight!r}")
        self.prefill, self.decode = list(prefill), list(decode)
        self.router, self.links = router, list(links)
        self.layerwise = transfer == "layerwise"
        self.num_layers = num_layers
        self.max_in_flight = max_in_flight
        self.on_finished = on_finished

    def run(self, requests: Sequence[Request]) -> DeploymentRecord:
        check_single_branch(requests)
        self._paths: dict[int, _Path] = {}
        self._sends: list[tuple[float, int, Request]] = []  # (send_s, order, request): the client's heap
        self._num_sent = 0
        self._requests = requests
        num_open = len(requests) if self.max_in_flight is None else min(self.max_in_flight, len(requests))
        for _ in range(num_open):
            self._send_next(None)
        # decode workers first: on a tie, a decode worker's reservation (and a zero-cost transfer's
        # landing and release) is taken before a prefill worker's step at the same instant
        workers = self.decode + self.prefill
        slot = {id(w): k for k, w in enumerate(workers)}
        # each worker's next event: recomputed only for the workers a turn touched (the one that
        # advanced, and those it pushed a request to, landed KV on or released KV from)
        times = [_next_s(w) for w in workers]
        self._touched: list = []
        num_finished = 0
        while num_finished < len(requests):
            send_s = self._sends[0][0] if self._sends else math.inf
            i = min(range(len(workers)), key=times.__getitem__)
            if send_s <= times[i]:
                self._deliver(heapq.heappop(self._sends))
            else:
                if times[i] == math.inf:
                    stuck = len(requests) - num_finished
                    raise RuntimeError(
                        f"the deployment stalled with {stuck} requests unfinished and no worker able to move"
                    )
                others = min((t for j, t in enumerate(times) if j != i), default=math.inf)
                events = workers[i].advance(min(send_s, others))
                times[i] = _next_s(workers[i])
                finished_now = 0
                for event in events:
                    finished_now += self._handle(i, event)
                if finished_now:
                    num_finished += finished_now
                    self.on_finished(finished_now)
            for w in self._touched:
                times[slot[id(w)]] = _next_s(w)
            self._touched.clear()
        rows = [self._paths[r].row() for r in sorted(self._paths)]
        paths = ColumnTable({name: [row[k] for row in rows] for k, name in enumerate(PATH_COLUMNS)})
        return DeploymentRecord(
            paths, [w.finish() for w in self.prefill], [w.finish() for w in self.decode], self.num_layers
        )

    # -- the client and the router -----------------------------------------------------------------

    def _send_next(self, finish_s: float | None) -> None:
        if self._num_sent >= len(self._requests):
            return
        request = self._requests[self._num_sent]
        send_s = request.arrival_s if finish_s is None else max(request.arrival_s, finish_s)
        heapq.heappush(self._sends, (send_s, self._num_sent, request))
        self._num_sent += 1

    def _deliver(self, send: tuple[float, int, Request]) -> None:
        send_s, _, request = send
        path = _Path(request, send_s)
        self._paths[request.request_id] = path
        if self.layerwise:  # decode first: the prompt goes to a prefill worker once its blocks are reserved
            self._to_decode(path, send_s)
        else:
            self._to_prefill(path, send_s)

    def _route(self, request: Request, role: Role) -> int:
        workers = self.prefill if role == "prefill" else self.decode
        views = [w.view(k) for k, w in enumerate(workers)]
        return checked_route(self.router, request, role, views)

    def _to_prefill(self, path: _Path, at_s: float) -> None:
        path.prefill_worker = self._route(path.request, "prefill")
        w = self.prefill[path.prefill_worker]
        w.push(path.request, at_s)  # (the worker runs it with one output token)
        self._touched.append(w)

    def _to_decode(self, path: _Path, at_s: float) -> None:
        path.decode_worker = self._route(path.request, "decode")
        w = self.decode[path.decode_worker]
        w.push(path.request, at_s)
        self._touched.append(w)

    # -- the workers' events -------------------------------------------------------------------------

    def _handle(self, worker: int, event) -> int:
        """Apply one worker's event; the number of requests it finished (0 or 1)."""
        path = self._paths[event.request_id]
        if isinstance(event, Prefilled):
            path.prefill_start_s, path.prefill_end_s, path.kv_bytes = event.start_s, event.end_s, event.kv_bytes
            if not self.layerwise:
                self._to_decode(path, event.end_s)
            else:
                self._maybe_transfer(path)
        elif isinstance(event, Admitted):
            path.decode_admitted_s = event.at_s
            if self.layerwise:
                self._to_prefill(path, event.at_s)
            else:
                self._maybe_transfer(path)
        elif isinstance(event, FirstToken):
            path.first_token_s = event.at_s
        elif isinstance(event, Finished):
            path.finish_s = event.at_s
            self._send_next(event.at_s)
            return 1
        return 0

    def _maybe_transfer(self, path: _Path) -> None:
        """Start the KV's transfer once its prompt is computed and the decode side has its blocks."""
        if path.prefill_end_s < 0 or path.decode_admitted_s < 0 or path.transfer is not None:
            return
        link = self.links[path.prefill_worker]
        path.transfer = transfer = link.schedule(
            path.kv_bytes,
            ready_s=path.decode_admitted_s,
            prefill_start_s=path.prefill_start_s,
            prefill_end_s=path.prefill_end_s,
            num_layers=self.num_layers,
        )
        request_id = path.request.request_id
        decode, prefill = self.decode[path.decode_worker], self.prefill[path.prefill_worker]
        decode.land(request_id, transfer.end_s)
        prefill.release(request_id, transfer.end_s)
        self._touched += (decode, prefill)


def kv_in_flight(paths: ColumnTable) -> tuple[np.ndarray, np.ndarray]:
    """KV bytes on the links over time: the times it changes and the bytes in flight from each."""
    start = np.asarray(paths["transfer_start_s"], dtype=np.float64)
    end = np.asarray(paths["transfer_end_s"], dtype=np.float64)
    size = np.asarray(paths["kv_transfer_bytes"], dtype=np.float64)
    moved = end >= 0
    times = np.concatenate([start[moved], end[moved]])
    deltas = np.concatenate([size[moved], -size[moved]])
    order = np.lexsort((deltas, times))  # at one instant a landing is counted before a start
    return times[order], np.cumsum(deltas[order])
