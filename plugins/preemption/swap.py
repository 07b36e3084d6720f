"""Swap preemption (vLLM v0): the victim's KV goes to host memory and comes back later."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.core.step import Mechanism
from kvbench.sched.preemption import PreemptionPolicy


class SwapPolicy(PreemptionPolicy):
    """Always swap. The transfer out is charged to the step that preempts, the transfer back to
    the step that resumes it; a victim that does not fit the host pool (``hardware.host_swap_bytes``)
    is recomputed instead, and the run counts that fallback."""

    name = "swap"

    def mechanism(self, group, ctx) -> str:
        return Mechanism.SWAP


@hookimpl
def kvbench_register_preemption_policies():
    return [SwapPolicy]
