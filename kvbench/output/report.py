"""What a person reads at the end: a run's summary, or the tables comparing a sweep's jobs.

Both are laid out for the console's width (:func:`report_console`): the single-run summary fits one
screen, and the comparison puts the settings every job shares on a line above its tables, the swept
values in its first columns and each quantity's unit in its header; where its metric columns do not
fit the width it is split into stacked tables that each do, never squeezed into ellipses. Every
number stays in the files (``summary.json``, the Parquet and CSV tables).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from kvbench.errors import ConfigError
from kvbench.io.atomic import write_frame
from kvbench.io.textio import read_json_object
from kvbench.metrics.catalogue import SETTINGS as CATALOGUE_SETTINGS
from kvbench.metrics.catalogue import metric
from kvbench.metrics.display import METRIC_DEFINITIONS, SECONDS_FROM_S, format_bytes
from kvbench.output.results import read_job
from kvbench.output.run_report import REPORT_WIDTH, print_summary, report_console, wide_console  # noqa: F401 (re-exported)
from kvbench.output.sweep_info import SWEPT_PREFIX, job_overrides, swept_keys, swept_values

COMPARISON_NOTES = "% KV: of the KV budget; floor: fewest seqs running while saturated; unfilled: KV booked, unwritten"
#: added to the notes where the prefix-cache group shows
PREFIX_NOTES = (
    "prefix hits: % of prompt tokens served from cache; ceiling: an infinite cache's, Belady: optimal "
    "eviction in the KV budget (both offline, from the trace)"
)


# --- columns ----------------------------------------------------------------------------------


def _is_missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class Column:
    """One column of the comparison: the frame's column, a header (lines of the name, then the
    unit on a line of its own) and how a value is shown (``"ms"``: seconds shown in milliseconds,
    with one decimal unless the column reaches 1,000 ms; ``"pct"``: a fraction in percent)."""

    key: str
    name: str
    unit: str | None = None
    fmt: str = "{}"
    #: how the line of shared values says it, ``{}`` standing for the value (and unit)
    phrase: str | None = None

    @property
    def header(self) -> str:
        return self.name if self.unit is None else f"{self.name}\n{self.unit}"

    def said(self, shown: str) -> str:
        """``name value unit`` (or the phrase) for the lines of what every job shares."""
        value = shown if self.unit in (None, "count") else f"{shown} {self.unit}"
        return (self.phrase or self.name.replace("\n", " ") + " {}").format(value)

    def for_values(self, values: pd.Series) -> Column:
        """This column as it shows ``values``: a time column in milliseconds whose values reach
        :data:`SECONDS_FROM_S` is shown in seconds instead (``3,673 s``, not ``3,673,012 ms``)."""
        if self.fmt != "ms" or _largest(values) < SECONDS_FROM_S:
            return self
        return Column(self.key, self.name, "s", "s", self.phrase)

    def formatter(self, values: pd.Series) -> Callable[[object], str]:
        fmt = {"int": "{:,d}", "text": "{}"}.get(self.fmt, self.fmt)
        if fmt == "ms":
            fmt = "{:,.0f}" if _largest(values) >= 1 else "{:,.1f}"
            return lambda v: _format(fmt, None if _is_missing(v) else float(v) * 1e3)
        if fmt == "s":
            fmt = "{:,.0f}" if _largest(values) >= 1e3 else "{:,.1f}"
            return lambda v: _format(fmt, None if _is_missing(v) else float(v))
        if fmt == "pct":
            return lambda v: _format("{:.1f}", None if _is_missing(v) else float(v) * 100)
        if fmt == "bytes":
            return lambda v: "-" if _is_missing(v) else format_bytes(float(v))
        return lambda v: _format(fmt, v)


def _largest(values: pd.Series) -> float:
    """The largest absolute number among ``values`` (0 when there is none)."""
    numbers = pd.to_numeric(pd.Series(values), errors="coerce").abs()
    largest = numbers.max(skipna=True)
    return 0.0 if pd.isna(largest) else float(largest)


def _format(fmt: str, value) -> str:
    if _is_missing(value):
        return "-"
    try:
        if "d}" in fmt:
            value = int(value)
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def _column(key: str) -> Column:
    """A comparison column of a catalogued key: its header, unit, format and phrase."""
    m = metric(key)
    return Column(key, m.header or m.key, m.header_unit, m.show, m.phrase)


#: what every job of a sweep ran with: printed once above the tables when every job shares it, a
#: column beside the swept values when it differs (e.g. the block size an allocator sweep changes)
SETTINGS = tuple(_column(m.key) for m in CATALOGUE_SETTINGS)
#: the setting a swept key sets, so that a swept setting is not shown twice
_SETTING_OF_KEY = {
    "allocator.block_size_tokens": "block_size_tokens",
    "hardware.kv_budget_bytes": "kv_budget_bytes",
    "preemption.victim": "victim",
    "engine.name": "engine",
    **{c.key: c.key for c in SETTINGS},
}

# the comparison's groups, by key (their words, units and formats are the catalogue's)
_MEMORY = tuple(
    map(
        _column,
        (
            "peak_concurrency",
            "min_concurrency_saturated",
            "mean_concurrency_saturated",
            "utilization_mean",
            "utilization_saturated",
            "block_utilization_mean",
            "frac_internal",
            "frac_external",
            "mean_tail_waste_tokens_per_seq",
            # by layer kind, where the model has more than full attention (kvbench.metrics.kv_kinds)
            "peak_latent_bytes",
            "peak_indexer_bytes",
            "peak_full_bytes",
            "peak_window_bytes",
            "peak_state_bytes",
            "frac_state",
        ),
    )
)
_LATENCY = tuple(
    map(
        _column,
        (
            "throughput_tokens_per_s",
            "throughput_requests_per_s",
            "goodput_requests_per_s",
            "ttft_p50_s",
            "ttft_p99_s",
            "tpot_p50_s",
            "num_preemptions",
        ),
    )
)
_PREEMPTION = tuple(map(_column, ("num_swap_preemptions", "num_swap_fallbacks", "preemption_cost_s", "recompute_tax")))
_PREFIX = tuple(map(_column, ("prefix_hit_rate", "prefix_hit_rate_infinite", "prefix_hit_rate_belady", "frac_cached")))
_SHARING = tuple(map(_column, ("peak_allocated_bytes", "peak_unshared_bytes", "sharing_saving", "peak_shared_blocks")))
#: a host tier of evicted prefix blocks (allocator.host_cache_bytes): hits per tier, what reloads cost
_HOST_TIER = tuple(
    map(
        _column,
        (
            "prefix_hit_rate_gpu",
            "prefix_hit_rate_host",
            "prefix_hit_rate_belady_with_host",
            "host_reload_s",
            "host_reload_wait_s",
        ),
    )
)
#: pages mapped on demand (allocator=vattention): how many, and the share of the run they cost
_PAGE_MAPPING = tuple(map(_column, ("pages_mapped", "page_map_added_share")))


def _slo_given(rows: pd.DataFrame) -> bool:
    return "slo" in rows and rows["slo"].fillna("").astype(str).str.len().gt(0).any()


def _preempted(rows: pd.DataFrame) -> bool:
    return bool(rows.get("num_preemptions", pd.Series(dtype=float)).fillna(0).gt(0).any())


def _prefix_cached(rows: pd.DataFrame) -> bool:
    """Whether the prefix-cache group says something: some job's trace shares prefixes (its summary
    has the offline bounds) or its cache served or kept something. Every job's summary may carry a
    hit rate (0 without a cache), so its presence alone does not tell."""
    number = lambda key: pd.to_numeric(rows.get(key, pd.Series(dtype=float)), errors="coerce")
    return bool(
        number("prefix_hit_rate_infinite").notna().any()
        or number("prefix_hit_rate").gt(0).any()
        or number("frac_cached").gt(0).any()
    )


def _any_value(rows: pd.DataFrame, key: str) -> bool:
    """Whether some job wrote ``key`` (a metric only runs with a feature on write)."""
    return key in rows and rows[key].notna().any()


def _shared(rows: pd.DataFrame) -> bool:
    """Whether some job shared blocks (a fan-out's prompt, a prefix cache's hits)."""
    return bool(pd.to_numeric(rows.get("peak_shared_blocks", pd.Series(dtype=float)), errors="coerce").gt(0).any())


#: (title, columns, shown for these rows?): the comparison's metric groups, in order
COLUMN_GROUPS: tuple[tuple[str, tuple[Column, ...], Callable[[pd.DataFrame], bool]], ...] = (
    ("memory", _MEMORY, lambda rows: True),
    ("throughput and latency", _LATENCY, lambda rows: True),
    ("preemption", _PREEMPTION, _preempted),
    ("prefix cache", _PREFIX, _prefix_cached),
    ("sharing", _SHARING, _shared),
    ("host tier", _HOST_TIER, lambda rows: _any_value(rows, "prefix_hit_rate_host")),
    ("page mapping", _PAGE_MAPPING, lambda rows: _any_value(rows, "pages_mapped")),
)


def comparison_columns(rows: pd.DataFrame) -> tuple[list[tuple[str, list[Column]]], list[Column]]:
    """The metric columns for these (finished) rows, by group, split into those that differ
    between jobs and those every job shares (shown once, on a line). Goodput shows only where an
    SLO was given (else it is the request throughput); a preemption group only where a job
    preempted."""
    groups = []
    for title, columns, shown in COLUMN_GROUPS:
        if not shown(rows):
            continue
        unwanted = "throughput_requests_per_s" if _slo_given(rows) else "goodput_requests_per_s"
        columns = [c for c in columns if c.key in rows and c.key != unwanted]
        groups.append((title, columns))
    if len(rows) < 2:
        return groups, []
    same = [c for _, columns in groups for c in columns if rows[c.key].map(c.formatter(rows[c.key])).nunique() == 1]
    return [(title, [c for c in columns if c not in same]) for title, columns in groups], same


#: a transferred kernel's calibration (kvbench.exec.transfer.decode_for_run): its sources and held-out error
_TRANSFER = re.compile(r"^transfer: (?P<kernel>\S+) as .*? from (?P<sources>.*?), via .*?; (?P<heldout>held-out [^;]*)")


def no_effect_warnings(rows: pd.DataFrame) -> list[str]:
    """Lines that say when rows differ in something that cannot change a simulated number (kernels
    all uncalibrated on a GPU), or differ by a transfer rather than a measurement on this GPU (with
    each transferred kernel's sources and held-out error)."""
    warnings = []
    if "kernel" not in rows or "calibration" not in rows:
        return warnings
    calibration = rows["calibration"].astype(str)
    hardware_of = rows["hardware"].astype(str) if "hardware" in rows else pd.Series("this GPU", index=rows.index)
    plain = rows[calibration == "uncalibrated"]
    if rows["kernel"].nunique() > 1 and plain["kernel"].nunique() > 1:
        kernels = " and ".join(f"kernel={k}" for k in sorted(plain["kernel"].unique()))
        hardware = ", ".join(sorted(hardware_of[plain.index].unique())) if "hardware" in rows else "this hardware"
        warnings.append(
            f"{kernels} run at the same simulated speed: no calibration for {hardware} "
            "(<hardware>/<kernel>.json in kvbench/calibrations/ or calibration_dir=<folder>, written by "
            "kvbench bench-kernels on a GPU)"
        )
    said, hardware = [], set()
    for index in rows.index[calibration.str.startswith("transfer:")]:
        found = _TRANSFER.match(calibration[index])
        if found:
            said.append(f"kernel={rows['kernel'][index]} from {found['sources']} ({found['heldout']})")
            hardware.add(hardware_of[index])
    said = sorted(set(said))
    if said:
        warnings.append(
            f"no GPU measured {'these kernels' if len(said) > 1 else 'this kernel'} on {', '.join(sorted(hardware))}: "
            f"priced by a transfer validated on hidden tables (docs/transfer/README.md): {'; '.join(said)}"
        )
    return warnings


# --- what a sweep varied ----------------------------------------------------------------------


def _short_name(key: str) -> Column:
    """A swept key's column: its last part as words, its unit suffix on a line of its own
    (``allocator.block_size_tokens`` -> ``block`` / ``tokens``)."""
    name = key.rsplit(".", 1)[-1]
    unit = None
    for suffix, unit_name in (("_per_s", "/s"), ("_tokens", "tokens"), ("_bytes", "bytes"), ("_s", "s")):
        if name.endswith(suffix) and name != suffix.lstrip("_"):
            name, unit = name.removesuffix(suffix), unit_name
            break
    name = {"block_size": "block"}.get(name, name).replace("_", " ")
    return Column(SWEPT_PREFIX + key, name, unit)


def _varying_labels(jobs: pd.Series) -> list[str]:
    """Each job's overrides minus those every job shares (the last fallback: a job label as text)."""
    parts = [str(j).split(",") for j in jobs]
    common = set.intersection(*map(set, parts)) if parts else set()
    return [" ".join(p for p in job if p not in common) or "defaults" for job in parts]


def sweep_axes(sweep_dir: Path, frame: pd.DataFrame) -> list[Column]:
    """The swept keys' columns, added to ``frame`` as ``swept.<key>`` (each job's value as typed).

    The keys are those Hydra recorded as sweeps (``multirun.yaml``); without that record, the
    overrides whose value differs between the jobs' own ``.hydra/overrides.yaml``; without those,
    one ``job`` column of each job's overrides minus the shared ones.
    """
    job_dirs = [Path(sweep_dir) / str(num) for num in frame["job_num"]]
    keys = swept_keys(sweep_dir)
    if keys:
        values = [swept_values(job_dir, keys) for job_dir in job_dirs]
    else:
        values = [job_overrides(job_dir) for job_dir in job_dirs]
        seen = list(dict.fromkeys(key for job in values for key in job))
        keys = [key for key in seen if len({job.get(key, "") for job in values}) > 1]
    if not keys:
        jobs = frame["job"] if "job" in frame else frame["job_num"].astype(str)
        frame[SWEPT_PREFIX + "job"] = _varying_labels(jobs.fillna("").astype(str))
        return [Column(SWEPT_PREFIX + "job", "job")]
    axes = [_short_name(key) for key in keys]
    names = [a.name for a in axes]
    # two keys ending alike (model.name, hardware.name) are told apart by their whole key
    axes = [a if names.count(a.name) == 1 else Column(a.key, a.key.removeprefix(SWEPT_PREFIX), a.unit) for a in axes]
    for key, axis in zip(keys, axes):
        frame[axis.key] = [job.get(key, "") for job in values]
    frame["label"] = [" ".join(f"{key}={job.get(key, '')}" for key in keys) for job in values]
    return axes


# --- the comparison ---------------------------------------------------------------------------


def comparison_frame(sweep_dir: Path) -> pd.DataFrame:
    """One row per job folder of a multirun (finished, failed or incomplete), in job order."""
    rows = []
    for job_dir in sorted(
        (p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    ):
        row = read_job(job_dir)
        if row is not None:
            rows.append({"job_num": int(job_dir.name), **row, "slo": _slo_text(job_dir)})
    return pd.DataFrame(rows)


def _slo_text(job_dir: Path) -> str:
    """The SLOs a job was given (``ttft_s=2, tpot_s=0.05``), from its ``config.json``; "" for none."""
    try:
        slo = read_json_object(job_dir / "config.json", "result config").get("slo") or {}
    except ConfigError:
        return ""
    if not isinstance(slo, dict):
        return ""
    return ", ".join(f"{key}={value}" for key, value in slo.items() if value is not None)


def _width(console: Console, table: Table) -> int:
    """The table's natural width: what it takes with no column wrapped or cut."""
    return Measurement.get(console, console.options.update_width(10_000), table).maximum


def _table(title: str | None, columns: Sequence[Column], frame: pd.DataFrame, first_metric: int) -> Table:
    """One table of the comparison; a failed or incomplete job shows its status in the first
    metric column (``first_metric``: how many columns come before it)."""
    table = Table(title=title, title_justify="left")
    ok = frame.loc[~frame["failed"]]
    columns = [c.for_values(ok[c.key]) if c.key in ok else c for c in columns]
    for i, column in enumerate(columns):
        # names (and values typed on the command line) read from the left, numbers line up right
        values = frame[column.key].dropna() if column.key in frame else pd.Series(dtype=object)
        is_text = i < first_metric and not pd.to_numeric(values, errors="coerce").notna().all()
        table.add_column(column.header, justify="left" if is_text else "right", overflow="fold", no_wrap=not is_text)
    formatters = [c.formatter(frame.loc[~frame["failed"], c.key]) if c.key in frame else None for c in columns]
    for _, row in frame.iterrows():
        # values are text, never rich markup: a swept value like [8,16] must show as typed
        cells = [escape(f(row.get(c.key))) if f else "-" for c, f in zip(columns, formatters)]
        if row["failed"]:
            status = f"[red]{escape(str(row['status']))}[/red]"
            cells = [*cells[:first_metric], status, *[""] * (len(columns) - first_metric - 1)]
            cells = [
                cell if i >= first_metric or columns[i].key.startswith(SWEPT_PREFIX) else ""
                for i, cell in enumerate(cells)
            ]
        table.add_row(*cells)
    return table


def comparison_tables(frame: pd.DataFrame, axes: list[Column], console: Console) -> list[Table]:
    """The comparison as tables that each fit ``console``'s width: the swept values and the settings
    that differ first in every table, then the metric groups, as many side by side as fit."""
    ok = frame[~frame["failed"]]
    covered = {_SETTING_OF_KEY.get(a.key.removeprefix(SWEPT_PREFIX)) for a in axes}
    varying = [
        s
        for s in SETTINGS
        if s.key in ok and s.key not in covered and ok[s.key].map(s.formatter(ok[s.key])).nunique() > 1
    ]
    if calibrations_by_kernel(ok):  # said on lines above the tables: a column of it would crowd every table
        varying = [s for s in varying if s.key != "calibration"]
    lead = [*axes, *varying]
    groups, _ = comparison_columns(ok)
    width = console.width
    fits = lambda metrics: _width(console, _table(None, [*lead, *metrics], frame, len(lead))) <= width
    packed: list[tuple[list[str], list[Column]]] = []  # (group titles, columns) of each table
    for title, columns in groups:
        if not columns:
            continue
        if packed and fits([*packed[-1][1], *columns]):
            packed[-1] = ([*packed[-1][0], title], [*packed[-1][1], *columns])
            continue
        packed.append(([title], []))
        for column in columns:  # a group wider than the console is split column by column
            if packed[-1][1] and not fits([*packed[-1][1], column]):
                packed.append(([f"{title} (continued)"], []))
            packed[-1][1].append(column)
    if not packed:  # no job finished: the status is all there is to show
        packed = [([], [Column("status", "status")])]
    titled = len(packed) > 1
    return [
        _table("; ".join(titles) if titled else None, [*lead, *columns], frame, len(lead)) for titles, columns in packed
    ]


def calibrations_by_kernel(ok: pd.DataFrame) -> dict[str, str]:
    """Each kernel's calibration (what priced its steps: a table's provenance, or ``uncalibrated``)
    where the kernels of the sweep differ in it and each kernel has one; else empty."""
    if "calibration" not in ok or "kernel" not in ok or ok["calibration"].nunique() < 2:
        return {}
    pairs = ok[["kernel", "calibration"]].astype(str).drop_duplicates()
    if pairs["kernel"].duplicated().any():  # one kernel priced two ways (calibration_dir swept): a column
        return {}
    return dict(zip(pairs["kernel"], pairs["calibration"]))


def _shared_line(frame: pd.DataFrame, axes: list[Column]) -> str:
    """The settings every finished job shares, as ``model llama2-7b, hardware h100-sxm, ...``."""
    ok = frame[~frame["failed"]]
    if ok.empty:
        return ""
    covered = {_SETTING_OF_KEY.get(a.key.removeprefix(SWEPT_PREFIX)) for a in axes}
    line, last = "", None
    for setting in SETTINGS:
        if setting.key not in ok or setting.key in covered:
            continue
        shown = ok[setting.key].map(setting.formatter(ok[setting.key]))
        if shown.nunique() == 1 and shown.iloc[0] not in ("-", ""):
            said = setting.said(shown.iloc[0])
            if setting.key == "calibration" and last != "kernel":  # the kernels are swept: say whose it is
                said = f"kernel calibration {shown.iloc[0]}"
            # "on h100-sxm" and "(uncalibrated)" qualify the setting before them
            line += (" " if said.startswith(("on ", "(")) else ", ") + said if line else said
            last = setting.key
    return line


def print_comparison(sweep_dir: Path, console: Console | None = None) -> pd.DataFrame:
    """Print the sweep's comparison and save it (Parquet, CSV, PNG) in the sweep folder."""
    console = console or report_console()
    frame = comparison_frame(sweep_dir)
    if frame.empty:
        console.print(f"kvbench: no job results under {sweep_dir}")
        return frame
    if "failed" not in frame:
        frame["failed"] = False
    frame["failed"] = frame["failed"].fillna(False).astype(bool)
    # failed (bad input) or incomplete (interrupted: never read); "ok" rows are finished results
    status = frame["status"] if "status" in frame else pd.Series(pd.NA, index=frame.index, dtype=object)
    frame["status"] = status.fillna(frame["failed"].map({True: "failed", False: "ok"}))
    axes = sweep_axes(sweep_dir, frame)
    if "label" not in frame:
        frame["label"] = frame[axes[0].key]
    ok = frame[~frame["failed"]]
    swept = ", ".join(a.key.removeprefix(SWEPT_PREFIX) for a in axes)
    console.print(f"[bold]kvbench comparison ({len(frame)} jobs)[/bold], swept: {swept}", highlight=False)
    if shared := _shared_line(frame, axes):
        console.print(f"every job: {escape(shared)}", highlight=False)
    _, same = comparison_columns(ok)
    if same:
        same = [c.for_values(ok[c.key]) for c in same]
        shown = [(c, c.formatter(ok[c.key])(ok[c.key].iloc[0])) for c in same]
        # a value no job has (a floor while saturated, when no job saturated) says nothing
        values = ", ".join(c.said(value) for c, value in shown if value != "-")
        if values:
            console.print(f"same in every job: {escape(values)}", highlight=False)
    for kernel, calibration in calibrations_by_kernel(ok).items():
        console.print(escape(f"kernel {kernel} priced by: {calibration}"), highlight=False)
    for warning in no_effect_warnings(ok):
        console.print(f"[bold yellow]{warning}[/bold yellow]", highlight=False)
    for table in comparison_tables(frame, axes, console):
        console.print(table)
    for _, row in frame[frame["failed"]].iterrows():
        said = escape(f"{row['label']}: {row['error']}")  # `pip install 'kvbench[wandb]'` is not markup
        console.print(f"[red]{escape(str(row['status']))}[/red] {said}", highlight=False)
    notes = COMPARISON_NOTES + (f"\n{PREFIX_NOTES}" if _prefix_cached(ok) else "")
    console.print(f"[dim]{METRIC_DEFINITIONS}\n{notes}[/dim]", highlight=False)
    write_frame(frame, sweep_dir, "comparison")
    if (~frame["failed"]).any():
        from kvbench.output.figures import plot_comparison

        plot_comparison(frame, sweep_dir / "comparison.png")
    console.print(f"comparison: {sweep_dir / 'comparison.csv'}", highlight=False)
    return frame
