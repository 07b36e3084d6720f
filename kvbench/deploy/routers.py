"""What every router shares: its plugin base, the least-loaded order, and the check of its answer.

The routers themselves are plugins (``kvbench_register_routers``; kvbench's own are under
``plugins/routers/``), picked with ``router=<name>`` (``conf/router/<name>.yaml``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from kvbench.core.request import Request
from kvbench.deploy.interfaces import Role, Router, WorkerView
from kvbench.errors import ConfigError


class RouterPlugin:
    """A router plugin's base: ``name`` matches ``conf/router/<name>.yaml``; ``Config`` is the
    dataclass of its options (None: it takes none), built from the ``router`` group's node."""

    name: ClassVar[str]
    Config: ClassVar[type | None] = None

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def route(self, request: Request, role: Role, workers: Sequence[WorkerView]) -> int:
        raise NotImplementedError


def least_loaded_key(view: WorkerView) -> tuple[int, int, int]:
    """Sort key of the least-loaded worker first: fewest requests waiting and running, then the
    most free KV bytes, then the lowest index (so that a choice never depends on list order)."""
    return (view.num_waiting + view.num_running, -view.free_kv_bytes, view.index)


def checked_route(router: Router, request: Request, role: Role, workers: Sequence[WorkerView]) -> int:
    """The index ``router`` picks among ``workers`` (the views of one role), or a one-line
    ConfigError when it names a worker the deployment does not have."""
    index = router.route(request, role, workers)
    known = {view.index for view in workers}
    if isinstance(index, bool) or not isinstance(index, int) or index not in known:
        raise ConfigError(
            f"router {getattr(router, 'name', type(router).__name__)!r} named {role} worker {index!r}; "
            f"the deployment has {len(workers)} (indices 0 to {len(workers) - 1}): fix the router plugin"
        )
    return index
