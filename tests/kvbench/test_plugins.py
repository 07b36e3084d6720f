"""Plugin loading: built-ins through entry points, duplicates named, broken plugins skipped."""

from __future__ import annotations

import types
from importlib.metadata import EntryPoint

import pytest

import kvbench.plugins as plugins
from kvbench import hookimpl
from kvbench.errors import ConfigError
from kvbench.plugins import PluginLoadWarning, make_plugin_manager, registry


def test_builtins_register_through_entry_points():
    pm = make_plugin_manager()
    assert {"naive", "per_request", "paged"} <= set(registry("allocator", pm))
    assert {"torch", "triton", "flashinfer"} <= set(registry("kernel", pm))
    assert {"recompute", "swap", "length_aware"} <= set(registry("preemption", pm))
    assert {"mixed", "prefill_first", "chunked", "static"} <= set(registry("scheduler", pm))
    assert "synthetic" in registry("workload", pm)
    # every built-in came in as a named entry point, exactly like an outside plugin
    assert pm.get_plugin("paged") is not None and pm.get_plugin("wandb") is not None


def test_two_plugins_registering_one_name_is_an_error_naming_both():
    from kvbench_plugins.allocators.paged import PagedAllocator

    class Impostor(PagedAllocator):
        name = "paged"

    impostor = types.ModuleType("impostor_plugin")

    @hookimpl
    def kvbench_register_allocators():
        return [Impostor]

    impostor.kvbench_register_allocators = kvbench_register_allocators
    pm = make_plugin_manager(extra_plugins=(impostor,))
    with pytest.raises(ConfigError) as err:
        registry("allocator", pm)
    message = str(err.value)
    assert "'paged'" in message and "'paged'" in message.split("both")[1] and "impostor_plugin" in message


def test_a_plugin_that_fails_to_import_warns_and_the_rest_load(monkeypatch):
    real = plugins.entry_points(group="kvbench")
    broken = EntryPoint(name="broken", value="kvbench_no_such_module_xyz", group="kvbench")
    monkeypatch.setattr(plugins, "entry_points", lambda group: [*real, broken])
    with pytest.warns(PluginLoadWarning, match="'broken'.*kvbench_no_such_module_xyz"):
        pm = make_plugin_manager()
    assert "paged" in registry("allocator", pm)


def test_unknown_name_lists_the_choices():
    with pytest.raises(
        ConfigError, match="allocator.name='pagd' is not a registered allocator; choose one of: .*paged"
    ):
        plugins.lookup("allocator", "pagd")


def test_kvbench_config_searchpath_is_collected():
    plugin = types.ModuleType("searchpath_plugin")

    @hookimpl
    def kvbench_config_searchpath():
        return "pkg://somewhere.conf"

    plugin.kvbench_config_searchpath = kvbench_config_searchpath
    pm = make_plugin_manager(extra_plugins=(plugin,))
    assert "pkg://somewhere.conf" in plugins.config_searchpaths(pm)


def test_kvbench_register_allocators_classes_follow_the_interface():
    from kvbench.memory.allocator import Allocator

    for name, cls in registry("allocator").items():
        assert issubclass(cls, Allocator) and cls.name == name


def test_kvbench_register_kernels_classes_follow_the_interface():
    from kvbench.kernels.kernel import Kernel

    for name, cls in registry("kernel").items():
        assert issubclass(cls, Kernel) and cls.name == name


def test_kvbench_register_preemption_policies_classes_follow_the_interface():
    from kvbench.sched.preemption import PreemptionPolicy

    for name, cls in registry("preemption").items():
        assert issubclass(cls, PreemptionPolicy) and cls.name == name


def test_kvbench_register_schedulers_classes_follow_the_interface():
    from kvbench.sched.scheduler import Scheduler

    for name, cls in registry("scheduler").items():
        assert issubclass(cls, Scheduler) and cls.name == name


def test_kvbench_register_workloads_classes_follow_the_interface():
    from kvbench.workload.source import WorkloadSource

    for name, cls in registry("workload").items():
        assert issubclass(cls, WorkloadSource) and cls.name == name
