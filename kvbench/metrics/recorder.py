"""The recorder: step plans and their results in, the run's tables out.

Step table. One row per *span*: a step, or a run of consecutive quiet steps (decodes only) with
the same batch, none of which but the last finishes a sequence. Whether the engine advanced such a
run one step at a time or in one computation, the recorder writes the same row: it merges quiet
steps itself, so the two loops give identical tables. In a span's row the five memory-ledger
columns are means over its steps weighted by step time (so time-weighted means over the run stay
exact), ``duration_s`` and the other amounts are totals, and counts of what is running are
constant by construction. A one-step row holds that step's exact ledger; ``token_bytes_max`` and
``allocated_bytes_max`` (token + reserved future + internal) are the largest over the row's steps,
so peaks stay exact too, and so is ``unshared_bytes_max``: what the same sequences would hold with
no block shared (allocated bytes plus what sharing saves, which quiet steps never change).
A model with several KV-cache groups adds the ledger's split of the allocated bytes by group kind
(``full_group_bytes``, ``window_group_bytes``: :class:`~kvbench.core.ledger.MemoryLedger`'s
``group_bytes``), after the other columns, means over a span as the ledger's parts are.

Columns are typed arrays (8 bytes a value, not a Python object each). Closed rows wait as lists
and are stored a column at a time, a batch of rows at once; the columns become a
:class:`~kvbench.io.table.ColumnTable` once at the end, without a copy. Given a ``step_sink``, the
recorder keeps no step table at all: each batch of rows goes to the sink as numpy columns (a run
that streams its table to its files, and adds up its summary as the rows pass:
:class:`~kvbench.metrics.step_totals.StepTotals`), so that a long run holds its live requests,
not its millions of rows.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import struct
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.core.sequence import EVENT_COLUMNS, FLOAT_GROUP_COLUMNS, GROUP_COLUMNS, REQUEST_COLUMNS, SequenceGroup
from kvbench.core.step import Mechanism, StepPlan, StepResult, added_in_order
from kvbench.io.atomic import PARQUET_ROW_GROUP_ROWS
from kvbench.io.table import ColumnTable

if TYPE_CHECKING:
    import pandas as pd

#: step-table columns of what a step cost: the seconds of each part of it and the KV bytes it read (floats)
STEP_COST_COLUMNS = ("prefill_s", "decode_s", "swap_s", "copy_s", "recompute_s", "kv_read_bytes")
#: step-table columns besides the ledger's, in order (one source for the table and its readers)
STEP_COLUMNS: tuple[str, ...] = (
    "step",
    "num_steps",
    "start_s",
    "duration_s",
    "num_running",
    "num_decode_seqs",
    "num_prefill_seqs",
    "num_prefill_tokens",
    "num_waiting",
    "num_swapped",
    "saturated",
    "num_preemptions",
    "num_swap_preemptions",
    "num_swap_fallbacks",
    "num_forks",
    "num_copies",
    "copy_bytes",
    "swap_out_bytes",
    "swap_in_bytes",
    *STEP_COST_COLUMNS,
    "num_computed_tokens",
    "num_recomputed_tokens",
    *LEDGER_FIELDS,
    "token_bytes_max",
    "allocated_bytes_max",
    "num_shared_blocks",
    "unshared_bytes_max",
)
#: step-table columns holding times, byte amounts read or ledger means (floats); the others count
#: (integers) but ``saturated`` (a flag)
FLOAT_STEP_COLUMNS = frozenset(("start_s", "duration_s", *STEP_COST_COLUMNS, *LEDGER_FIELDS))
#: step-table columns of a real run only (``StepResult.predicted_s`` set): the measured time
#: (``duration_s`` again, named for what it is) and the cost model's time for the same plan
MEASURED_COLUMNS: tuple[str, ...] = ("measured_s", "predicted_s")
#: step-table columns of an allocator that maps pages (``maps_pages``: vAttention), after the
#: others: pages mapped, the time mapping them took, and what that added to the steps' time
MAP_COLUMNS: tuple[str, ...] = ("pages_mapped", "page_map_s", "page_map_added_s")
#: a step row's positions (rows are lists in STEP_COLUMNS order, then a run's optional columns):
#: the values a merge adds to or a span's means replace, by position (a dict per row, read back
#: by name, cost more than the rest of the row's bookkeeping)
_AT = {name: i for i, name in enumerate(STEP_COLUMNS)}
_NUM_STEPS, _DURATION, _DECODE, _KV_READ, _COMPUTED = (
    _AT[name] for name in ("num_steps", "duration_s", "decode_s", "kv_read_bytes", "num_computed_tokens")
)
_TOKEN_MAX, _ALLOCATED_MAX, _SHARED_BLOCKS, _UNSHARED_MAX = (
    _AT[name] for name in ("token_bytes_max", "allocated_bytes_max", "num_shared_blocks", "unshared_bytes_max")
)
_LEDGER_AT = tuple(_AT[name] for name in LEDGER_FIELDS)
#: where a real run's MEASURED_COLUMNS start (they come first after STEP_COLUMNS)
_MEASURED_AT = len(STEP_COLUMNS)

REFUSAL_COLUMNS = (
    "step",
    "time_s",
    "num_steps",
    "request_id",
    "reason",
    "reservation_bytes",
    "free_bytes",
    "largest_hole_bytes",
)


@dataclass
class RunRecord:
    """What one run produced: per-request, per-span and per-refusal tables, and its wall times
    (``step_columns`` is None when the step table went to a ``step_sink``). ``loop_wall_s`` is the
    whole loop, from the first request made to the last row written; ``sim_wall_s`` the same less
    what the loop spent making requests and writing its tables' rows (:meth:`Recorder.outside_loop`).
    The run path reads the tables' columns; ``requests``, ``steps`` and ``refusals`` are the same
    tables as DataFrames, made (and pandas imported) on first use."""

    request_columns: ColumnTable
    step_columns: ColumnTable | None
    refusal_columns: ColumnTable
    sim_wall_s: float
    loop_wall_s: float

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        return self.request_columns.to_pandas()

    @functools.cached_property
    def steps(self) -> pd.DataFrame | None:
        return None if self.step_columns is None else self.step_columns.to_pandas()

    @functools.cached_property
    def refusals(self) -> pd.DataFrame:
        return self.refusal_columns.to_pandas()


def _add_span(totals: list[float], spans: dict, durations, names: tuple[str, ...]) -> list[float]:
    """Each ledger field's total (``names``: the ledger's fields and group parts) plus its value
    after each step of a run times that step's time, added one by one in step order (as
    ``added_in_order`` does for one series). A short projection (lists) is added in plain floats, a
    long one (arrays) for every field at once; both round alike."""
    series = [spans[name] for name in names]
    if isinstance(series[0], list):
        step_s = durations.tolist() if isinstance(durations, np.ndarray) else list(durations)
        out = []
        for total, values in zip(totals, series):
            # a part that stays 0 through the run (the cache without prefix caching, external bytes
            # of a budget that is whole blocks) adds 0.0 at every step: the total it had, to the
            # bit (a total is never -0.0: it starts as 0.0 + a product)
            if not any(values):
                out.append(total)
                continue
            for value, duration in zip(values, step_s):
                total += value * duration
            out.append(total)
        return out
    products = np.stack(series) * durations
    return np.cumsum(np.column_stack((totals, products)), axis=1)[:, -1].tolist()


_LEDGER_FIELD_VALUES = operator.attrgetter(*LEDGER_FIELDS)


def _ledger_values(ledger) -> tuple[int, ...]:
    """A ledger's fields, then its group parts (a model with several KV-cache groups)."""
    values = _LEDGER_FIELD_VALUES(ledger)
    if ledger.group_bytes:
        values += tuple(value for _, value in ledger.group_bytes)
    return values


def _page_map_amounts(plan: StepPlan, result: StepResult) -> tuple[int, float, float]:
    """A plan's pages mapped, the time mapping them took, and what that added to its steps."""
    mapping = plan.page_mapping
    pages = mapping.num_pages
    if plan.num_steps > 1:
        pages += int(np.sum(plan.span_pages_mapped))
    added = result.page_map_added_s
    return pages, pages * mapping.page_map_latency_s, 0.0 if added is None else added_in_order(0.0, added)


#: step-table rows held (as lists) before they are stored a column at a time (a value appended to
#: each of 40 typed columns per row cost more than the row's own bookkeeping) or sent to the step
#: sink: a Parquet row group's rows, so that a table streamed a batch at a time is the same file
STEP_ROWS_BATCH = PARQUET_ROW_GROUP_ROWS

#: finished requests held before their rows are stored a column at a time (per-value appends cost
#: more than the run's own work on each request)
REQUEST_ROWS_BATCH = 4096


def _group_type(name: str) -> str:
    """The request table's column types: times are floats, everything else counts."""
    return "d" if name in FLOAT_GROUP_COLUMNS else "q"


def _typed_column(name: str) -> array:
    """A column's values as machine numbers (8 bytes each, not a Python object per value): a long
    run writes hundreds of thousands of rows."""
    return array("b" if name == "saturated" else "d" if name in FLOAT_STEP_COLUMNS else "q")


def _extend(column: array, values: tuple) -> None:
    """Append ``values`` to a typed column. NOTE: ``array.extend`` converts value by value through
    ``PyArg_Parse`` (about 470 machine instructions a value, 40 values a step row); ``struct`` packs
    the same machine values by the same conversions (a float's ``PyFloat_AsDouble``, an integer's
    ``__index__``, range checks alike) at a quarter of that."""
    column.frombytes(struct.pack(f"{len(values)}{column.typecode}", *values))


#: a typed column's numpy type
_NUMPY_TYPES = {"b": np.bool_, "d": np.float64, "q": np.int64}

#: a batch of step-table rows as columns: a column name -> its values, in the table's column order
StepSink = Callable[[dict[str, np.ndarray]], None]


def _as_numpy(values: array) -> np.ndarray:
    if values.typecode == "b":
        return np.frombuffer(values, dtype=np.int8).astype(bool) if len(values) else np.array([], dtype=bool)
    return (
        np.frombuffer(values, dtype=np.float64 if values.typecode == "d" else np.int64)
        if len(values)
        else (np.array([], dtype=np.float64 if values.typecode == "d" else np.int64))
    )


class Recorder:
    def __init__(self, kv_bytes_per_token: int, step_sink: StepSink | None = None) -> None:
        self.kv_bytes_per_token = kv_bytes_per_token
        #: where each batch of step rows goes instead of the table (None: the recorder keeps it)
        self._step_sink = step_sink
        self._batches_sunk = 0
        self._columns: dict[str, array] = {name: _typed_column(name) for name in STEP_COLUMNS}
        #: the request table, a column per GROUP_COLUMNS name, one row per finished request (finish order)
        self._request_columns: dict[str, array] = {name: array(_group_type(name)) for name in GROUP_COLUMNS}
        self._finished: list[SequenceGroup] = []  # the latest finished requests, before their rows are stored
        self._outside_s = 0.0  # time in the loop spent building its inputs and tables (outside_loop)
        self._refusals: list[list] = []
        self._open: list | None = None  # the span being built: its row's values in column order
        self._open_signature: tuple | None = None  # its plans' batch (a merge needs the same)
        self._open_first: tuple | None = None  # its first step's (ledger, duration)
        self._open_ledger: list[float] | None = None  # per ledger name: sum of value x step time
        self._open_mergeable = False
        #: closed rows not yet in the typed columns, and how many values each holds (from the first)
        self._step_rows: list[list] = []
        self._num_columns: int | None = None
        self._open_refusal: list | None = None
        self._wall_start_s = time.perf_counter()
        #: request id -> its EVENT_COLUMNS counts, from the plans' preemptions and swaps
        self._events: dict[int, dict[str, int]] = {}
        self._measured = False  # a real run's results carry predictions: MEASURED_COLUMNS are written
        self._maps = False  # the allocator maps pages: MAP_COLUMNS are written
        #: the ledger's group parts (a model with several KV-cache groups), from the first plan
        self._group_names: tuple[str, ...] | None = None
        #: what a span's time-weighted means cover: the ledger's fields, then its group parts
        self._ledger_names: tuple[str, ...] = LEDGER_FIELDS
        #: and where they go in its row
        self._ledger_at: tuple[int, ...] = _LEDGER_AT
        self._map_at = _MEASURED_AT  # where MAP_COLUMNS start: after a real run's MEASURED_COLUMNS

    def record(self, plan: StepPlan, result: StepResult, any_seq_finished: bool) -> None:
        """One plan (a step, or a run of quiet steps) and what the executor said it took."""
        if plan.preemptions or plan.swap_in:
            self._count_events(plan)
        durations = result.durations_s
        num_steps = plan.num_steps
        kv_read_tokens = num_steps * plan.kv_read_tokens + len(plan.decodes) * num_steps * (num_steps - 1) // 2
        quiet = plan.is_quiet
        led = plan.ledger
        token_max, allocated_max = led.token_bytes, led.allocated_bytes
        row = self._open
        if row is not None and quiet and self._open_mergeable and plan.signature == self._open_signature:
            row[_NUM_STEPS] += num_steps
            row[_COMPUTED] += plan.num_computed_tokens
            row[_KV_READ] += float(kv_read_tokens * self.kv_bytes_per_token)
            row[_DURATION] = added_in_order(row[_DURATION], durations)
            row[_DECODE] = added_in_order(row[_DECODE], durations)
            if result.predicted_s is not None:
                row[_MEASURED_AT] = added_in_order(row[_MEASURED_AT], durations)
                row[_MEASURED_AT + 1] += result.predicted_s
            if self._open_refusal is not None:
                self._open_refusal[2] += num_steps
            if plan.page_mapping is not None:
                for i, value in enumerate(_page_map_amounts(plan, result), self._map_at):
                    row[i] += value
            self._add_ledgers(plan, durations)
        else:
            self._flush()
            row = self._open = self._row(plan, result, kv_read_tokens, allocated_max)
            self._open_signature = plan.signature
            self._open_refusal = self._refusal_row(plan)
            self._open_first = (led, durations[0])
            self._open_ledger = None
            if num_steps > 1:
                self._add_ledgers(plan, durations)
        self._open_mergeable = quiet and not any_seq_finished
        if num_steps > 1:
            spans = plan.span_ledgers
            token, future, internal = spans["token_bytes"], spans["reserved_future_bytes"], spans["internal_bytes"]
            # the states held (MemoryLedger.allocated_bytes counts them): decoding never changes them
            state = led.state_bytes
            if isinstance(token, list):  # a short projection, in plain integers
                token_max = max(token_max, max(token))
                allocated_max = max(allocated_max, max(map(sum, zip(token, future, internal))) + state)
            else:
                token_max = max(token_max, int(token.max()))
                allocated_max = max(allocated_max, int((token + future + internal).max()) + state)
        if token_max > row[_TOKEN_MAX]:
            row[_TOKEN_MAX] = token_max
        if allocated_max > row[_ALLOCATED_MAX]:
            row[_ALLOCATED_MAX] = allocated_max
        if plan.num_shared_blocks > row[_SHARED_BLOCKS]:
            row[_SHARED_BLOCKS] = plan.num_shared_blocks
        if allocated_max + plan.shared_bytes_saved > row[_UNSHARED_MAX]:
            row[_UNSHARED_MAX] = allocated_max + plan.shared_bytes_saved

    def _add_ledgers(self, plan: StepPlan, durations) -> None:
        """Add the plan's steps to the open span's sums of ledger value x step time, in step order
        (one vectorized pass over every field: each field's sum is still added step by step)."""
        if self._open_ledger is None:  # the span's first step, added now that it has company
            first, first_s = self._open_first
            self._open_ledger = [0.0 + value * first_s for value in _ledger_values(first)]
            if plan.ledger is first:  # a plan that is a run of steps: its first step was just added
                self._open_ledger = _add_span(self._open_ledger, plan.span_ledgers, durations[1:], self._ledger_names)
                return
        totals = [total + value * durations[0] for total, value in zip(self._open_ledger, _ledger_values(plan.ledger))]
        if plan.num_steps > 1:
            totals = _add_span(totals, plan.span_ledgers, durations[1:], self._ledger_names)
        self._open_ledger = totals

    def finish(self, groups: Iterable[SequenceGroup] = ()) -> RunRecord:
        """The run's tables (``groups``: finished requests not recorded yet). ``loop_wall_s`` is the
        loop's wall time, from the recorder's start (just before the first request is made) up to
        here, the last rows stored or sent to the step sink: building the tables comes after, as
        writing its outputs does in other simulators. ``sim_wall_s`` is that less the time spent
        :meth:`outside_loop`."""
        self._flush()
        self._store_step_rows()
        if self._step_sink is not None and not self._batches_sunk:  # no row: the sink still learns the columns
            self._sink_step_rows([])
        for group in groups:
            self.record_request(group)
        self._store_request_rows()
        loop_wall_s = time.perf_counter() - self._wall_start_s
        sim_wall_s = loop_wall_s - self._outside_s
        names = self._column_names()
        # the table's columns are the typed arrays' own memory (no second copy at the peak)
        steps = (
            ColumnTable({name: _as_numpy(self._columns[name]) for name in names}) if self._step_sink is None else None
        )
        self._columns.clear()
        by_column = list(zip(*self._refusals)) or [()] * len(REFUSAL_COLUMNS)
        refusals = ColumnTable(dict(zip(REFUSAL_COLUMNS, by_column, strict=True)))
        rows = self._request_columns
        # in request order, whatever order they finished in
        order = np.argsort(_as_numpy(rows["request_id"]), kind="stable")
        # each column freed once its sorted copy is made: one column held twice at a time, not the
        # whole table (184 MB of a million requests' rows)
        table = {name: _as_numpy(rows.pop(name))[order] for name in list(rows)}
        if not len(order):  # no request: empty float columns, as an empty table always had
            table = {name: np.array([]) for name in GROUP_COLUMNS}
        none = dict.fromkeys(EVENT_COLUMNS, 0)
        counted = [self._events.get(request_id, none) for request_id in table["request_id"].tolist()]
        for name in EVENT_COLUMNS:
            table[name] = np.array([c[name] for c in counted], dtype=np.int64)
        requests = ColumnTable({name: table[name] for name in REQUEST_COLUMNS})
        return RunRecord(requests, steps, refusals, sim_wall_s, loop_wall_s)

    def record_request(self, group: SequenceGroup) -> None:
        """A finished request, whose row of the request table is written with the next batch of
        them (the run need not keep its group after that)."""
        finished = self._finished
        finished.append(group)
        if len(finished) >= REQUEST_ROWS_BATCH:
            self._store_request_rows()

    def _store_request_rows(self) -> None:
        """The held requests' rows into the typed columns, a column at a time. Building the
        request table, not the loop: its time is left out of ``sim_wall_s``."""
        with self.outside_loop():
            rows = [group.row() for group in self._finished]
            for group in self._finished:
                group.seqs = []  # no cycle left (sequence <-> group): freed as soon as unreferenced
            self._finished.clear()
            for values, column in zip(self._request_columns.values(), zip(*rows)):
                _extend(values, column)

    @contextlib.contextmanager
    def outside_loop(self) -> Iterator[None]:
        """Time spent here (making requests, building the request table) is not the loop's."""
        start_s = time.perf_counter()
        try:
            yield
        finally:
            self._outside_s += time.perf_counter() - start_s

    def _count_events(self, plan: StepPlan) -> None:
        """Add the plan's preemptions and swaps to their requests' EVENT_COLUMNS counts."""
        for p in plan.preemptions:
            counts = self._counts(p.group.request_id)
            counts["num_preemptions"] += 1
            if p.mechanism == Mechanism.SWAP:
                counts["num_swap_preemptions"] += 1
                counts["swap_out_bytes"] += p.swap_out_bytes
            else:  # a swap that fell back is a recompute
                counts["num_recompute_preemptions"] += 1
                counts["num_swap_fallbacks"] += p.fell_back
        for request_id, transfer in zip(plan.swap_in_request_ids, plan.swap_in, strict=True):
            self._counts(request_id)["swap_in_bytes"] += transfer.num_bytes

    def _counts(self, request_id: int) -> dict[str, int]:
        return self._events.setdefault(request_id, dict.fromkeys(EVENT_COLUMNS, 0))

    # --- internals -------------------------------------------------------------------------------

    def _row(self, plan: StepPlan, result: StepResult, kv_read_tokens: int, allocated_bytes: int) -> list:
        """A new row's values in column order (``allocated_bytes``: the plan's ledger's)."""
        preemptions, prefills, copies = plan.preemptions, plan.prefills, plan.copies
        led = plan.ledger
        duration_s = added_in_order(0.0, result.durations_s)
        row = [
            plan.step,
            plan.num_steps,
            plan.start_s,
            duration_s,
            plan.num_running,
            len(plan.decodes),
            len({id(c.seq) for c in prefills}) if prefills else 0,  # num_prefill_seqs
            plan.num_prefill_tokens,
            plan.num_waiting,
            plan.num_swapped,
            plan.refusal is not None or bool(preemptions),  # saturated
            len(preemptions),
            sum(p.mechanism == Mechanism.SWAP for p in preemptions) if preemptions else 0,
            sum(p.fell_back for p in preemptions) if preemptions else 0,
            len(plan.forks),
            len(copies),
            sum(c.num_bytes for c in copies) if copies else 0,
            sum(t.num_bytes for t in plan.swap_out) if plan.swap_out else 0,
            sum(t.num_bytes for t in plan.swap_in) if plan.swap_in else 0,
            result.prefill_s,
            result.decode_s,
            result.swap_s,
            result.copy_s,
            result.recompute_s,
            # a float: a long run reads more than int64 holds (10^8 decode steps of a large batch);
            # exact as long as the total stays below 2^53 bytes
            float(kv_read_tokens * self.kv_bytes_per_token),
            plan.num_computed_tokens,
            sum(c.num_recomputed_tokens for c in prefills) if prefills else 0,
            *_LEDGER_FIELD_VALUES(led),
            led.token_bytes,  # token_bytes_max
            allocated_bytes,  # allocated_bytes_max
            plan.num_shared_blocks,
            allocated_bytes + plan.shared_bytes_saved,  # unshared_bytes_max
        ]
        # a run's optional columns, in _column_names' order (every row of a run has the same)
        if result.predicted_s is not None:
            self._measured = True
            self._map_at = _MEASURED_AT + len(MEASURED_COLUMNS)
            row += (duration_s, result.predicted_s)
        if plan.page_mapping is not None:
            self._maps = True
            row += _page_map_amounts(plan, result)
        if led.group_bytes:
            if self._group_names is None:
                self._group_names = tuple(name for name, _ in led.group_bytes)
                self._ledger_names = LEDGER_FIELDS + self._group_names
                self._ledger_at = _LEDGER_AT + tuple(range(len(row), len(row) + len(self._group_names)))
            row += (value for _, value in led.group_bytes)
        return row

    def _refusal_row(self, plan: StepPlan) -> list | None:
        refusal = plan.refusal
        if refusal is None:
            return None
        row = [
            plan.step,
            plan.start_s,
            plan.num_steps,
            refusal.group.request_id,
            refusal.reason.value,
            refusal.reservation_bytes,
            refusal.free_bytes,
            refusal.largest_hole_bytes,
        ]
        self._refusals.append(row)
        return row

    def _flush(self) -> None:
        row = self._open
        if row is None:
            return
        if row[_NUM_STEPS] > 1:  # a span: its ledger is the time-weighted mean over its steps
            duration_s = row[_DURATION]
            for i, total in zip(self._ledger_at, self._open_ledger):
                row[i] = total / duration_s
        if self._num_columns is None:  # the first row says which optional columns the run has
            self._num_columns = len(self._column_names())
        if len(row) != self._num_columns:  # a plugin's plans changed shape mid-run
            raise RuntimeError(f"a step row has {len(row)} values, the run's first had {self._num_columns}")
        self._step_rows.append(row)
        if len(self._step_rows) >= STEP_ROWS_BATCH:
            self._store_step_rows()
        self._open = None

    def _column_names(self) -> list[str]:
        """The step table's columns: STEP_COLUMNS, then those of a real run, of an allocator that
        maps pages and of a model with several KV-cache groups (each run has them in every row)."""
        names = list(STEP_COLUMNS) + (list(MEASURED_COLUMNS) if self._measured else [])
        names += list(MAP_COLUMNS) if self._maps else []
        names += list(self._group_names or ())
        for name in names:
            if name not in self._columns:
                self._columns[name] = array("q" if name == "pages_mapped" else "d")
        return names

    def _store_step_rows(self) -> None:
        """The held rows into the typed columns, a column at a time (or to the step sink)."""
        if not self._step_rows:
            return
        if self._step_sink is not None:
            self._sink_step_rows(self._step_rows)
        else:
            columns = [self._columns[name] for name in self._column_names()]
            for column, values in zip(columns, zip(*self._step_rows)):
                _extend(column, values)
        self._step_rows.clear()

    def _sink_step_rows(self, rows: list[list]) -> None:
        """``rows`` to the step sink as numpy columns of the table's types. What the sink does with
        them (writing files, adding up the summary) is not the loop's: its time is left out of
        ``sim_wall_s``, as building the tables is."""
        names = self._column_names()
        values = zip(*rows) if rows else [()] * len(names)
        batch = {
            name: np.array(column, dtype=_NUMPY_TYPES[self._columns[name].typecode])
            for name, column in zip(names, values)
        }
        with self.outside_loop():
            self._step_sink(batch)
        self._batches_sunk += 1
