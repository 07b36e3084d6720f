"""The ``trace`` workload source: replay a recorded trace (Azure 2023, Mooncake, a length file, a request CSV).

Formats (``format``; the readers are in :mod:`trace_formats`):

- ``azure``: the Azure LLM inference trace 2023 (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``);
- ``mooncake``: Mooncake's FAST'25 JSONL (``timestamp`` in ms, ``input_length``, ``output_length``,
  ``hash_ids``); its hash ids become the workload's prefix hashes, one per 512 prompt tokens;
- ``lengths``: prompt and output lengths only (ShareGPT, arXiv summarization): no arrivals;
- ``request_csv``: the columns of the ``request_csv`` source (arrivals and S_max optional).

``path`` is a file: a bare name of one of kvbench's packaged traces (``kvbench/traces``), or a
path (a relative one from the directory kvbench runs in).

Which requests. Rows ``[start_offset, start_offset + num_requests)`` of the file, in file order.
Requests too long for the run (below) are then dropped, clipped or refused (``too_long``).

Arrivals. ``arrival: trace`` replays the file's timestamps, measured from the first replayed request
(so the replay starts when it does, whatever the offset); a request CSV without an arrival column
arrives all at t = 0. ``poisson`` (at ``rate_per_s``) and ``all_at_once`` replace them with
kvbench's arrival processes (a length file has no timestamps, so it needs one of these).
``rate_scale`` then divides every arrival time: 2.0 replays the same requests at twice the rate
(every gap halved), 0.5 at half the rate.

Declared S_max (``s_max_policy``) and the longest request the run accepts, L:

- ``model_max``: every request declares the model's positions, ``model_max_tokens`` (the packaged
  configs fill it from ``model.hf_config.max_position_embeddings``); L = model_max_tokens;
- ``fixed``: every request declares ``s_max_tokens``; L = s_max_tokens;
- ``request``: the trace's own declaration: a request CSV's ``s_max_tokens`` column, or exactly
  prompt + output (a perfect length oracle); L = model_max_tokens (no limit when null), and a
  declaration beyond L is lowered to L.

``too_long`` decides what happens to a request whose prompt + output exceeds L: ``drop`` it,
``clip`` it (the output is shortened first; a prompt of L tokens or more keeps its first L - 1
tokens and one output token, and its prefix hashes are cut to match), or stop with an ``error``
naming its line. The counts are kept on the source as ``num_dropped`` and ``num_clipped``.

The file is read once, when the source is built, so a bad row stops the run before anything runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from kvbench_plugins.workloads.trace_formats import (
    TraceRows,
    read_azure,
    read_lengths,
    read_mooncake,
    read_request_csv,
)
from omegaconf import MISSING

import kvbench
from kvbench import hookimpl
from kvbench.errors import ConfigError, clip, require
from kvbench.io.textio import count_lines
from kvbench.workload.arrivals import ARRIVAL_KINDS, arrival_times_s, validate_arrivals
from kvbench.workload.source import Workload, WorkloadSource, read_only

_KEY = "workload"
FORMATS = ("azure", "mooncake", "lengths", "request_csv")
ARRIVALS = ("trace", *ARRIVAL_KINDS)
S_MAX_POLICIES = ("model_max", "fixed", "request")
TOO_LONG = ("drop", "clip", "error")
#: where the packaged traces live (package data of kvbench; see its README)
TRACES_DIR = Path(kvbench.__file__).resolve().parent / "traces"


@dataclass
class TraceConfig:
    """Options of the ``trace`` workload (the ``workload`` config group)."""

    #: azure, mooncake, lengths or request_csv (see the module docstring)
    format: str = MISSING
    #: the trace file: a packaged trace's bare name, or a path (relative: from the working directory)
    path: str = MISSING
    #: replay this many rows (after start_offset); null: every row
    num_requests: int | None = None
    #: skip this many rows at the top of the file
    start_offset: int = 0
    #: trace: the file's timestamps; poisson or all_at_once: kvbench's arrival processes
    arrival: str = "trace"
    #: mean request rate in requests/s; required (> 0) for poisson, ignored otherwise
    rate_per_s: float | None = None
    #: divides every arrival time: 2.0 = twice the rate (gaps halved), 0.5 = half
    rate_scale: float = 1.0
    #: model_max, fixed or request (see the module docstring)
    s_max_policy: str = "model_max"
    #: the declared S_max of every request under s_max_policy=fixed
    s_max_tokens: int = 4096
    #: the model's positions: the declared S_max under model_max, the longest request under request
    model_max_tokens: int | None = None
    #: a request longer than the run accepts: drop, clip or error
    too_long: str = "drop"

    def validate(self) -> None:
        """Raise a one-line ConfigError for the first invalid option (the file is checked when read)."""
        require(self.format in FORMATS, f"{_KEY}.format", self.format, f"choose one of {', '.join(FORMATS)}")
        require(bool(self.path) and self.path != MISSING, f"{_KEY}.path", self.path, "give the path to a trace file")
        ok = self.num_requests is None or self.num_requests >= 1
        require(ok, f"{_KEY}.num_requests", self.num_requests, "use null (every row) or an integer >= 1")
        require(self.start_offset >= 0, f"{_KEY}.start_offset", self.start_offset, "use an integer >= 0")
        require(self.arrival in ARRIVALS, f"{_KEY}.arrival", self.arrival, f"choose one of {', '.join(ARRIVALS)}")
        if self.arrival == "trace":
            require(
                self.format != "lengths",
                f"{_KEY}.arrival",
                self.arrival,
                "a lengths file has no timestamps; use arrival=poisson (with rate_per_s) or all_at_once",
            )
        else:
            validate_arrivals(self.arrival, self.rate_per_s, _KEY)
        ok = math.isfinite(self.rate_scale) and self.rate_scale > 0
        require(ok, f"{_KEY}.rate_scale", self.rate_scale, "use a positive factor (2.0 replays at twice the rate)")
        allowed = f"choose one of {', '.join(S_MAX_POLICIES)}"
        require(self.s_max_policy in S_MAX_POLICIES, f"{_KEY}.s_max_policy", self.s_max_policy, allowed)
        require(self.s_max_tokens >= 2, f"{_KEY}.s_max_tokens", self.s_max_tokens, "use an integer >= 2")
        ok = self.model_max_tokens is None or self.model_max_tokens >= 2
        require(ok, f"{_KEY}.model_max_tokens", self.model_max_tokens, "use null or an integer >= 2")
        require(
            self.s_max_policy != "model_max" or self.model_max_tokens is not None,
            f"{_KEY}.model_max_tokens",
            None,
            "s_max_policy=model_max needs the model's positions; set it (e.g. 4096 for llama2-7b)",
        )
        require(self.too_long in TOO_LONG, f"{_KEY}.too_long", self.too_long, f"choose one of {', '.join(TOO_LONG)}")

    def longest_tokens(self) -> int | None:
        """L: the longest prompt + output the run accepts (None: no limit)."""
        return self.s_max_tokens if self.s_max_policy == "fixed" else self.model_max_tokens

    def limit_source(self) -> str:
        key = "s_max_tokens" if self.s_max_policy == "fixed" else "model_max_tokens"
        return f"{_KEY}.{key}={self.longest_tokens()}"


def packaged_traces() -> list[str]:
    """The names of kvbench's packaged traces (the files ``workload.path=<name>`` finds)."""
    return sorted(p.name for p in TRACES_DIR.glob("*.*") if p.suffix != ".md")


def resolve_path(path: str) -> Path:
    """A packaged trace by its bare name, else the path as given (relative to the working directory).

    Only a bare file name is looked up among the packaged traces: ``../../x`` relative to that
    folder would reach any file on the machine, under a name that does not say so."""
    given = Path(path).expanduser()
    if given.name == path and path in packaged_traces():
        return TRACES_DIR / path
    if not given.is_file():
        what = (
            "is a folder, not a trace file"
            if given.is_dir()
            else f"no such file here or among kvbench's traces ({', '.join(packaged_traces())})"
        )
        raise ConfigError(f"{_KEY}.path={clip(path)!r}: {what}; give the path to a trace file")
    return given


def read_rows(cfg: TraceConfig, path: Path) -> TraceRows:
    """The replayed window of the file, read by its format's reader."""
    skip, limit = cfg.start_offset, cfg.num_requests
    if cfg.format == "azure":
        return read_azure(path, skip, limit)
    if cfg.format == "mooncake":
        return read_mooncake(path, skip, limit)
    if cfg.format == "lengths":
        return read_lengths(path, skip, limit)
    return read_request_csv(path, skip, limit, sorted_arrivals=cfg.arrival == "trace")


class TraceWorkload(WorkloadSource):
    """Requests replayed from a trace file (see the module docstring)."""

    name = "trace"
    Config = TraceConfig
    replays_a_file = True

    @classmethod
    def planned_requests(cls, config: TraceConfig) -> int | None:
        """The rows the replay will read: the file's rows (a header off a CSV) after start_offset,
        at most num_requests. Counted without parsing; None when the file cannot be found yet."""
        try:
            path = resolve_path(config.path)
        except ConfigError:
            return config.num_requests  # the source says what is wrong when it is built
        rows = count_lines(path, f"{_KEY}.path") - (0 if config.format == "mooncake" else 1)
        rows = max(0, rows - config.start_offset)
        return rows if config.num_requests is None else min(rows, config.num_requests)

    @classmethod
    def carries_prefix_hashes(cls, config: TraceConfig) -> bool:
        return config.format == "mooncake"

    def __init__(self, config: TraceConfig) -> None:
        config.validate()
        super().__init__(config)
        self.path = resolve_path(config.path)
        rows = read_rows(config, self.path)
        self.num_read = len(rows.prompt_tokens)
        #: requests left out / shortened because they exceed the longest the run accepts
        self.num_dropped = 0
        self.num_clipped = 0
        self.rows = self._fit(rows)
        self.s_max_tokens = self._declared_s_max()

    def _fit(self, rows: TraceRows) -> TraceRows:
        """Apply ``too_long`` to the requests longer than L."""
        cfg: TraceConfig = self.config
        longest = cfg.longest_tokens()
        total = rows.prompt_tokens + rows.output_tokens
        if rows.s_max_tokens is not None and cfg.s_max_policy == "request":
            # the file's own declaration is a promise about the request: a row that breaks it is wrong
            broken = np.flatnonzero(total > rows.s_max_tokens)
            if len(broken):
                row = int(broken[0])
                raise ConfigError(
                    f"{self.path}:{rows.lines[row]}: prompt + output = {int(total[row])} tokens is more than "
                    f"the row's own s_max_tokens ({int(rows.s_max_tokens[row])}): fix the row"
                )
        over = np.zeros(len(total), dtype=bool) if longest is None else total > longest
        if not over.any():
            return rows
        if cfg.too_long == "error":
            row = int(np.flatnonzero(over)[0])
            raise ConfigError(
                f"{self.path}:{rows.lines[row]}: prompt + output = {int(total[row])} tokens is more than "
                f"the {longest} the run accepts ({cfg.limit_source()}): use workload.too_long=drop or "
                "clip, or a longer-context model"
            )
        if cfg.too_long == "drop":
            self.num_dropped = int(over.sum())
            if self.num_dropped == len(total):
                raise ConfigError(
                    f"{self.path}: all {len(total)} replayed requests are longer than the {longest} tokens "
                    f"the run accepts ({cfg.limit_source()}): use a longer-context model or too_long=clip"
                )
            return _select(rows, ~over)
        self.num_clipped = int(over.sum())
        return _clip(rows, longest)

    def _declared_s_max(self) -> np.ndarray:
        cfg: TraceConfig = self.config
        rows, longest = self.rows, cfg.longest_tokens()
        if cfg.s_max_policy != "request":
            return np.full(len(rows.prompt_tokens), longest, dtype=np.int64)
        own = rows.s_max_tokens if rows.s_max_tokens is not None else rows.prompt_tokens + rows.output_tokens
        # no copy: the workload gets a read-only view of it (generate)
        return own if longest is None else np.minimum(own, longest)

    def generate(self, rng: np.random.Generator) -> Workload:
        """The replayed requests in file order; only ``arrival=poisson`` draws from ``rng``."""
        cfg: TraceConfig = self.config
        rows, n = self.rows, len(self.rows.prompt_tokens)
        if cfg.arrival != "trace":
            arrival_s = arrival_times_s(cfg.arrival, n, cfg.rate_per_s, rng)
        elif rows.arrival_ticks is None:  # a request CSV without arrivals: an offline batch
            arrival_s = np.zeros(n, dtype=np.float64)
        else:
            # ticks are exact integers for Azure (ns) and Mooncake (ms): rebase before dividing
            arrival_s = (rows.arrival_ticks - rows.arrival_ticks[0]) / rows.ticks_per_s
        return Workload(
            arrival_s=np.asarray(arrival_s / cfg.rate_scale, dtype=np.float64),
            prompt_tokens=read_only(rows.prompt_tokens),
            output_tokens=read_only(rows.output_tokens),
            s_max_tokens=read_only(self.s_max_tokens),
            prefix_hashes=None if rows.prefix_hashes is None else list(rows.prefix_hashes),
            hash_block_tokens=rows.hash_block_tokens if rows.prefix_hashes is not None else 0,
        )


def _select(rows: TraceRows, keep: np.ndarray) -> TraceRows:
    def pick(column):
        return None if column is None else column[keep]

    hashes = None if rows.prefix_hashes is None else [h for h, k in zip(rows.prefix_hashes, keep.tolist()) if k]
    return TraceRows(
        rows.prompt_tokens[keep],
        rows.output_tokens[keep],
        rows.lines[keep],
        pick(rows.arrival_ticks),
        rows.ticks_per_s,
        pick(rows.s_max_tokens),
        hashes,
        rows.hash_block_tokens,
    )


def _clip(rows: TraceRows, longest: int) -> TraceRows:
    """Shorten the output first; a prompt of ``longest`` tokens or more keeps ``longest - 1`` and one output."""
    prompt = np.minimum(rows.prompt_tokens, longest - 1)
    output = np.minimum(rows.output_tokens, longest - prompt)
    hashes = rows.prefix_hashes
    if hashes is not None:  # a clipped prompt keeps its first tokens, so its first granules' ids stay right
        granule = rows.hash_block_tokens
        hashes = [h[: -(-p // granule)] for h, p in zip(hashes, prompt.tolist())]
    s_max = None if rows.s_max_tokens is None else np.minimum(rows.s_max_tokens, longest)
    return TraceRows(
        prompt, output, rows.lines, rows.arrival_ticks, rows.ticks_per_s, s_max, hashes, rows.hash_block_tokens
    )


@hookimpl
def kvbench_register_workloads() -> list[type]:
    """Register the ``trace`` workload source."""
    return [TraceWorkload]
