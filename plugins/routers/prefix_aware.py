"""Prefix aware: the worker whose prefix cache holds the longest prefix of the prompt."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.deploy.routers import RouterPlugin, least_loaded_key


class PrefixAwareRouter(RouterPlugin):
    """The most prompt tokens already cached (they need no prefill there, as with SGLang's and
    llm-d's cache-aware routing); ties, and workers without a prefix cache (0 each), go as
    least_loaded sends them."""

    name = "prefix_aware"

    def route(self, request, role, workers) -> int:
        return min(workers, key=lambda view: (-view.cached_prefix_tokens(request), *least_loaded_key(view))).index


@hookimpl
def kvbench_register_routers():
    return [PrefixAwareRouter]
