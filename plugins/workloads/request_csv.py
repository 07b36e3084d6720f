"""The ``request_csv`` workload source: replay a list of requests read from a CSV file.

Columns (a header row names them; other columns are ignored), under kvbench's names or Vidur's:

- arrival in seconds from the start of the run: ``arrival_s`` or ``arrived_at`` (optional);
- prompt tokens: ``prompt_tokens`` or ``num_prefill_tokens``;
- output tokens: ``output_tokens`` or ``num_decode_tokens``;
- the request's declared S_max in tokens: ``s_max_tokens`` (optional);
- the request's priority, a whole number, lower first under ``scheduler.queue=priority``:
  ``priority`` (optional; 0 for every request without it).

Arrivals. ``arrival: file`` (the default) takes the file's arrival column, which must be sorted
(kvbench does not reorder a trace behind the user's back); a file without one is an offline batch:
every request arrives at t = 0. ``all_at_once`` and ``poisson`` ignore the file's arrivals and use
the shared arrival processes of :mod:`kvbench.workload.arrivals` (a length file replayed at a rate).

Declared S_max. A file's ``s_max_tokens`` column is the requests' own declaration and is used as
given. Without one, ``s_max_policy`` decides: ``fixed`` declares ``s_max_tokens`` for every request
(4,096 by default: Llama-2-7B's positions, what Vidur clips requests to), ``request`` declares
exactly prompt + output (a perfect length oracle). A request longer than its S_max is an error,
never clipped: a replayed trace must be replayed as written.

The file is read once, when the source is built, so that a bad row stops the run before it
simulates; every bad value is reported as ``path:line:column`` with the column's name.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import MISSING

from kvbench import hookimpl
from kvbench.errors import ConfigError, clip, invisible_characters, is_invisible, require, visible
from kvbench.io.textio import count_lines, open_text
from kvbench.workload.arrivals import MAX_ARRIVAL_S, arrival_times_s, validate_arrivals
from kvbench.workload.source import Workload, WorkloadSource, read_only

_KEY = "workload"
#: field -> the column names that may hold it, kvbench's first, then Vidur's request-trace names
COLUMNS = {
    "arrival_s": ("arrival_s", "arrived_at"),
    "prompt_tokens": ("prompt_tokens", "num_prefill_tokens"),
    "output_tokens": ("output_tokens", "num_decode_tokens"),
    "s_max_tokens": ("s_max_tokens",),
    "priority": ("priority",),
}
OPTIONAL = ("arrival_s", "s_max_tokens", "priority")
#: a priority fits int32, either sign (vLLM's is a Python int; kvbench's columns are int64)
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
ARRIVALS = ("file", "all_at_once", "poisson")
S_MAX_POLICIES = ("fixed", "request")
INT64_MAX = int(np.iinfo(np.int64).max)
#: the most tokens one request's prompt or output may have: far above any model's context (2**24
#: positions is kvbench's cap), and small enough that no sum of a trace's token columns can wrap
#: the int64 they are held in (a wrapped prompt + output would read as short and pass too_long=drop)
MAX_REQUEST_TOKENS = 2**31 - 1
#: what a token count or a time may look like: ASCII digits only. Python's int() and float() also
#: take "1_000", "+5", " 5", "inf" and Arabic-Indic or full-width digits, none of which a trace
#: writer means as a plain number
_INTEGER = re.compile(r"[0-9]+")
_SIGNED_INTEGER = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


@dataclass
class RequestCsvConfig:
    """Options of the ``request_csv`` workload (the ``workload`` config group)."""

    #: the CSV file of requests (relative paths are taken from the directory kvbench runs in)
    path: str = MISSING
    #: replay only the first num_requests rows; null: every row
    num_requests: int | None = None
    #: file: the file's arrival column (t = 0 for all when it has none); all_at_once or poisson:
    #: ignore the file's arrivals
    arrival: str = "file"
    #: mean request rate in requests/s; required (> 0) for poisson, ignored otherwise
    rate_per_s: float | None = None
    #: without an s_max_tokens column: fixed (every request declares s_max_tokens) or request
    #: (every request declares exactly its prompt + output)
    s_max_policy: str = "fixed"
    #: the declared S_max of every request under s_max_policy=fixed
    s_max_tokens: int = 4096

    def validate(self) -> None:
        """Raise a one-line ConfigError for the first invalid option (the file is checked when read)."""
        require(bool(self.path) and self.path != MISSING, f"{_KEY}.path", self.path, "give the path to a request CSV")
        ok = self.num_requests is None or self.num_requests >= 1
        require(ok, f"{_KEY}.num_requests", self.num_requests, "use null (every row) or an integer >= 1")
        require(self.arrival in ARRIVALS, f"{_KEY}.arrival", self.arrival, f"choose one of {', '.join(ARRIVALS)}")
        if self.arrival != "file":
            validate_arrivals(self.arrival, self.rate_per_s, _KEY)
        allowed = f"choose one of {', '.join(S_MAX_POLICIES)}"
        require(self.s_max_policy in S_MAX_POLICIES, f"{_KEY}.s_max_policy", self.s_max_policy, allowed)
        require(self.s_max_tokens >= 2, f"{_KEY}.s_max_tokens", self.s_max_tokens, "use an integer >= 2")


@dataclass(frozen=True)
class RequestTable:
    """The file's rows as columns; ``arrival_s`` and ``s_max_tokens`` are None when it lacks them."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: np.ndarray | None
    s_max_tokens: np.ndarray | None
    lines: np.ndarray  #: each row's line in the file, for error messages
    priority: np.ndarray | None = None


def read_requests(
    path: Path,
    limit: int | None = None,
    *,
    sorted_arrivals: bool = True,
    skip: int = 0,
    fields: tuple[str, ...] = tuple(COLUMNS),
) -> RequestTable:
    """Read and check the request CSV at ``path``: ``limit`` rows (all when None) after the first
    ``skip``; the arrival column must be sorted when ``sorted_arrivals`` (a source that replaces the
    arrivals does not care). Only ``fields`` are read (a length file's other columns are ignored)."""
    if not path.is_file():
        raise ConfigError(f"{_KEY}.path={clip(str(path))!r}: no such file; give the path to a request CSV")
    with open_text(path, f"{_KEY}.path", newline="") as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
            if not header:
                raise ConfigError(
                    f"{path}: the file is empty; it needs a header row naming its columns and one row per request"
                )
            where = _locate_columns(path, [name.strip() for name in header], fields)
            values: dict[str, list] = {field: [] for field in where}
            lines: list[int] = []
            for row in reader:
                if not row:  # a blank line (often the last one) holds no request
                    continue
                if limit is not None and len(lines) == skip + limit:
                    break
                lines.append(reader.line_num)
                for field, (index, name) in where.items():
                    values[field].append(parse_cell(path, reader.line_num, row, index, name, field))
        except (UnicodeDecodeError, csv.Error) as exc:  # not text, or broken quoting: not a CSV we can read
            raise ConfigError(
                f"{path}: near line {reader.line_num + 1}, not readable as UTF-8 CSV ({exc}); save it as CSV text"
            ) from None
        except OSError as exc:  # a read error part-way (a disk, a network mount)
            raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not lines:
        raise ConfigError(f"{path}: the file has a header but no requests; add one row per request")
    check_window(path, len(lines), skip, limit)
    # the skipped rows were checked like the others: a bad row above the window is still a bad file
    values = {field: column[skip:] for field, column in values.items()}
    lines = lines[skip:]
    arrival_s = np.array(values["arrival_s"], dtype=np.float64) if "arrival_s" in values else None
    if arrival_s is not None and sorted_arrivals:
        _check_sorted(path, arrival_s, lines, where["arrival_s"])
    s_max = np.array(values["s_max_tokens"], dtype=np.int64) if "s_max_tokens" in values else None
    priority = np.array(values["priority"], dtype=np.int64) if "priority" in values else None
    return RequestTable(
        np.array(values["prompt_tokens"], dtype=np.int64),
        np.array(values["output_tokens"], dtype=np.int64),
        arrival_s,
        s_max,
        np.array(lines, dtype=np.int64),
        priority,
    )


def check_window(path: Path, num_rows: int, skip: int, limit: int | None) -> None:
    """Refuse a start offset or a request limit the ``num_rows`` rows read cannot satisfy."""
    if skip >= num_rows:
        raise ConfigError(f"{_KEY}.start_offset={skip} skips every one of the {num_rows} requests in {path}; lower it")
    if limit is not None and num_rows - skip < limit:
        after = f" after start_offset={skip}" if skip else ""
        raise ConfigError(
            f"{_KEY}.num_requests={limit} is more than the {num_rows - skip} requests{after} in {path}; "
            "lower it or use null for every row"
        )


def check_header_characters(path: Path, header: list[str], known: tuple[str, ...]) -> None:
    """Refuse a header cell that is a known column name but for invisible characters (a zero-width
    space, a second byte-order mark, a TAB): read as it is, that column would be missing, and an
    optional one (the arrivals) missing is a silently different replay."""
    for number, name in enumerate(header, start=1):
        hidden = invisible_characters(name)
        cleaned = "".join(ch for ch in name if not is_invisible(ch)).strip()
        if hidden and cleaned in known:
            raise ConfigError(
                f"{path}:1:{number}: the header cell {name!r} is the column {cleaned!r} with "
                f"invisible characters ({', '.join(hidden)}) in it; remove them"
            )


def _locate_columns(path: Path, header: list[str], fields: tuple[str, ...]) -> dict[str, tuple[int, str]]:
    """field -> (index, column name) for each of ``fields`` the header holds; a required one missing is an error."""
    check_header_characters(path, header, tuple(name for names in COLUMNS.values() for name in names))
    where = {}
    for field in fields:
        names = COLUMNS[field]
        present = [name for name in names if name in header]
        if len(present) > 1:
            raise ConfigError(f"{path}: columns {' and '.join(present)} both give {field}; keep one of them")
        if present:
            where[field] = (header.index(present[0]), present[0])
        elif field not in OPTIONAL:
            raise ConfigError(
                f"{path}: no {field} column; name one {' or '.join(names)} "
                f"(the header has: {visible(', '.join(header), limit=200)})"
            )
    return where


def parse_tokens(text: str) -> int | None:
    """A token count written in plain ASCII digits, within [1, MAX_REQUEST_TOKENS]; None otherwise."""
    if not _INTEGER.fullmatch(text) or len(text) > 12:
        return None
    count = int(text)
    return count if 1 <= count <= MAX_REQUEST_TOKENS else None


def parse_cell(path: Path, line: int, row: list[str], index: int, name: str, field: str) -> float | int:
    """One checked value: arrival a plain decimal number of seconds in [0, MAX_ARRIVAL_S], token
    counts plain integers in [1, MAX_REQUEST_TOKENS]."""
    where = f"{path}:{line}:{index + 1}"
    if index >= len(row):
        raise ConfigError(f"{where}: the row has {len(row)} fields, no {name} value; give every row every column")
    text = row[index].strip()
    shown = clip(text, 40)
    if field == "arrival_s":
        value = float(text) if _DECIMAL.fullmatch(text) else math.nan
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(
                f"{where}: {name}={shown!r} is not a time in seconds >= 0 (plain digits, e.g. 12.5); fix the row"
            )
        if value > MAX_ARRIVAL_S:
            raise ConfigError(
                f"{where}: {name}={shown!r} is beyond {MAX_ARRIVAL_S:.0e} s (about 32 years) from the start "
                "of the run; times are seconds from the first request: rebase them"
            )
        return value
    if field == "priority":
        low, high = PRIORITY_RANGE
        if not (_SIGNED_INTEGER.fullmatch(text) and len(text) <= 12 and low <= int(text) <= high):
            raise ConfigError(
                f"{where}: {name}={shown!r} is not a whole number in [{low}, {high}] written in plain "
                "digits (lower runs first); fix the row"
            )
        return int(text)
    count = parse_tokens(text)
    if count is None:
        raise ConfigError(
            f"{where}: {name}={shown!r} is not a whole number of tokens in [1, {MAX_REQUEST_TOKENS}] "
            "written in plain digits; fix the row"
        )
    return count


def _check_sorted(path: Path, arrival_s: np.ndarray, lines: list[int], column: tuple[int, str]) -> None:
    earlier = np.flatnonzero(np.diff(arrival_s) < 0)
    if len(earlier):
        row, (index, name) = int(earlier[0]) + 1, column
        raise ConfigError(
            f"{path}:{lines[row]}:{index + 1}: {name}={float(arrival_s[row])!r} is earlier than the row "
            f"above it ({float(arrival_s[row - 1])!r}): sort the file by {name}"
        )


class RequestCsvWorkload(WorkloadSource):
    """Requests replayed from a CSV file (see the module docstring for its columns)."""

    name = "request_csv"
    Config = RequestCsvConfig
    replays_a_file = True

    @classmethod
    def planned_requests(cls, config: RequestCsvConfig) -> int | None:
        """The file's rows (less the header), at most num_requests; counted without parsing."""
        path = Path(config.path)
        if not path.is_file():
            return config.num_requests  # the source says what is wrong when it is built
        rows = max(0, count_lines(path, f"{_KEY}.path") - 1)
        return rows if config.num_requests is None else min(rows, config.num_requests)

    def __init__(self, config: RequestCsvConfig) -> None:
        config.validate()
        super().__init__(config)
        self.path = Path(config.path)
        self.table = read_requests(self.path, config.num_requests, sorted_arrivals=config.arrival == "file")
        self.s_max_tokens = self._declared_s_max()

    def _declared_s_max(self) -> np.ndarray:
        table, cfg = self.table, self.config
        total = table.prompt_tokens + table.output_tokens
        if table.s_max_tokens is not None:
            s_max, source = table.s_max_tokens, "the s_max_tokens column"
        elif cfg.s_max_policy == "request":
            return total
        else:
            s_max, source = (
                np.full(len(total), cfg.s_max_tokens, dtype=np.int64),
                f"{_KEY}.s_max_tokens={cfg.s_max_tokens}",
            )
        over = np.flatnonzero(total > s_max)
        if len(over):
            row = int(over[0])
            fix = "fix the row" if table.s_max_tokens is not None else "raise it or use workload.s_max_policy=request"
            raise ConfigError(
                f"{self.path}:{table.lines[row]}: prompt + output = {int(total[row])} tokens is more than "
                f"the request's declared S_max ({int(s_max[row])}, from {source}): {fix}"
            )
        return s_max

    def generate(self, rng: np.random.Generator) -> Workload:
        """The file's requests in file order; only ``arrival=poisson`` draws from ``rng``."""
        cfg: RequestCsvConfig = self.config
        n = len(self.table.prompt_tokens)
        if cfg.arrival == "file":
            arrival_s = self.table.arrival_s if self.table.arrival_s is not None else np.zeros(n, dtype=np.float64)
        else:
            arrival_s = arrival_times_s(cfg.arrival, n, cfg.rate_per_s, rng)
        return Workload(
            arrival_s=read_only(arrival_s),
            prompt_tokens=read_only(self.table.prompt_tokens),
            output_tokens=read_only(self.table.output_tokens),
            s_max_tokens=read_only(self.s_max_tokens),
            priority=None if self.table.priority is None else read_only(self.table.priority),
        )


@hookimpl
def kvbench_register_workloads() -> list[type]:
    """Register the ``request_csv`` workload source."""
    return [RequestCsvWorkload]
