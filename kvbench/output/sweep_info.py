"""What a sweep varied, read back from its folder: the keys swept and each job's value of them.

Hydra writes the command's overrides, sweeps unexpanded, to ``<sweep>/multirun.yaml``
(``hydra.overrides.task``) and each job's own overrides to ``<job>/.hydra/overrides.yaml``. Both are
parsed with Hydra's own override parser, so ``allocator=naive,paged``, ``range(8,64,8)``,
``choice(...)`` and quoted list values mean what they mean to Hydra. Tables, labels and W&B run
names are built from these.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

#: the comparison frame's column holding a swept key's value for each job (``swept.allocator``)
SWEPT_PREFIX = "swept."


def _parse(lines: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides([str(line) for line in lines])


def _load_list(path: Path, key: str | None = None) -> list[str]:
    try:
        node = OmegaConf.load(path)
        if key is not None:
            node = OmegaConf.select(node, key, default=None)
        return [str(item) for item in node] if node is not None else []
    except (OSError, ValueError, OmegaConfBaseException):
        return []


def swept_keys(sweep_dir: Path) -> list[str]:
    """The keys (or config groups) a multirun swept, in command-line order; [] for a single run or
    a folder without Hydra's ``multirun.yaml``."""
    lines = _load_list(Path(sweep_dir) / "multirun.yaml", "hydra.overrides.task")
    try:
        return [o.key_or_group for o in _parse(lines) if o.is_sweep_override()]
    except Exception:  # noqa: BLE001 - an unparsable record only loses the labels, never the run
        return []


def job_overrides(job_dir: Path) -> dict[str, str]:
    """A job's own overrides (``key -> value`` as typed), from ``.hydra/overrides.yaml``."""
    lines = _load_list(Path(job_dir) / ".hydra" / "overrides.yaml")
    try:
        return {o.key_or_group: o.get_value_element_as_str() for o in _parse(lines) if o.value_type is not None}
    except Exception:  # noqa: BLE001
        return {}


def swept_values(job_dir: Path, keys: list[str]) -> dict[str, str]:
    """A job's value of each swept key (``keys`` from :func:`swept_keys` of its sweep folder)."""
    own = job_overrides(job_dir)
    return {key: own.get(key, "") for key in keys}
