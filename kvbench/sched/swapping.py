"""Swap and reloads: the scheduler's traffic with host memory.

- *swap out* (:meth:`SwappingMixin._swap_out`): a victim the preemption policy swaps moves its
  blocks to the host pool and waits in ``swapped``;
- *swap in* (:meth:`SwappingMixin.resume_swapped`, a mechanism a policy calls): swapped requests
  come back, oldest preempted first, while they fit (keeping the watermark free unless nothing
  runs); they compute from the next step on;
- *reload* evicted prefix blocks from the allocator's host tier (``allocator.host_cache_bytes``):
  :class:`kvbench.sched.host_reload.HostReloads` decides when a waiting head's blocks are copied
  back and what the copy costs; admission asks it before and tells it after each try
  (:meth:`SwappingMixin._reload_before_admission`, :meth:`SwappingMixin._reload_after_admission`),
  and the engine asks when a copy in flight lands (:meth:`SwappingMixin.wake_s`).
"""

from __future__ import annotations

from kvbench.core.sequence import SequenceGroup, Status
from kvbench.core.step import StepPlan
from kvbench.exec.costmodel import CostModel
from kvbench.memory.allocator import Allocator
from kvbench.sched.host_reload import HostReloads


def host_reloads_for(allocator: Allocator, cost: CostModel) -> HostReloads | None:
    """Reloads from the allocator's host tier of evicted prefix blocks (None: no host tier)."""
    if getattr(allocator, "host_cache", None) is None:
        return None
    return HostReloads(allocator, cost, blocking=getattr(allocator.config, "host_reload", "") == "blocking")


class SwappingMixin:
    """The :class:`~kvbench.sched.scheduler.Scheduler`'s swaps and host reloads (``swapped``,
    ``host_pool`` and ``host_reloads``)."""

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

    def _swap_out(self, plan: StepPlan, victim: SequenceGroup) -> int:
        """Move a victim's blocks to the host pool (the policy checked they fit); it waits in
        ``swapped``. Returns the bytes moved."""
        held = victim.held_seqs()
        transfer = self.allocator.swap_out([s.seq_id for s in held])
        if not self.host_pool.reserve(victim.request_id, transfer.num_bytes):
            raise RuntimeError("the host pool refused a swap it had room for")
        for seq in held:
            seq.status = Status.SWAPPED
        victim.status = Status.SWAPPED
        self.swapped.appendleft(victim)
        plan.swap_out.append(transfer)
        return transfer.num_bytes

    # --- reloads from the host tier ------------------------------------------------------------------

    def wake_s(self) -> float | None:
        """When a host-tier reload in flight lands, so that the waiting request may be admitted at
        the next step boundary (the engine ends a run of decode steps there, and an idle engine
        waits for it); None when none is in flight."""
        return None if self.host_reloads is None else self.host_reloads.wake_s()

    def _reload_lands_after(self, clock_s: float) -> bool:
        wake_s = self.wake_s()
        return wake_s is not None and wake_s > clock_s

    def _reload_before_admission(self, plan: StepPlan, group: SequenceGroup) -> bool:
        """Before the head ``group``'s admission is tried: start the reload of its host-resident
        blocks if its first allocation fits now. False while a copy of them is in flight (it is
        not refused: nobody overtakes it)."""
        headroom = self.watermark_bytes if self.num_running_seqs else 0
        shape = group.shape(self._first_allocation_tokens(group))
        return self.host_reloads.before_admission(plan, group, shape, headroom)

    def _reload_after_admission(self, plan: StepPlan, group: SequenceGroup, admitted: bool) -> None:
        """After the head's admission was tried: its reload's blocks are counted (hits, or positions
        a readmission got back) and unpinned."""
        hit = self._admission_hit
        self.host_reloads.after_admission(plan, group, admitted, hit[1] if hit and hit[0] is group else 0)
