"""Check command-line overrides before Hydra sees them, so a typo costs one clear line.

Hydra's own messages for an unknown config option or key span several lines; this catches the
common cases (``allocator=pagd``, ``workload.rat=3``) first and names what is allowed.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from omegaconf import OmegaConf

from kvbench.app.config import CONFIG_GROUPS
from kvbench.errors import ConfigError

_ABSENT = object()


def _group_dirs(group: str, searchpaths: list[str]) -> list[Path]:
    dirs = [Path(str(resources.files("kvbench.conf"))) / group]
    for entry in searchpaths:
        if entry.startswith("pkg://"):
            try:
                dirs.append(Path(str(resources.files(entry[len("pkg://"):]))) / group)
            except ModuleNotFoundError:
                continue
        elif entry.startswith("file://"):
            dirs.append(Path(entry[len("file://"):]) / group)
    return dirs


def group_options(group: str, searchpaths: list[str] = ()) -> list[str]:
    """The names selectable as ``<group>=<name>`` (one YAML file each)."""
    names = {p.stem for d in _group_dirs(group, list(searchpaths)) if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names)


def _split(arg: str) -> tuple[str, str] | None:
    if arg.startswith("-") or "=" not in arg:
        return None
    key, value = arg.split("=", 1)
    if key.startswith(("hydra", "+", "~")) or "(" in value:  # hydra's own keys, additions, sweep functions
        return None
    return key, value


def check_overrides(args: list[str], searchpaths: list[str] = ()) -> None:
    """Raise a one-line ConfigError for an unknown group option or an unknown config key."""
    pairs = [p for p in map(_split, args) if p]
    selections: dict[str, str] = {}
    for key, value in pairs:
        if key in CONFIG_GROUPS:
            options = group_options(key, searchpaths)
            for choice in value.split(","):
                if choice not in options:
                    raise ConfigError(f"{key}={choice!r} is not a known {key}; choose one of: {', '.join(options)}")
            selections[key] = value.split(",")[0]
    dotted = [(k, v) for k, v in pairs if k not in CONFIG_GROUPS]
    if not dotted:
        return
    from hydra import compose, initialize_config_module

    overrides = [f"{g}={c}" for g, c in selections.items()]
    if searchpaths:
        overrides.append(f"hydra.searchpath=[{','.join(searchpaths)}]")
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    _check_keys_exist(cfg, dotted)
    # values of the wrong type (seed=abc): compose once more with the first value of each sweep
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    values = [f"{k}={v.split(',')[0]}" for k, v in dotted]
    try:
        with initialize_config_module("kvbench.conf", version_base="1.3"):
            compose("config", overrides=[*overrides, *values])
    except (HydraException, OmegaConfBaseException) as exc:
        cause = exc.__cause__ or exc
        detail = str(cause).splitlines()[0]
        raise ConfigError(f"{str(exc).splitlines()[0].removeprefix('Error merging override ')}: {detail}") from None


def _check_keys_exist(cfg, dotted: list[tuple[str, str]]) -> None:
    for key, value in dotted:
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            allowed = ", ".join(sorted(map(str, node.keys()))) if OmegaConf.is_dict(node) else "nothing"
            where = f"{parent}" if parent else "the top level"
            raise ConfigError(f"{key}={value} is not a config key: {leaf!r} is not in {where}; its keys are: {allowed}")
