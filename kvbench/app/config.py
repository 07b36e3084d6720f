"""Typed configuration: the top-level Hydra schema and the validation of plugin options.

Hydra composes ``conf/``; the schema below (registered in Hydra's ConfigStore as ``kvbench_schema``)
turns a misspelled top-level key into an error. Each plugin group (``allocator``, ``kernel``,
``preemption``, ``workload``) holds a ``name`` plus that plugin's options; the plugin's own
``Config`` dataclass types and checks them, so a misspelled option of an outside plugin is caught
the same way. Values are range-checked once, here at the edge, with one-line messages.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from kvbench.deploy.config import DeploymentConfig  # pandas-free, for --help
from kvbench.errors import ConfigError, require
from kvbench.errors.extras import install_hint
from kvbench.metrics.slo_config import SloConfig  # pandas-free, for --help

MODES = ("sim", "real")
WANDB_MODES = ("offline", "online", "disabled")
#: W&B's older names, accepted in the WANDB_MODE variable (which W&B programs share)
WANDB_MODE_ALIASES = {"dryrun": "offline", "run": "online"}


@dataclass
class OutputConfig:
    #: write Parquet/CSV/figures into the job's folder under results/
    write: bool = True
    #: also write the per-step table (large for long runs)
    steps: bool = True
    #: draw matplotlib figures next to the tables
    figures: bool = True

    def validate(self) -> None:
        """Three booleans: OmegaConf's typing already checked them."""


@dataclass
class WandbConfig:
    #: disabled (default), offline (no account, no network: runs to upload later with ``wandb sync``)
    #: or online; W&B is an optional extra (``pip install -e '.[wandb]'`` in a clone). The environment
    #: variable WANDB_MODE, when set, overrides it (see kvbench_plugins.wandb_sink)
    mode: str = "disabled"
    project: str = "kvbench"
    entity: str | None = None
    #: the W&B group of the runs; null: a sweep's folder (one study), none for a single run. Set it
    #: to gather the sweeps of one study split across machines (docs/launchers.md)
    group: str | None = None

    def validate(self) -> None:
        allowed = f"choose one of {', '.join(WANDB_MODES)}"
        require(self.mode in WANDB_MODES, "wandb.mode", self.mode, allowed)
        # checked here, not when the sink runs: a bad value must stop the run before it simulates
        env_mode = os.environ.get("WANDB_MODE")
        ok = env_mode is None or env_mode in WANDB_MODES or env_mode in WANDB_MODE_ALIASES
        require(ok, "WANDB_MODE (environment)", env_mode, f"unset it or {allowed}")
        if env_mode:
            mode, asked_by = WANDB_MODE_ALIASES.get(env_mode, env_mode), f"WANDB_MODE={env_mode} (environment)"
        else:
            mode, asked_by = self.mode, f"wandb.mode={self.mode}"
        if mode != "disabled" and not wandb_installed():
            # asked for and absent: a run that silently logged nothing would lose what was asked for
            off = "unset WANDB_MODE" if env_mode else "leave wandb.mode at disabled"
            raise ConfigError(
                f"{asked_by} logs the run to Weights & Biases, which is not installed: "
                f"{install_hint('wandb')}, or {off}"
            )


def wandb_refusal(args: list[str]) -> str | None:
    """One line when a command line (or ``WANDB_MODE``) asks for W&B and it is not installed, said
    before a sweep starts (each job would fail alike); None otherwise. A config file asking for it
    is caught by each job's :meth:`WandbConfig.validate`."""
    if wandb_installed():
        return None
    env_mode = os.environ.get("WANDB_MODE")
    logging_modes = {"offline", "online", *WANDB_MODE_ALIASES}
    if env_mode in logging_modes:
        return (
            f"WANDB_MODE={env_mode} (environment) logs the run to Weights & Biases, which is not installed: "
            f"{install_hint('wandb')}, or unset WANDB_MODE"
        )
    for arg in args:
        key, _, value = arg.lstrip("+~").partition("=")
        asked = [v.strip() for v in value.split(",") if v.strip() in logging_modes]
        if key == "wandb.mode" and asked and env_mode is None:
            return (
                f"wandb.mode={asked[0]} logs the run to Weights & Biases, which is not installed: "
                f"{install_hint('wandb')}, or leave wandb.mode at disabled"
            )
    return None


def wandb_installed() -> bool:
    """Whether the optional ``wandb`` package can be imported (found, not imported: it is slow)."""
    import importlib.util

    return importlib.util.find_spec("wandb") is not None


@dataclass
class EngineConfig:
    """Which engine's conventions the run follows: ``engine=<preset>`` (conf/engine/) sets this
    and the scheduler options that make kvbench decide step by step as that engine does."""

    #: kvbench (its own defaults), or the preset's engine: vllm_v1, nano_vllm
    name: str = "kvbench"
    #: the engine release the preset was checked against step by step (kvbench diff-engine)
    version: str | None = None
    #: the block pool keeps one block out of use (vLLM's null block, the placeholder a padded block
    #: table points at): the KV budget holds one block fewer
    null_block: bool = False
    #: with a paged allocator's prefix cache: a block computed with content another block already
    #: holds is cached too (vLLM's BlockPool does not de-duplicate); turns on the allocator's
    #: ``cache_duplicate_blocks``, and changes nothing without prefix caching
    cache_duplicate_blocks: bool = False
    #: sim mode: the engine's host work per step (scheduling, sampling, launches), in seconds, added
    #: to every step's price; null: the kernel calibration's fitted ``step_overhead_s`` (0 without
    #: one). ``kvbench validate`` fits one per framework from the silicon rows (kvbench.validation.overhead)
    step_overhead_s: float | None = None

    def validate(self) -> None:
        require(isinstance(self.name, str) and bool(self.name), "engine.name", self.name, "name the engine")
        overhead_s = self.step_overhead_s
        require(
            overhead_s is None
            or (isinstance(overhead_s, (int, float)) and not isinstance(overhead_s, bool) and 0 <= overhead_s <= 1),
            "engine.step_overhead_s",
            overhead_s,
            "use null or seconds in [0, 1]",
        )
        require(isinstance(self.null_block, bool), "engine.null_block", self.null_block, "use true or false")
        require(
            isinstance(self.cache_duplicate_blocks, bool),
            "engine.cache_duplicate_blocks",
            self.cache_duplicate_blocks,
            "use true or false",
        )


def _group() -> Any:
    """A config group: a folder of ``conf/`` whose option is picked with ``<group>=<name>``."""
    return field(default=None, metadata={"group": True})


@dataclass
class KvbenchConfig:
    """The whole run. Group nodes are typed by their own ``Config`` (the plugin's, or the spec's),
    checked where they are built; the other sections are range-checked by their ``validate()``."""

    model: Any = _group()
    hardware: Any = _group()
    allocator: Any = _group()
    kernel: Any = _group()
    preemption: Any = _group()
    scheduler: Any = _group()
    workload: Any = _group()
    #: which worker a request goes to in a disaggregated deployment (a ``router`` plugin)
    router: Any = _group()
    #: sim: a cost model of the GPU executes each step; real: a CUDA GPU does
    mode: str = "sim"
    seed: int = 0
    #: show a progress bar for long runs
    progress: bool = True
    #: advance runs of decode-only steps in one computation (identical results; false takes every
    #: step one by one, the reference the tests compare against)
    event_driven: bool = True
    #: a folder of <hardware>/<kernel>.json decode efficiencies (the files ``kvbench bench-kernels``
    #: writes) to use instead of kvbench's own kvbench/calibrations/; null: kvbench's own
    calibration_dir: str | None = None
    #: refuse, before it starts, a run whose estimated memory exceeds what this machine (or its
    #: cgroup) has available; false runs it anyway
    check_memory: bool = True
    #: the engine whose conventions the run follows (a preset from conf/engine/ sets it)
    engine: EngineConfig = field(default_factory=EngineConfig)
    #: one engine (aggregated) or prefill and decode workers (disagg): conf/deployment/
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig, metadata={"group": True})
    slo: SloConfig = field(default_factory=SloConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


#: config groups of presets, not plugins: a file sets keys of other groups (conf/engine/)
PRESET_GROUPS: tuple[str, ...] = ("engine",)
#: every config group, in the order the defaults list and the help show them (the one list of them)
CONFIG_GROUPS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(KvbenchConfig) if f.metadata.get("group"))


def _format_omegaconf_error(group: str, exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None) or ""
    msg = str(exc).splitlines()[0]
    where = f"{group}.{key}" if key and not str(key).startswith(group) else (key or group)
    if isinstance(exc, MissingMandatoryValue):  # a `???` option the user must give
        return f"{where} is required: set it with {where}=<value>"
    return f"{where}: {msg}"


#: an int option must fit numpy's int64 (the simulator's arrays and the Parquet columns use it)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def check_numbers(value: Any, key: str) -> None:
    """Raise a one-line ConfigError for the first float that is inf or nan, or int outside int64,
    in ``value`` (a dataclass, list, dict or number, searched recursively; None and bool pass).

    One check for every numeric option of kvbench and of its plugins, before any ``validate()``
    computes with them: ``inf`` and ``nan`` pass comparisons such as ``> 0`` (inf) or fail them
    silently (nan), and only surface later as a division by zero or nonsense numbers."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, float):
        require(math.isfinite(value), key, value, "use a finite number")
    elif isinstance(value, int):
        require(INT64_MIN <= value <= INT64_MAX, key, value, f"use an integer in [{INT64_MIN}, {INT64_MAX}] (int64)")
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            check_numbers(getattr(value, f.name), f"{key}.{f.name}")
    elif isinstance(value, dict):
        for k, v in value.items():
            check_numbers(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_numbers(v, f"{key}[{i}]")


def _check_known_keys(schema: type, node: Any, group: str) -> None:
    """Refuse a key the schema does not have. OmegaConf's merge already refuses it in a plain node,
    but not in a node Hydra typed with the same dataclass (``slo``, ``output``, ``wandb``) given a
    key with ``+slo.foo=1``: the merge keeps it and ``to_object`` drops it silently."""
    if not (isinstance(node, dict) or OmegaConf.is_dict(node)):
        return
    known = [f.name for f in dataclasses.fields(schema)]
    for key in node.keys():
        if key not in known:
            raise ConfigError(f"{group}.{key} is not a config key of {group}; its keys are: {', '.join(known)}")


def _check_bools(schema: type, node: Any, group: str) -> None:
    """Refuse a boolean option given anything but true or false: OmegaConf's merge would turn an
    integer (``allocator.prefix_caching=2``) or "yes" into a bool without a word."""
    import typing

    if not (isinstance(node, dict) or OmegaConf.is_dict(node)):
        return
    try:
        hints = typing.get_type_hints(schema)
    except Exception:  # noqa: BLE001 - an outside plugin's annotation that cannot be resolved here
        hints = {f.name: f.type for f in dataclasses.fields(schema)}
    for f in dataclasses.fields(schema):
        if hints.get(f.name) in (bool, "bool") and f.name in node:
            value = node[f.name]
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"{group}.{f.name}={value!r} is invalid: use true or false")


def to_dataclass(schema: type, node: Any, group: str) -> Any:
    """Merge a config node into ``schema`` (a dataclass with a ``validate()``, as every config of
    kvbench and of its plugins has), so unknown keys, wrong types and bad values fail clearly."""
    try:
        base = OmegaConf.structured(schema)
        merged = OmegaConf.merge(base, node if node is not None else {})
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_format_omegaconf_error(group, exc)) from None
    _check_known_keys(schema, node, group)
    _check_bools(schema, node, group)
    check_numbers(obj, group)
    obj.validate()
    return obj


def plugin_config(cls: type, node: DictConfig | dict, group: str) -> Any:
    """The plugin's typed ``Config`` filled from its group node (whose ``name`` selected the plugin)."""
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    data.pop("name", None)
    schema = cls.Config  # every plugin interface declares it (None: no options)
    if schema is None:
        require(not data, group, data, f"{cls.name!r} takes no options")
        return None
    if "name" in {f.name for f in dataclasses.fields(schema)}:
        data["name"] = cls.name
    return to_dataclass(schema, data, group)
