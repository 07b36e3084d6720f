"""The one exception type that means "the user asked for something invalid", and its one-line check."""

from __future__ import annotations

import unicodedata
from typing import Any

#: Unicode categories a terminal shows as nothing or acts on: controls (TAB, ESC, CR), format
#: characters (a byte-order mark, zero-width spaces), surrogates, private and unassigned code
#: points, line and paragraph separators
_INVISIBLE = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))


class ConfigError(ValueError):
    """Bad input: a config value, a plugin name, a trace row.

    The message is one line that names the key, the value and what is allowed; the CLI prints it
    without a traceback and exits non-zero.
    """


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise a one-line ConfigError naming ``key``, ``value`` and what is allowed unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: {allowed}")


def visible(text: str, limit: int | None = None) -> str:
    """``text`` as a terminal shows it faithfully on one line: every control or invisible
    character (TAB, ESC, a newline, a byte-order mark, a zero-width space, a non-ASCII space) is
    written as its escape (``\\t``, ``\\x1b``, ``\\ufeff``), so a user sees what is really there and
    an ESC sequence in an argument cannot drive the terminal. Cut to ``limit`` characters when given."""
    cut = text if limit is None or len(text) <= limit else text[:limit]
    out = []
    for ch in cut:
        invisible = unicodedata.category(ch) in _INVISIBLE or (ch.isspace() and ch != " ")
        out.append(ch.encode("unicode_escape").decode("ascii") if invisible else ch)
    return "".join(out) + ("..." if cut is not text else "")


def clip(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters (``...`` marks a cut): for a value quoted with ``!r``,
    whose repr already escapes every non-printable character."""
    return text if len(text) <= limit else text[:limit] + "..."


def invisible_characters(text: str) -> list[str]:
    """The escapes of the invisible characters ``text`` holds, each once, in order of appearance
    (``["\\ufeff"]`` for a header that starts with a byte-order mark)."""
    found: list[str] = []
    for ch in text:
        if unicodedata.category(ch) in _INVISIBLE or (ch.isspace() and ch != " "):
            escape = ch.encode("unicode_escape").decode("ascii")
            if escape not in found:
                found.append(escape)
    return found


def error_line(prog: str, message: object) -> str:
    """``<prog>: error: <message>`` on exactly one visible line (what every command prints)."""
    return f"{prog}: error: {visible(str(message))}"
