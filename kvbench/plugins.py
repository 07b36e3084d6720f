"""Loading plugins through pluggy and merging what they register into name -> class tables."""

from __future__ import annotations

import functools
import warnings
from importlib.metadata import entry_points

import pluggy

from kvbench import hookspecs
from kvbench.errors import ConfigError

ENTRY_POINT_GROUP = "kvbench"

#: plugin config group -> the registration hook that fills it
GROUP_HOOKS = {
    "allocator": "kvbench_register_allocators",
    "kernel": "kvbench_register_kernels",
    "preemption": "kvbench_register_preemption_policies",
    "scheduler": "kvbench_register_schedulers",
    # not a config folder: scheduler.queue=<name> picks one
    "queue": "kvbench_register_queues",
    "workload": "kvbench_register_workloads",
    "router": "kvbench_register_routers",
}


class PluginLoadWarning(UserWarning):
    """A plugin failed to import; the others were loaded."""


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    # NOTE: pluggy's own load_setuptools_entrypoints aborts on the first import error, which would
    # let one broken outside plugin take every built-in down with it; load them one by one.
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure of a plugin is reported the same way
            warnings.warn(
                f"kvbench plugin {ep.name!r} ({ep.value}) failed to import and was skipped: "
                f"{type(exc).__name__}: {exc}",
                PluginLoadWarning,
                stacklevel=2,
            )
            continue
        pm.register(plugin, name=ep.name)


def make_plugin_manager(extra_plugins: tuple = ()) -> pluggy.PluginManager:
    """A fresh plugin manager with every installed plugin (plus ``extra_plugins``) registered."""
    pm = pluggy.PluginManager("kvbench")
    pm.add_hookspecs(hookspecs)
    _load_entry_points(pm)
    for plugin in extra_plugins:
        pm.register(plugin)
    pm.check_pending()  # a misspelled hook name in any plugin fails here, loudly
    return pm


@functools.lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager (entry points are read once)."""
    return make_plugin_manager()


def registry(group: str, pm: pluggy.PluginManager | None = None) -> dict[str, type]:
    """Map each name registered for ``group`` to its class; two plugins claiming one name is an error."""
    pm = pm or plugin_manager()
    hook_name = GROUP_HOOKS[group]
    owners: dict[str, str] = {}
    classes: dict[str, type] = {}
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        for cls in impl.function() or []:
            name = cls.name
            if name in classes:
                raise ConfigError(
                    f"{group} {name!r} is registered by both {owners[name]!r} and "
                    f"{impl.plugin_name!r}; uninstall one of them or rename its {group}"
                )
            owners[name] = impl.plugin_name
            classes[name] = cls
    return classes


def lookup(group: str, name: str, pm: pluggy.PluginManager | None = None) -> type:
    """The class registered as ``name`` in ``group``, or a ConfigError listing what exists."""
    classes = registry(group, pm)
    if name not in classes:
        raise ConfigError(
            f"{group}.name={name!r} is not a registered {group}; choose one of: {', '.join(sorted(classes))}"
        )
    return classes[name]


def config_searchpaths(pm: pluggy.PluginManager | None = None) -> list[str]:
    """Hydra search-path entries contributed by plugins, in a stable order."""
    pm = pm or plugin_manager()
    return sorted(p for p in pm.hook.kvbench_config_searchpath() if p)
