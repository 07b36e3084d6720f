"""Preemption: when a running sequence cannot grow, who gives up its memory, and how.

The scheduler owns the two mechanisms: ``recompute`` (drop the victim's KV; it rejoins the front
of the waiting queue and is prefilled again) and ``swap`` (copy its KV to host memory; it waits in
the swapped queue and comes back before any new request is admitted). A policy only decides: which
request, among the candidates the scheduler offers, and which mechanism. Victims are whole
requests (all branches of a fan-out together). A preempted request loses its cache, never its
tokens: it resumes where it stopped.

Two choices are separate axes:

- the mechanism, per policy plugin: ``recompute``, ``swap``, or ``length_aware`` (per victim, the
  cheaper of the two from the same cost model the executor uses);
- the victim, per the ``victim`` option every policy has: ``newest`` (the last admitted, as vLLM
  and nano-vllm do: it has the least progress to lose and the weakest claim under first come first
  served), ``least_progress`` (the fewest KV tokens to lose), ``cost_aware`` (the least time
  spent per byte freed, under the policy's mechanism) or ``lowest_priority`` (the largest
  ``(Request.priority, arrival, request_id)``, as vLLM's priority policy: chosen among every
  running request, one that already ran this step included, which then gives its step back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kvbench.core.sequence import SequenceGroup
from kvbench.core.step import Mechanism
from kvbench.errors import require

if TYPE_CHECKING:
    from kvbench.exec.costmodel import CostModel
    from kvbench.memory.allocator import Allocator
    from kvbench.memory.host_pool import HostSwapPool


class PreemptionContext:
    """What a policy may ask about a candidate, priced by the executor's own cost model."""

    def __init__(self, allocator: Allocator, cost: CostModel, host_pool: HostSwapPool) -> None:
        self._allocator = allocator
        self._cost = cost
        self._host_pool = host_pool

    def recompute_s(self, group: SequenceGroup) -> float:
        """Prefill time to compute its KV again: the prompt once, then each branch's own tokens."""
        held = group.held_seqs()
        if not group.is_forked:
            return sum(self._cost.prefill_time_s(s.num_computed_tokens) for s in held)
        prompt = group.request.prompt_tokens
        return self._cost.prefill_time_s(prompt) + sum(
            self._cost.prefill_chunk_time_s(s.num_computed_tokens - prompt, prompt) for s in held
        )

    def swap_s(self, group: SequenceGroup) -> float:
        """Transfer time out to host memory and back."""
        return self._cost.swap_round_trip_s(self._footprint(group).transfer)

    def freed_bytes(self, group: SequenceGroup) -> int:
        """Device bytes its eviction frees."""
        return self._footprint(group).held_bytes

    def can_swap(self, group: SequenceGroup) -> bool:
        """Whether the allocator can swap and the host pool has room for it."""
        if not self._allocator.capabilities.can_swap:
            return False
        need = self._footprint(group).transfer.num_bytes
        return self._host_pool.used_bytes + need <= self._host_pool.capacity_bytes

    def cost_s(self, group: SequenceGroup, mechanism: Mechanism) -> float:
        return self.swap_s(group) if mechanism == Mechanism.SWAP else self.recompute_s(group)

    def _footprint(self, group: SequenceGroup):
        return self._allocator.footprint([s.seq_id for s in group.held_seqs()])


def _newest(candidates: Sequence[SequenceGroup], policy: PreemptionPolicy, ctx: PreemptionContext) -> int:
    return len(candidates) - 1


def _least_progress(candidates: Sequence[SequenceGroup], policy: PreemptionPolicy, ctx: PreemptionContext) -> int:
    # ties go to the newest, as with `newest`
    return min(range(len(candidates)), key=lambda i: (candidates[i].num_cached_positions(), -i))


def _cost_aware(candidates: Sequence[SequenceGroup], policy: PreemptionPolicy, ctx: PreemptionContext) -> int:
    def seconds_per_byte(i: int) -> tuple[float, int]:
        group = candidates[i]
        return ctx.cost_s(group, policy.mechanism(group, ctx)) / max(ctx.freed_bytes(group), 1), -i

    return min(range(len(candidates)), key=seconds_per_byte)


def _lowest_priority(candidates: Sequence[SequenceGroup], policy: PreemptionPolicy, ctx: PreemptionContext) -> int:
    # vLLM: max(running, key=(priority, arrival_time)). vLLM stamps arrival_time at submission, so
    # two requests never tie and the later one ranks lower; a trace's rows may share an arrival
    # (a batch at t = 0), and the row order (request_id) stands in for the submission order. A tie
    # broken towards the first admitted instead makes two equal requests evict each other for ever
    # under recompute: each is preempted by the other's recomputation before it can finish
    def rank(i: int) -> tuple[int, float, int]:
        request = candidates[i].request
        return request.priority, request.arrival_s, request.request_id

    return max(range(len(candidates)), key=rank)


#: victim option -> chooser(candidates in admission order, policy, context) -> index
VICTIMS: dict[str, Callable[[Sequence[SequenceGroup], PreemptionPolicy, PreemptionContext], int]] = {
    "newest": _newest,
    "least_progress": _least_progress,
    "cost_aware": _cost_aware,
    "lowest_priority": _lowest_priority,
}
#: victim options chosen among every running request, not only those still to run this step
VICTIMS_OVER_ALL_RUNNING = frozenset({"lowest_priority"})


@dataclass
class PreemptionConfig:
    #: which running request gives up its memory: newest (vLLM), least_progress, cost_aware,
    #: lowest_priority (vLLM's priority policy)
    victim: str = "newest"

    def validate(self) -> None:
        require(self.victim in VICTIMS, "preemption.victim", self.victim, f"choose one of {', '.join(VICTIMS)}")


class PreemptionPolicy:
    """A preemption plugin: ``name`` matches ``conf/preemption/<name>.yaml``; implement :meth:`mechanism`."""

    name: ClassVar[str]
    Config: ClassVar[type] = PreemptionConfig

    def __init__(self, config: Any = None) -> None:
        self.config = config if config is not None else self.Config()

    @property
    def considers_scheduled(self) -> bool:
        """Whether the victim is chosen among every running request (the scheduler then offers
        those that already ran this step too), not only those still to run."""
        return self.config.victim in VICTIMS_OVER_ALL_RUNNING

    def mechanism(self, group: SequenceGroup, ctx: PreemptionContext) -> Mechanism:
        """How ``group`` gives up its memory: ``Mechanism.RECOMPUTE`` or ``Mechanism.SWAP``."""
        raise NotImplementedError

    def choose(self, candidates: Sequence[SequenceGroup], ctx: PreemptionContext) -> tuple[int, Mechanism]:
        """The victim (an index into ``candidates``, which are in admission order) and its mechanism."""
        index = VICTIMS[self.config.victim](candidates, self, ctx)
        return index, self.mechanism(candidates[index], ctx)
