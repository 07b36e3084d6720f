"""Hydra's side of kvbench's plugins: their config folders join Hydra's config search path.

A kvbench plugin announces its ``conf/`` folder through the ``kvbench_config_searchpath`` hook.
:class:`KvbenchSearchPathPlugin` is a Hydra ``SearchPathPlugin`` that appends those folders
wherever Hydra composes a config (a run, every job of a sweep, ``--cfg``, ``--info searchpath``, tab
completion), after whatever a user gives with ``hydra.searchpath`` or ``-cd``. It is registered
with Hydra by :func:`register` (Hydra's scan of the ``hydra_plugins`` namespace cannot list
modules of an editable install, so kvbench registers it itself before Hydra starts).
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class KvbenchSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from kvbench.plugins import config_searchpaths

        for path in config_searchpaths():
            search_path.append(provider="kvbench-plugin", path=path)


def register() -> None:
    """Make Hydra use kvbench's search-path plugin and know kvbench's sweeper in this process
    (idempotent; importing the sweeper stores its config option, ``hydra/sweeper=kvbench``)."""
    from hydra.core.plugins import Plugins
    from hydra_plugins.kvbench_sweeper import KvbenchSweeper

    Plugins.instance().register(KvbenchSearchPathPlugin)
    Plugins.instance().register(KvbenchSweeper)
