"""Reading the files users hand kvbench (traces, request CSVs, calibrations, results read back):
every failure is one ConfigError line, never a traceback.

Text is read as UTF-8 with an optional byte-order mark (``utf-8-sig``): Excel's "CSV UTF-8" and
many Windows editors write one, and left in place it hides a CSV's first column name. JSON is
parsed with its nesting caught: Python's parser recurses, and a 100,000-deep array would end in a
RecursionError instead of a message: that is caught and said in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from kvbench.errors import ConfigError, visible

#: the encoding of every text file kvbench reads: UTF-8, a leading byte-order mark dropped
ENCODING = "utf-8-sig"


def os_reason(exc: OSError) -> str:
    """``Permission denied``, ``Is a directory``: the OS's words for why a file cannot be used."""
    return exc.strerror or type(exc).__name__


def open_text(path: Path, what: str, *, newline: str | None = None) -> IO[str]:
    """``path`` opened for reading text (``newline=""`` for the csv module); ``what`` names the file
    in the message (``"workload.path"``, ``"calibration file"``)."""
    try:
        return open(path, encoding=ENCODING, newline=newline)  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise ConfigError(f"{what} {visible(str(path))} cannot be read: {os_reason(exc)}") from None


def read_text(path: Path, what: str) -> str:
    """The whole file as text."""
    with open_text(path, what) as handle:
        try:
            return handle.read()
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{what} {visible(str(path))} is not UTF-8 text (byte {exc.start}): save it as UTF-8"
            ) from None
        except OSError as exc:
            raise ConfigError(f"{what} {visible(str(path))} cannot be read: {os_reason(exc)}") from None


def parse_json(text: str, where: str) -> Any:
    """JSON ``text`` parsed; ``where`` (a path, ``path:line``) names it in the message."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:  # the C parser recurses per level and stops near Python's recursion limit
        raise ConfigError(
            f"{where}: JSON nested too deeply (about a thousand levels); not a file kvbench reads"
        ) from None


def read_json(path: Path, what: str) -> Any:
    """A JSON file, parsed."""
    return parse_json(read_text(path, what), f"{what} {visible(str(path))}")


def read_json_object(path: Path, what: str) -> dict:
    """A JSON file that must hold an object."""
    data = read_json(path, what)
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {visible(str(path))} holds a JSON {type(data).__name__}, not an object")
    return data


def count_lines(path: Path, what: str) -> int:
    """The lines of a file that are not blank, counted in binary chunks without parsing (a 200 MB
    trace in a fraction of a second): what a file source will read, known before reading it."""
    count, chunk_bytes = 0, 1 << 20
    try:
        with open(path, "rb") as handle:
            pending = b""
            while chunk := handle.read(chunk_bytes):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                count += sum(1 for line in lines if line.strip())
            count += 1 if pending.strip() else 0
    except OSError as exc:
        raise ConfigError(f"{what} {visible(str(path))} cannot be read: {os_reason(exc)}") from None
    return count
