"""Reloading prefix blocks from the host tier, and what it costs (``allocator.host_cache_bytes``).

The allocator knows which blocks are in host memory (:mod:`kvbench.memory.host_cache`); this
module decides *when* a waiting request's host-resident blocks are copied back and how the copy
is paid for, with the scheduler's admission (:meth:`kvbench.sched.scheduler.Scheduler.admit`):

- a reload is started only for the request at the head of the queue, and only when its whole
  first allocation fits now (:meth:`Allocator.can_allocate`, the watermark kept): the reload is
  then followed by an admission that fits, not by a refusal that would leave its blocks pinned.
  That test is also one a run of decode-only steps can only turn from true to false, so the
  event-driven loop, which skips such steps, starts the same reloads as the step-by-step loop;
- the reloaded blocks, and the GPU-cached ones of the same prefix, are pinned under a holder id
  until the request is admitted, so no eviction takes them. A request that another one overtakes
  (a priority queue) keeps its pin until its copy has landed (its blocks are not on the GPU before),
  then releases it: its blocks stay GPU-cached, and no memory stays pinned for a request that
  cannot be admitted;
- ``blocking``: the copy, ``bytes / host_link_bytes_per_s`` plus one transfer overhead
  (:meth:`CostModel.transfer_time_s`), is put in the step that admits the request
  (``StepPlan.host_reloads``) and lengthens it for every request of the batch;
- ``overlapped``: the copy starts when the request is first considered and the request is
  admitted at the first step boundary after its blocks have arrived; running requests keep
  computing meanwhile. The host->device direction of the link is one FIFO resource: a copy
  starts when the previous one has finished. The request's TTFT includes the wait.

Offloads (device->host copies of evicted blocks) are counted in bytes and taken as overlapped with
compute: they use the link's other direction (PCIe and C2C are full duplex) and need not finish
before anything else can run, as LMCache's and HiCache's asynchronous write-back.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.core.sequence import SequenceGroup
from kvbench.core.step import StepPlan
from kvbench.exec.costmodel import CostModel
from kvbench.memory.allocator import Allocator, SeqShape
from kvbench.memory.host_cache import HostReload


def holder_id(group: SequenceGroup) -> int:
    """The id the allocator pins a request's reloaded prefix under: negative, never a sequence's
    (-1 is left to tests, which use it for a probe allocation)."""
    return -2 - group.request_id


@dataclass
class _Load:
    group: SequenceGroup
    reload: HostReload
    start_s: float
    ready_s: float


class HostReloads:
    """The reload policy of one run (see the module docstring) and its totals."""

    def __init__(self, allocator: Allocator, cost: CostModel, *, blocking: bool) -> None:
        self.allocator = allocator
        self.cost = cost
        self.blocking = blocking
        #: when the host->device direction of the link is free again (overlapped copies queue)
        self.link_free_s = 0.0
        #: copies started and not yet consumed, by request id (overlapped: possibly several, one
        #: per request; blocking: at most the one of the admission being tried)
        self._loads: dict[int, _Load] = {}
        self._now_s = 0.0
        self.num_reloads = 0
        self.reload_bytes = 0
        #: the copies' own time on the link, summed
        self.reload_s = 0.0
        #: overlapped: from the start of each copy's wait (the request first considered) to the step
        #: that admitted it; blocking: 0 (the copy's time is added to a step instead)
        self.reload_wait_s = 0.0
        #: overlapped: time copies waited for the link behind earlier ones
        self.link_queue_s = 0.0
        #: blocking: time added to steps (each copy lengthens the step that admits its request)
        self.blocking_step_s = 0.0
        #: prompt positions served from host memory that the request had never computed (host hits)
        self.host_hit_tokens = 0
        #: reloaded positions that a readmitted request had computed itself before a preemption
        self.host_restored_tokens = 0

    def wake_s(self) -> float | None:
        """When the next overlapped copy in flight lands (the request waiting for it may be
        admitted at the first step boundary from then on); None when none is in flight."""
        landing = [load.ready_s for load in self._loads.values() if load.ready_s > self._now_s]
        return min(landing) if landing else None

    def start_step(self, clock_s: float, head: SequenceGroup | None) -> None:
        """A step begins: a request that is not at the head of the queue releases its pin once its
        copy has landed (its blocks stay GPU-cached; a pin never waits on another request)."""
        self._now_s = clock_s
        for request_id, load in list(self._loads.items()):
            if load.group is not head and load.ready_s <= clock_s:
                self._release(request_id)

    def before_admission(self, plan: StepPlan, group: SequenceGroup, shape: SeqShape, headroom_bytes: int) -> bool:
        """Called for the head of the queue before its admission is tried: starts its reload when
        it has host-resident blocks and fits; False when it must wait for a copy in flight (it is
        not refused: nobody overtakes it, running requests keep running)."""
        load = self._loads.get(group.request_id)
        if load is None:
            if not self.allocator.can_allocate(shape, headroom_bytes):
                return True  # tried as usual (refused, or a first chunk without the host blocks)
            reload = self.allocator.reload_from_host(holder_id(group), shape, headroom_bytes)
            if reload is None:
                return True
            copy_s = self.cost.transfer_time_s(reload.transfer)
            self.num_reloads += 1
            self.reload_bytes += reload.transfer.num_bytes
            self.reload_s += copy_s
            if self.blocking:
                plan.host_reloads.append(reload.transfer)
                self.blocking_step_s += copy_s
                self._loads[group.request_id] = _Load(group, reload, plan.start_s, plan.start_s)
                return True
            start_s = max(plan.start_s, self.link_free_s)
            self.link_queue_s += start_s - plan.start_s
            self.link_free_s = start_s + copy_s
            load = self._loads[group.request_id] = _Load(group, reload, plan.start_s, self.link_free_s)
        return plan.start_s >= load.ready_s

    def after_admission(self, plan: StepPlan, group: SequenceGroup, admitted: bool, restored_tokens: int) -> None:
        """The head's admission was tried: count its host hits when admitted (``restored_tokens``:
        the leading positions a readmitted request got back from the cache, not hits), and
        release the pin either way (a refused request's blocks stay GPU-cached)."""
        load = self._loads.get(group.request_id)
        if load is None:
            return
        if admitted:
            hit_tokens = load.reload.tokens_past(restored_tokens)
            self.host_hit_tokens += hit_tokens
            self.host_restored_tokens += load.reload.num_tokens - hit_tokens
            self.reload_wait_s += plan.start_s - load.start_s
        self._release(group.request_id)

    def _release(self, request_id: int) -> None:
        self.allocator.free(holder_id(self._loads.pop(request_id).group))
