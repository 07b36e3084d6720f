"""Recompute preemption: the victim drops its KV cache and is prefilled again when readmitted."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.core.step import Mechanism
from kvbench.sched.preemption import PreemptionPolicy


class RecomputePolicy(PreemptionPolicy):
    """Always recompute (vLLM's default for single-sequence requests).

    The cost is paid on readmission, as a prefill of the prompt plus every token generated so far;
    those positions count toward the recompute tax.
    """

    name = "recompute"

    def mechanism(self, group, ctx) -> str:
        return Mechanism.RECOMPUTE


@hookimpl
def kvbench_register_preemption_policies():
    return [RecomputePolicy]
