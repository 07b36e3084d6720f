"""Readers for the trace formats the ``trace`` workload replays, each giving one :class:`TraceRows`.

Every reader reads the rows ``[skip, skip + limit)`` of its file (all after ``skip`` when ``limit``
is None), checks every row it reads, and reports a bad one as ``path:line:column`` (a CSV column's
number and name, or a JSON key) with what was expected. Arrivals stay in the file's own ticks
(integer nanoseconds, milliseconds) so that rebasing them to the first replayed request is exact.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from kvbench_plugins.workloads.request_csv import (
    INT64_MAX,
    MAX_REQUEST_TOKENS,
    check_header_characters,
    check_window,
    parse_cell,
    read_requests,
)

from kvbench.errors import ConfigError, clip, visible
from kvbench.io.textio import open_text

#: Mooncake's hash_ids each cover this many prompt tokens (FAST'25 release README)
MOONCAKE_HASH_BLOCK_TOKENS = 512
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
# [0-9], not \d: \d also matches Arabic-Indic and other scripts' digits
_AZURE_TIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?")
_AZURE_FORMAT = "YYYY-MM-DD HH:MM:SS.fffffff"


@dataclass(frozen=True)
class TraceRows:
    """The replayed rows as columns; optional columns are None when the format lacks them."""

    prompt_tokens: np.ndarray  #: int64
    output_tokens: np.ndarray  #: int64
    lines: np.ndarray  #: each row's line in the file, for error messages
    #: arrival times in ticks of 1 / ticks_per_s seconds, sorted; None: the file has no arrivals
    arrival_ticks: np.ndarray | None = None
    ticks_per_s: float = 1.0
    s_max_tokens: np.ndarray | None = None  #: int64, the file's own declared S_max
    prefix_hashes: list[tuple[int, ...]] | None = None
    hash_block_tokens: int = 0


def read_request_csv(path: Path, skip: int, limit: int | None, *, sorted_arrivals: bool) -> TraceRows:
    """A request CSV (``request_csv``'s columns), arrivals in seconds."""
    table = read_requests(path, limit, sorted_arrivals=sorted_arrivals, skip=skip)
    return TraceRows(table.prompt_tokens, table.output_tokens, table.lines, table.arrival_s, 1.0, table.s_max_tokens)


def read_lengths(path: Path, skip: int, limit: int | None) -> TraceRows:
    """A length-only CSV: prompt and output columns (``num_prefill_tokens``/``num_decode_tokens`` or
    kvbench's names); any other column, an arrival or S_max one included, is ignored."""
    table = read_requests(path, limit, sorted_arrivals=False, skip=skip, fields=("prompt_tokens", "output_tokens"))
    return TraceRows(table.prompt_tokens, table.output_tokens, table.lines)


def _after_skip(
    skip: int, prompt: list[int], output: list[int], lines: list[int], arrival: np.ndarray, ticks_per_s: float, **rest
) -> TraceRows:
    """The rows a reader parsed, less the first ``skip``, as int64 columns (``arrival`` comes cut
    already: the reader checked it sorted); ``rest``: the format's optional columns."""
    return TraceRows(
        np.array(prompt[skip:], dtype=np.int64),
        np.array(output[skip:], dtype=np.int64),
        np.array(lines[skip:], dtype=np.int64),
        arrival,
        ticks_per_s,
        **rest,
    )


def read_azure(path: Path, skip: int, limit: int | None) -> TraceRows:
    """The Azure LLM inference trace 2023: ``TIMESTAMP`` (``YYYY-MM-DD HH:MM:SS.fffffff``),
    ``ContextTokens``, ``GeneratedTokens``; arrivals in integer nanoseconds after the first row read."""
    _require_file(path)
    prompt, output, ticks, lines = [], [], [], []
    with open_text(path, "workload.path", newline="") as handle:
        reader = csv.reader(handle)
        try:
            header = [name.strip() for name in next(reader, None) or []]
            if not header:
                raise ConfigError(
                    f"{path}: the file is empty; an Azure trace starts with the header {','.join(AZURE_COLUMNS)}"
                )
            check_header_characters(path, header, AZURE_COLUMNS)
            missing = [name for name in AZURE_COLUMNS if name not in header]
            if missing:
                raise ConfigError(
                    f"{path}:1: no {missing[0]} column; an Azure trace has the columns "
                    f"{', '.join(AZURE_COLUMNS)} (the header has: {visible(', '.join(header), limit=200)})"
                )
            at = [header.index(name) for name in AZURE_COLUMNS]
            first_ns = None
            for row in reader:
                if not row:  # a blank line holds no request
                    continue
                if limit is not None and len(lines) == skip + limit:
                    break
                line = reader.line_num
                ns = _azure_ns(path, line, row, at[0])
                first_ns = ns if first_ns is None else first_ns
                ticks.append(ns - first_ns)  # small: Python ints would overflow int64 as absolute ns
                prompt.append(parse_cell(path, line, row, at[1], AZURE_COLUMNS[1], "prompt_tokens"))
                output.append(parse_cell(path, line, row, at[2], AZURE_COLUMNS[2], "output_tokens"))
                lines.append(line)
        except (UnicodeDecodeError, csv.Error) as exc:
            raise ConfigError(
                f"{path}: near line {reader.line_num + 1}, not readable as UTF-8 CSV ({exc}); save it as CSV text"
            ) from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    _check_rows(path, len(lines), skip, limit)
    arrival = np.array(ticks[skip:], dtype=np.int64)
    _check_sorted(path, arrival, lines[skip:], f"{at[0] + 1}: {AZURE_COLUMNS[0]}", "TIMESTAMP")
    return _after_skip(skip, prompt, output, lines, arrival, 1e9)


def _azure_ns(path: Path, line: int, row: list[str], index: int) -> int:
    """A TIMESTAMP cell as integer nanoseconds since 0001-01-01 (exact: no float on the way)."""
    where = f"{path}:{line}:{index + 1}"
    if index >= len(row):
        raise ConfigError(f"{where}: the row has {len(row)} fields, no TIMESTAMP value; give every row every column")
    text = row[index].strip()
    match = _AZURE_TIME.fullmatch(text)
    try:
        if match is None:
            raise ValueError
        year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
        date = datetime.datetime(year, month, day, hour, minute, second)  # checks the calendar
    except ValueError:
        raise ConfigError(
            f"{where}: TIMESTAMP={clip(text, 40)!r} is not a time as {_AZURE_FORMAT}; fix the row"
        ) from None
    fraction_ns = int((match.group(7) or "").ljust(9, "0"))
    seconds = date.toordinal() * 86_400 + hour * 3_600 + minute * 60 + second
    return seconds * 1_000_000_000 + fraction_ns


def read_mooncake(path: Path, skip: int, limit: int | None) -> TraceRows:
    """A Mooncake FAST'25 JSONL trace: one object per line with ``timestamp`` (ms), ``input_length``,
    ``output_length`` and ``hash_ids`` (one id per 512 prompt tokens, the last block partial)."""
    _require_file(path)
    prompt, output, ticks, hashes, lines = [], [], [], [], []
    with open_text(path, "workload.path") as handle:
        try:
            for line, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                if limit is not None and len(lines) == skip + limit:
                    break
                record = _json_object(path, line, text)
                ticks.append(_number(path, line, record, "timestamp"))
                prompt.append(_tokens(path, line, record, "input_length"))
                output.append(_tokens(path, line, record, "output_length"))
                hashes.append(_hash_ids(path, line, record, prompt[-1]))
                lines.append(line)
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not readable as UTF-8 text ({exc}); save it as JSON lines") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    _check_rows(path, len(lines), skip, limit)
    is_int = all(isinstance(t, int) for t in ticks[skip:])
    arrival = np.array(ticks[skip:], dtype=np.int64 if is_int else np.float64)
    _check_sorted(path, arrival, lines[skip:], " timestamp", "timestamp")
    return _after_skip(
        skip,
        prompt,
        output,
        lines,
        arrival,
        1e3,
        prefix_hashes=hashes[skip:],
        hash_block_tokens=MOONCAKE_HASH_BLOCK_TOKENS,
    )


def _json_object(path: Path, line: int, text: str) -> dict:
    try:
        record = json.loads(text.rstrip("\r\n"))  # without the newline, colno is the line's column
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}:{line}:{exc.colno}: not valid JSON ({exc.msg}); each line must be one object with "
            f"the keys {', '.join(MOONCAKE_KEYS)}"
        ) from None
    except RecursionError:  # a line of thousands of nested brackets
        raise ConfigError(
            f"{path}:{line}: JSON nested too deeply; each line must be one flat object with "
            f"the keys {', '.join(MOONCAKE_KEYS)}"
        ) from None
    if not isinstance(record, dict):
        raise ConfigError(
            f"{path}:{line}: a JSON {type(record).__name__}, not an object; each line must be one object "
            f"with the keys {', '.join(MOONCAKE_KEYS)}"
        )
    missing = [key for key in MOONCAKE_KEYS if key not in record]
    if missing:
        raise ConfigError(
            f"{path}:{line}: no {missing[0]} key; each line must have the keys {', '.join(MOONCAKE_KEYS)}"
        )
    return record


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(path: Path, line: int, record: dict, key: str) -> int | float:
    value = record[key]
    ok = (_is_int(value) and 0 <= value <= INT64_MAX) or (
        isinstance(value, float) and math.isfinite(value) and value >= 0
    )
    if not ok:
        raise ConfigError(
            f"{path}:{line}: {key}={clip(repr(value), 40)} is not a time in milliseconds >= 0; fix the line"
        )
    return value


def _tokens(path: Path, line: int, record: dict, key: str) -> int:
    value = record[key]
    if not (_is_int(value) and 1 <= value <= MAX_REQUEST_TOKENS):
        raise ConfigError(
            f"{path}:{line}: {key}={clip(repr(value), 40)} is not a whole number of tokens in "
            f"[1, {MAX_REQUEST_TOKENS}]; fix the line"
        )
    return value


def _hash_ids(path: Path, line: int, record: dict, prompt_tokens: int) -> tuple[int, ...]:
    value = record["hash_ids"]
    expected = -(-prompt_tokens // MOONCAKE_HASH_BLOCK_TOKENS)
    if not (isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value)):
        raise ConfigError(
            f"{path}:{line}: hash_ids={str(value)[:40]!r} is not a list of integer ids >= 0; fix the line"
        )
    if len(value) != expected:
        raise ConfigError(
            f"{path}:{line}: hash_ids has {len(value)} ids, expected {expected}, one per "
            f"{MOONCAKE_HASH_BLOCK_TOKENS} tokens of input_length={prompt_tokens}; fix the line"
        )
    return tuple(value)


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise ConfigError(f"workload.path={clip(str(path))!r}: no such file; give the path to a trace file")


def _check_rows(path: Path, num_rows: int, skip: int, limit: int | None) -> None:
    if not num_rows:
        raise ConfigError(f"{path}: the trace holds no requests; add one row per request")
    check_window(path, num_rows, skip, limit)


def _check_sorted(path: Path, ticks: np.ndarray, lines: list[int], column: str, name: str) -> None:
    """Refuse the first row that arrives before the row above it (kvbench never reorders a trace)."""
    earlier = np.flatnonzero(np.diff(ticks) < 0)
    if len(earlier):
        row = int(earlier[0]) + 1
        raise ConfigError(
            f"{path}:{lines[row]}:{column} is earlier than the row above it (line {lines[row - 1]}): "
            f"sort the file by {name}"
        )
