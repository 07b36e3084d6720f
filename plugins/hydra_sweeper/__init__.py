"""kvbench's Hydra sweeper (``hydra/sweeper=kvbench``, kvbench's default): Hydra's basic sweeper,
whose jobs leave out a key that the job's own option of a config group does not have while another
option the sweep picks does (:mod:`kvbench.app.sweep_jobs`), so that
``kvbench -m allocator=paged,vattention allocator.page_size_bytes=65536,2097152`` runs paged once
and vAttention at each page size.

Hydra loads sweepers only from its ``hydra_plugins`` namespace: this folder installs as
``hydra_plugins.kvbench_sweeper`` (pyproject's package-dir), and importing it stores the option
``hydra/sweeper=kvbench`` in Hydra's ConfigStore. ``kvbench.app.searchpath.register`` imports and
registers it before Hydra starts, as Hydra's own scan of the namespace would.

(No ``from __future__ import annotations``: Hydra's scan runs this module outside ``sys.modules``,
where a dataclass cannot resolve annotations written as strings.)
"""

from dataclasses import dataclass
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException

from kvbench.app.sweep_jobs import repository_option_keys, sweep_jobs


@dataclass
class KvbenchSweeperConf:
    _target_: str = "hydra_plugins.kvbench_sweeper.KvbenchSweeper"
    max_batch_size: Any = None  # jobs launched (and validated) at a time; null: all at once
    params: Any = None  # swept overrides kept in the config, as for Hydra's basic sweeper


ConfigStore.instance().store(group="hydra/sweeper", name="kvbench", node=KvbenchSweeperConf, provider="kvbench")


class KvbenchSweeper(BasicSweeper):
    """Hydra's basic sweeper with kvbench's job list (same order, same batches, same launchers)."""

    def split_arguments(self, overrides: list, max_batch_size: int | None) -> list[list[list[str]]]:
        assert self.hydra_context is not None
        _check_batch_size(max_batch_size)
        jobs = sweep_jobs(overrides, repository_option_keys(self.hydra_context.config_loader.repository))
        return [jobs] if max_batch_size is None else list(self.split_overrides_to_chunks(jobs, max_batch_size))


def _check_batch_size(max_batch_size: Any) -> None:
    """Hydra's basic sweeper asserts a batch size > 0 deep in its loop (a traceback): said here, in
    one line, before any job starts. -1 is Hydra's own spelling of "all at once", as null is."""
    ok = max_batch_size is None or (
        isinstance(max_batch_size, int)
        and not isinstance(max_batch_size, bool)
        and (max_batch_size >= 1 or max_batch_size == -1)
    )
    if not ok:
        raise HydraException(
            f"hydra.sweeper.max_batch_size={max_batch_size!r} is invalid: use a number of jobs >= 1 "
            "launched at a time, or null (all at once)"
        )
