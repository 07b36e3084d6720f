"""Resolved configs as compared: flattened to dotted keys, less the keys that cannot change a number."""

from __future__ import annotations

import json
from typing import Any

#: config keys (and everything under them) that change only the display, where files go or the
#: logging: two runs differing only in these computed the same numbers
IGNORED_KEYS = ("progress", "check_memory", "output", "wandb", "hydra")


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: configs compared key by key."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def is_ignored(key: str, ignored: tuple[str, ...] = IGNORED_KEYS) -> bool:
    return any(key == prefix or key.startswith(f"{prefix}.") for prefix in ignored)


def comparable(config: dict[str, Any], ignored: tuple[str, ...] = IGNORED_KEYS) -> dict[str, Any]:
    """The flattened config without the ignored keys, values as ``config.json`` spells them."""
    flat = flatten(json.loads(json.dumps(config, default=str)))
    return {k: v for k, v in flat.items() if not is_ignored(k, ignored)}


def config_differences(a: dict[str, Any], b: dict[str, Any], ignored: tuple[str, ...] = IGNORED_KEYS) -> list[str]:
    """``key: a -> b`` for every comparable key that differs (absent on one side: ``-``)."""
    fa, fb = comparable(a, ignored), comparable(b, ignored)
    return [
        f"{k}: {fa.get(k, '-')} -> {fb.get(k, '-')}"
        for k in sorted(set(fa) | set(fb))
        if fa.get(k, "-") != fb.get(k, "-")
    ]
