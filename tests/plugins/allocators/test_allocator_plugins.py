"""What every built-in allocator plugin owes the registry: its hook registers it, and its config
file lists every option of its ``Config`` with the option's default."""

from __future__ import annotations

from pathlib import Path

import pluggy
import pytest
from kvbench_plugins.allocators import naive, paged, per_request
from omegaconf import OmegaConf

from kvbench import hookspecs
from kvbench.app.config import plugin_config

CONF_DIR = Path(__file__).resolve().parents[3] / "conf" / "allocator"
#: the plugin module and its one allocator class
PLUGINS = {
    "naive": (naive, naive.NaiveAllocator),
    "paged": (paged, paged.PagedAllocator),
    "per_request": (per_request, per_request.PerRequestAllocator),
}


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_registers_through_the_hook(name):
    module, allocator = PLUGINS[name]
    pm = pluggy.PluginManager("kvbench")
    pm.add_hookspecs(hookspecs)
    pm.register(module)
    assert pm.hook.kvbench_register_allocators() == [[allocator]]


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_default_yaml_lists_every_option_with_its_default(name):
    _, allocator = PLUGINS[name]
    node = OmegaConf.load(CONF_DIR / f"{name}.yaml")
    assert node.name == name
    assert set(node.keys()) - {"name"} == set(allocator.Config.__dataclass_fields__)
    assert plugin_config(allocator, node, "allocator") == allocator.Config()
