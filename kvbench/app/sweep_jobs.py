"""The jobs of a sweep over a config group whose options have keys of their own.

``kvbench -m allocator=paged,vattention allocator.page_size_bytes=65536,2097152`` compares paging
with vAttention at two page sizes. Hydra's basic sweeper makes the cross product, four jobs, and the
two paged jobs cannot even be composed: ``page_size_bytes`` is a key of ``allocator=vattention``
only. What a user means is the product over the keys each option has: paged once, vAttention at
each page size, three jobs. :func:`sweep_jobs` makes that list: a job that picks option ``o`` of
group ``g`` drops its ``g.key=...`` overrides where ``o`` has no ``key`` but another option of ``g``
the sweep picks does, and jobs left identical run once (the first keeps its place).

An override of a key that no picked option has is kept: Hydra refuses it, as for a single run, and
kvbench says in one line whose key it is (:mod:`kvbench.app.overrides`). An override with a ``+``,
``++`` or ``~`` prefix says on purpose what to do with the key and is always kept.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

#: (group, option) -> the option's top-level keys, or None when they cannot be read from its file
OptionKeys = Callable[[str, str], "frozenset[str] | None"]


def sweep_jobs(overrides: Sequence[Any], option_keys: OptionKeys) -> list[list[str]]:
    """Each job's overrides (``"key=value"`` strings) for Hydra's parsed ``overrides``, in the basic
    sweeper's order, less the keys a job's own option of a group does not have (see the module)."""
    axes: OrderedDict[str, list[tuple[str, Any]]] = OrderedDict()
    for override in overrides:
        key = override.get_key_element()
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                from hydra.errors import HydraException

                raise HydraException(f"kvbench's sweeper sweeps lists and choice() only, not {override.input_line}")
            values = list(override.sweep_string_iterator())
        else:
            values = [override.get_value_element_as_str()]
        axes[key] = [(f"{key}={value}", override) for value in values]
    # the options each swept (or set) group is given somewhere in the sweep
    picked: dict[str, list[str]] = {}
    for key, entries in axes.items():
        override = entries[0][1]
        if "." not in key and _plain(override) and override.key_or_group == key:
            picked[key] = [line.partition("=")[2] for line, _ in entries]
    jobs: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for combination in itertools.product(*axes.values()):
        choices = {o.key_or_group: line.partition("=")[2] for line, o in combination if o.key_or_group in picked}
        job = [line for line, override in combination if not _foreign(override, choices, picked, option_keys)]
        if tuple(job) not in seen:
            seen.add(tuple(job))
            jobs.append(job)
    return jobs


def _plain(override: Any) -> bool:
    """An override without a ``+``, ``++`` or ``~`` prefix."""
    return override.type.name == "CHANGE"


def _foreign(override: Any, choices: dict[str, str], picked: dict[str, list[str]], option_keys: OptionKeys) -> bool:
    """Whether ``override`` sets a key of the job's group option that only other picked options have."""
    group, dot, leaf = override.key_or_group.partition(".")
    if not dot or group not in choices or not _plain(override) or override.package:
        return False
    leaf = leaf.partition(".")[0]
    mine = option_keys(group, choices[group])
    if mine is None or leaf in mine:
        return False
    others = (option_keys(group, option) for option in dict.fromkeys(picked[group]) if option != choices[group])
    return any(keys is not None and leaf in keys for keys in others)


def repository_option_keys(repository: Any) -> OptionKeys:
    """:data:`OptionKeys` read through Hydra's config repository (every folder on the config search
    path, plugins' included); an option with its own defaults list is not read (None)."""
    cache: dict[tuple[str, str], frozenset[str] | None] = {}

    def option_keys(group: str, option: str) -> frozenset[str] | None:
        if (group, option) not in cache:
            keys = None
            try:
                result = repository.load_config(f"{group}/{option}")
            except Exception:  # noqa: BLE001 - an unreadable option: Hydra's composition says why
                result = None
            if result is not None and not result.is_schema_source:
                content = result.config
                if "defaults" not in content:
                    keys = frozenset(str(k) for k in content.keys())
            cache[group, option] = keys
        return cache[group, option]

    return option_keys


def config_option_keys(config: Any) -> OptionKeys:
    """:data:`OptionKeys` for a composed config, through the search path it was composed from
    (``hydra.runtime.config_sources``): what a callback that has only the config can use."""
    from hydra._internal.config_repository import ConfigRepository
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl

    search_path = ConfigSearchPathImpl()
    for source in config.hydra.runtime.config_sources:
        search_path.append(str(source.provider), f"{source.schema}://{source.path}")
    return repository_option_keys(ConfigRepository(config_search_path=search_path))
