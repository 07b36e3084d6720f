"""Recompute preemption: the victim drops its KV cache and is prefilled again when readmitted."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.sched.preemption import PreemptionPolicy


class RecomputePolicy(PreemptionPolicy):
    """Evict the newest running sequence (the default victim) and recompute its cache later.

    Its cost is paid on readmission, as a prefill of the prompt plus every token generated so
    far; the engine counts those tokens as the recompute tax.
    """

    name = "recompute"

    def mechanism(self, victim) -> str:
        return self.RECOMPUTE


@hookimpl
def kvbench_register_preemption_policies():
    return [RecomputePolicy]
