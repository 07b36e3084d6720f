"""Typed configuration: the top-level Hydra schema and the validation of plugin options.

Hydra composes ``conf/``; the schema below (registered in Hydra's ConfigStore as ``kvbench_schema``)
turns a misspelled top-level key into an error. Each plugin group (``allocator``, ``kernel``,
``preemption``, ``workload``) holds a ``name`` plus that plugin's options; the plugin's own
``Config`` dataclass types and checks them, so a misspelled option of an outside plugin is caught
the same way. Values are range-checked once, here at the edge, with one-line messages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kvbench.errors import ConfigError, require

MODES = ("sim", "real")
WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class SchedulerConfig:
    #: most sequences in one batch (vLLM's max_num_seqs)
    max_num_seqs: int = 1024
    #: prompt tokens prefilled in one step; a longer prompt alone still runs (no chunked prefill)
    max_num_batched_tokens: int = 8192
    #: fraction of the KV budget kept free when admitting, so running sequences can grow
    #: (vLLM's watermark); allocators that reserve a sequence's whole future at admission ignore it
    watermark_fraction: float = 0.01

    def validate(self) -> None:
        require(self.max_num_seqs >= 1, "scheduler.max_num_seqs", self.max_num_seqs, "use an integer >= 1")
        require(
            self.max_num_batched_tokens >= 1,
            "scheduler.max_num_batched_tokens",
            self.max_num_batched_tokens,
            "use an integer >= 1",
        )
        require(
            0.0 <= self.watermark_fraction < 1.0,
            "scheduler.watermark_fraction",
            self.watermark_fraction,
            "use a fraction in [0, 1)",
        )


@dataclass
class SloConfig:
    """Latency objectives; a request counts toward goodput only if it meets every one given."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def validate(self) -> None:
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, key)
            require(value is None or value > 0, f"slo.{key}", value, "use a positive number of seconds or null")


@dataclass
class OutputConfig:
    #: write Parquet/CSV/figures into the job's folder under results/
    write: bool = True
    #: also write the per-step table (large for long runs)
    steps: bool = True
    #: draw matplotlib figures next to the tables
    figures: bool = True


@dataclass
class WandbConfig:
    #: offline (default: no account, no network), online (opt in), or disabled
    mode: str = "offline"
    project: str = "kvbench"
    entity: str | None = None

    def validate(self) -> None:
        require(self.mode in WANDB_MODES, "wandb.mode", self.mode, f"choose one of {', '.join(WANDB_MODES)}")


@dataclass
class KvbenchConfig:
    """The whole run. Group nodes are typed by their plugin's ``Config``, checked in :func:`plugin_config`;
    the other sections are range-checked by their own ``validate()`` in :func:`kvbench.app.run.setup`."""

    model: Any = None
    hardware: Any = None
    allocator: Any = None
    kernel: Any = None
    preemption: Any = None
    workload: Any = None
    #: sim: a cost model of the GPU executes each step; real: a CUDA GPU does
    mode: str = "sim"
    seed: int = 0
    #: show a progress bar for long runs
    progress: bool = True
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


def _format_omegaconf_error(group: str, exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None) or ""
    msg = str(exc).splitlines()[0]
    where = f"{group}.{key}" if key and not str(key).startswith(group) else (key or group)
    return f"{where}: {msg}"


def to_dataclass(schema: type, node: Any, group: str) -> Any:
    """Merge a config node into ``schema`` (a dataclass), so unknown keys and wrong types fail clearly."""
    try:
        base = OmegaConf.structured(schema)
        merged = OmegaConf.merge(base, node if node is not None else {})
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_format_omegaconf_error(group, exc)) from None
    if hasattr(obj, "validate"):
        obj.validate()
    return obj


def plugin_config(cls: type, node: DictConfig | dict, group: str) -> Any:
    """The plugin's typed ``Config`` filled from its group node (whose ``name`` selected the plugin)."""
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    data.pop("name", None)
    schema = getattr(cls, "Config", None)
    if schema is None:
        require(not data, group, data, f"{cls.name!r} takes no options")
        return None
    if "name" in {f.name for f in dataclasses.fields(schema)}:
        data["name"] = cls.name
    return to_dataclass(schema, data, group)
