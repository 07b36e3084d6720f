"""Use kvbench from Python: compose a config the way the CLI does and run it.

    from kvbench.api import run
    result = run(["allocator=naive", "workload.num_requests=200"])
    result.summary["peak_concurrency"]
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, open_dict

from kvbench.app.config import CONFIG_GROUPS, KvbenchConfig
from kvbench.app.searchpath import register as register_searchpath
from kvbench.errors import ConfigError
from kvbench.output.results import RunResult


def compose(overrides: Sequence[str] = ()) -> tuple[DictConfig, dict[str, str]]:
    """The composed run config and the group options chosen, as ``kvbench <overrides>`` would see them."""
    from kvbench.app.overrides import bool_override_error

    bad = bool_override_error(list(overrides))
    if bad:
        raise ConfigError(bad)
    ConfigStore.instance().store(name="kvbench_schema", node=KvbenchConfig)
    register_searchpath()  # plugins' config folders join Hydra's search path
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
    choices = {g: c for g, c in cfg.hydra.runtime.choices.items() if g in CONFIG_GROUPS}
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def run(overrides: Sequence[str] = ()) -> RunResult:
    """Run one job in-process (no files written, no sinks called) and return its result."""
    from kvbench.app.run import execute

    cfg, choices = compose(overrides)
    return execute(cfg, choices)
