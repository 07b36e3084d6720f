"""Length-aware preemption: per victim, whichever of swap and recompute costs less.

Recompute grows quadratically with the victim's length (attention), a swap linearly (bytes over
the host link), so there is one break-even length per model, machine and block size (lecture
10.5, Exercise 4): below it recomputing is cheaper, above it swapping is. The run reports it as
``swap_break_even_kv_tokens``.
"""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.core.step import Mechanism
from kvbench.sched.preemption import PreemptionPolicy


class LengthAwarePolicy(PreemptionPolicy):
    """Swap when its round trip costs less than recomputing the victim's prefill, else recompute."""

    name = "length_aware"

    def mechanism(self, group, ctx) -> str:
        return Mechanism.SWAP if ctx.swap_s(group) < ctx.recompute_s(group) else Mechanism.RECOMPUTE


@hookimpl
def kvbench_register_preemption_policies():
    return [LengthAwarePolicy]
