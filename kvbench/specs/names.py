"""Names that become folder names, result rows and W&B run names: one safe alphabet for all."""

from __future__ import annotations

import re

from kvbench.errors import require

#: letters, digits, '.', '_' and '-', starting with a letter or digit: a path component on every OS
#: (no '/', no leading '.' or '-'), a CSV cell and a W&B run name without quoting
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NAME_CHARS = 64


def require_name(key: str, value: object) -> None:
    """Raise a one-line ConfigError unless ``value`` is a safe name (see NAME_PATTERN)."""
    ok = (
        isinstance(value, str)
        and len(value) <= MAX_NAME_CHARS
        and NAME_PATTERN.fullmatch(value) is not None
        and ".." not in value  # with the pattern, '..' could still climb out of a folder
    )
    require(
        ok,
        key,
        value,
        f"use 1 to {MAX_NAME_CHARS} letters, digits, '.', '_' or '-', starting with a letter "
        "or digit and without '..' (it names folders and result rows)",
    )
