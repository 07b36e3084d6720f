"""Plugin loading: built-ins through entry points, duplicates named, broken plugins skipped."""

from __future__ import annotations

import types
from importlib.metadata import EntryPoint

import pytest

import kvbench.plugins as plugins
from kvbench import hookimpl
from kvbench.deploy.routers import RouterPlugin
from kvbench.errors import ConfigError
from kvbench.kernels.kernel import Kernel
from kvbench.memory.allocator import Allocator
from kvbench.plugins import PluginLoadWarning, make_plugin_manager, registry
from kvbench.sched.preemption import PreemptionPolicy
from kvbench.sched.scheduler import Scheduler
from kvbench.workload.source import WorkloadSource


def test_builtins_register_through_entry_points():
    pm = make_plugin_manager()
    assert {"naive", "per_request", "paged"} <= set(registry("allocator", pm))
    assert {"torch", "triton", "flashinfer"} <= set(registry("kernel", pm))
    assert {"recompute", "swap", "length_aware"} <= set(registry("preemption", pm))
    assert {"mixed", "prefill_first", "chunked", "static"} <= set(registry("scheduler", pm))
    assert "synthetic" in registry("workload", pm)
    assert {"round_robin", "least_loaded", "prefix_aware"} <= set(registry("router", pm))
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


@pytest.mark.parametrize(
    ("kind", "interface"),
    [  # each case is named by the hook whose classes it checks (test_hookspecs looks for it)
        pytest.param("allocator", Allocator, id="kvbench_register_allocators"),
        pytest.param("kernel", Kernel, id="kvbench_register_kernels"),
        pytest.param("preemption", PreemptionPolicy, id="kvbench_register_preemption_policies"),
        pytest.param("scheduler", Scheduler, id="kvbench_register_schedulers"),
        pytest.param("workload", WorkloadSource, id="kvbench_register_workloads"),
        pytest.param("router", RouterPlugin, id="kvbench_register_routers"),
    ],
)
def test_registered_classes_follow_the_interface(kind, interface):
    for name, cls in registry(kind).items():
        assert issubclass(cls, interface) and cls.name == name
