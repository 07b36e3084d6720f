"""Least loaded: the worker with the fewest requests waiting and running."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.deploy.routers import RouterPlugin, least_loaded_key


class LeastLoadedRouter(RouterPlugin):
    """The fewest requests waiting plus running; ties to the most free KV bytes (the worker that
    can admit the request soonest), then to the lowest index."""

    name = "least_loaded"

    def route(self, request, role, workers) -> int:
        return min(workers, key=least_loaded_key).index


@hookimpl
def kvbench_register_routers():
    return [LeastLoadedRouter]
