"""Round robin: each role's workers in turn."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.deploy.routers import RouterPlugin


class RoundRobinRouter(RouterPlugin):
    """The next worker of the role, one request each; prefill and decode keep their own turn, so
    routing a request to a prefill worker never moves the decode side's turn."""

    name = "round_robin"

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self._turns: dict[str, int] = {}

    def route(self, request, role, workers) -> int:
        turn = self._turns.get(role, 0)
        self._turns[role] = turn + 1
        ordered = sorted(workers, key=lambda view: view.index)
        return ordered[turn % len(ordered)].index


@hookimpl
def kvbench_register_routers():
    return [RoundRobinRouter]
