"""The one exception type that means "the user asked for something invalid", and its one-line check."""

from __future__ import annotations

import re
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


def is_invisible(ch: str) -> bool:
    """Whether a terminal shows ``ch`` as nothing (or acts on it): the one rule the helpers below share."""
    return unicodedata.category(ch) in _INVISIBLE or (ch.isspace() and ch != " ")


def _escape(ch: str) -> str:
    return ch.encode("unicode_escape").decode("ascii")


def visible(text: str, limit: int | None = None) -> str:
    """``text`` as a terminal shows it faithfully on one line: every control or invisible
    character (TAB, ESC, a newline, a byte-order mark, a zero-width space, a non-ASCII space) is
    written as its escape (``\\t``, ``\\x1b``, ``\\ufeff``), so a user sees what is really there and
    an ESC sequence in an argument cannot drive the terminal. Cut to ``limit`` characters when given."""
    cut = text if limit is None or len(text) <= limit else text[:limit]
    return "".join(_escape(ch) if is_invisible(ch) else ch for ch in cut) + ("..." if cut is not text else "")


def clip(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters (``...`` marks a cut): for a value quoted with ``!r``,
    whose repr already escapes every non-printable character."""
    return text if len(text) <= limit else text[:limit] + "..."


def invisible_characters(text: str) -> list[str]:
    """The escapes of the invisible characters ``text`` holds, each once, in order of appearance
    (``["\\ufeff"]`` for a header that starts with a byte-order mark)."""
    return list(dict.fromkeys(_escape(ch) for ch in text if is_invisible(ch)))


#: the most characters of one word (a run without a space) an error line echoes: a value pasted by
#: mistake (100,000 characters of ``--model``) is cut, its length said, the advice after it kept
ECHO_CHARS = 200
_LONG_WORD = re.compile(r"\S{%d,}" % (ECHO_CHARS + 1))
_QUOTES = "'\"`"


def shorten_long_words(text: str) -> str:
    """``text`` with every word over :data:`ECHO_CHARS` cut to that many, followed by ``...`` and
    its length, quotes around it not counted (``'xxxx... (100,000 characters)``)."""

    def cut(match: re.Match) -> str:
        word = match.group()
        return f"{word[:ECHO_CHARS]}... ({len(word.strip(_QUOTES)):,} characters)"

    return _LONG_WORD.sub(cut, text)


def error_line(prog: str, message: object) -> str:
    """``<prog>: error: <message>`` on exactly one visible line (what every command prints), every
    over-long value in it cut the same way (:func:`shorten_long_words`)."""
    return f"{prog}: error: {visible(shorten_long_words(str(message)))}"
