"""The one exception type that means "the user asked for something invalid", and its one-line check."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """Bad input: a config value, a plugin name, a trace row.

    The message is one line that names the key, the value and what is allowed; the CLI prints it
    without a traceback and exits non-zero.
    """


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise a one-line ConfigError naming ``key``, ``value`` and what is allowed unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: {allowed}")
