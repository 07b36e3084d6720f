"""kvbench's public API: compose a config the way the CLI does, build a run's objects, run it.

    from kvbench.api import run
    result = run(["allocator=naive", "workload.num_requests=200"])
    result.summary["peak_concurrency"]

    from kvbench.api import build
    s = build(["model=opt-13b", "hardware=a100-40gb"])   # the run's objects, nothing run
    s.cost.decode_time_s(640 * 64), s.allocator.budget_bytes

Studies built on kvbench (:mod:`kvbench.studies`) import from here only: the specs, the cost model,
the allocator's value types, the closed forms of the SLO questions and the files a study writes
are re-exported below, so that the modules behind them can move without breaking a study.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, open_dict

from kvbench.app.config import CONFIG_GROUPS, PRESET_GROUPS, KvbenchConfig, to_dataclass
from kvbench.app.run import RunSetup
from kvbench.app.searchpath import register as register_searchpath
from kvbench.core.kv import SeqShape, Transfer
from kvbench.errors import ConfigError
from kvbench.exec import transfer as kernel_transfer
from kvbench.exec.costmodel import CostModel
from kvbench.io.atomic import write_frame, write_text
from kvbench.metrics.catalogue import ledger_parts, metric
from kvbench.output.figures import pyplot
from kvbench.output.provenance import kvbench_version
from kvbench.output.results import RunResult
from kvbench.slo.batch import memory_ceiling, slo_batch
from kvbench.slo.search import bisect
from kvbench.specs.hardware import HardwareSpec
from kvbench.specs.model import ModelConfig, ModelSpec, model_spec

__all__ = [
    "ConfigError",
    "CostModel",
    "HardwareSpec",
    "ModelSpec",
    "RunResult",
    "RunSetup",
    "SeqShape",
    "Transfer",
    "bisect",
    "build",
    "compose",
    "hardware_spec",
    "kernel_transfer",
    "kvbench_version",
    "ledger_parts",
    "memory_ceiling",
    "metric",
    "model_spec_of",
    "pyplot",
    "run",
    "slo_batch",
    "write_frame",
    "write_text",
]


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
    choices = {g: c for g, c in cfg.hydra.runtime.choices.items() if g in CONFIG_GROUPS or g in PRESET_GROUPS}
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def run(overrides: Sequence[str] = ()) -> RunResult:
    """Run one job in-process (no files written, no sinks called) and return its result."""
    from kvbench.app.run import execute

    cfg, choices = compose(overrides)
    return execute(cfg, choices)


def build(overrides: Sequence[str] | DictConfig = ()) -> RunSetup:
    """The run's objects for ``kvbench <overrides>`` (or an already composed config), validated and
    built as a run builds them, and not run: specs, allocator (fresh and empty), kernel, cost
    model, scheduler, workload source."""
    from kvbench.app.run import setup

    cfg = overrides if isinstance(overrides, DictConfig) else compose(overrides)[0]
    return setup(cfg)


def model_spec_of(cfg: DictConfig) -> ModelSpec:
    """The model spec of a composed config alone (no hardware needed: a 175B model fits no single
    GPU config, so :func:`build` would refuse it)."""
    return model_spec(to_dataclass(ModelConfig, cfg.model, "model"))


def hardware_spec(cfg: DictConfig) -> HardwareSpec:
    """The hardware spec of a composed config alone."""
    return to_dataclass(HardwareSpec, cfg.hardware, "hardware")
