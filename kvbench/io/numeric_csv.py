"""A numeric table's CSV: byte for byte what ``DataFrame.to_csv(index=False)`` writes, in under
half its time.

pandas turns every value into text through numpy (``astype(str)``, about 1.5 us a float on a
2-core x86_64 machine): the steps table of a 100,000-request run (270,000 rows x 37 columns) took
5.6-7.8 s to write as CSV, more than the rest of what follows the run's loop. The text itself is
Python's: numpy prints a float64 as the shortest digits that read back to the same double, with
the same switch to exponent notation as ``float.__repr__``, and an integer or a bool as ``str``
does. So this writer formats with ``float.__repr__`` and ``int.__repr__`` (less than half the
time), formats a column that repeats few values (most of a steps table: counts, zero swap times,
an unchanged ledger) once per distinct value, and joins the rows itself. NaN is written as an
empty field, as pandas writes it. ``benchmarks/csv_writing.py`` measures both writers on the same
tables, and the tests compare the two files byte for byte.

Only plain numeric columns are handled (float64, signed and unsigned integers, bool); a table with
any other column (text, dates, float32, pandas' nullable types) is left to pandas.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from kvbench.io.table import ColumnTable

#: rows formatted at a time: about 150,000 short strings (8 MB) for a 37-column steps table, so
#: that writing a long run's table adds little to its peak memory
CHUNK_ROWS = 4096


def writes_numeric_csv(frame: pd.DataFrame) -> bool:
    """Whether :func:`write_numeric_csv` can write ``frame``: string column names and only
    float64, integer and bool columns (at least one)."""
    if frame.shape[1] == 0 or not all(isinstance(name, str) for name in frame.columns):
        return False
    return all(dtype == np.float64 or (isinstance(dtype, np.dtype) and dtype.kind in "iub") for dtype in frame.dtypes)


def write_numeric_csv(frame: pd.DataFrame, path: Path) -> None:
    """``frame.to_csv(path, index=False)``'s bytes (``writes_numeric_csv(frame)`` must hold)."""
    columns = [frame.iloc[:, i].to_numpy() for i in range(frame.shape[1])]
    with open(path, "w", encoding="utf-8", newline="") as out:
        write_header(out, frame.columns)
        write_rows(out, columns)


def write_table_csv(table: ColumnTable, path: Path) -> None:
    """``table.to_pandas().to_csv(path, index=False)``'s bytes, without pandas: numeric columns as
    :func:`write_rows` writes them, text as itself, None as an empty field (pandas' na_rep),
    through the csv module as pandas' writer does (it quotes a field only where it must)."""
    names = table.columns
    columns = [table[name] for name in names]
    if not columns or not all(values.dtype == np.float64 or values.dtype.kind in "iubO" for values in columns):
        table.to_pandas().to_csv(path, index=False)  # no column, or floats of another width: pandas' text
        return
    with open(path, "w", encoding="utf-8", newline="") as out:
        write_header(out, names)
        if all(values.dtype.kind in "iubf" for values in columns):
            if len(table):
                write_rows(out, columns)
            return
        writer = csv.writer(out, lineterminator=os.linesep)
        writer.writerows(
            zip(*(_texts(values) if values.dtype.kind in "iubf" else _object_texts(values) for values in columns))
        )


def _object_texts(values: np.ndarray) -> list[str]:
    """An object column's values as pandas writes them: None and NaN as empty fields, the rest as
    ``str`` makes them."""
    return [
        "" if value is None or (isinstance(value, float) and value != value) else str(value)
        for value in values.tolist()
    ]


def write_header(out: TextIO, names: Iterable[str]) -> None:
    """The header line as pandas writes it: its csv writer, minimal quoting, the platform's line end
    (``out`` opened with ``newline=""``)."""
    csv.writer(out, lineterminator=os.linesep).writerow(names)


def write_rows(out: TextIO, columns: Sequence[np.ndarray]) -> None:
    """The rows of ``columns`` (numpy arrays of one length, each float64, integer or bool) as
    ``to_csv`` writes them after its header: a table written a batch of rows at a time is the
    same file as the whole table written at once."""
    for start in range(0, len(columns[0]), CHUNK_ROWS):
        texts = [_texts(values[start : start + CHUNK_ROWS]) for values in columns]
        if len(texts) == 1:  # a row of one empty field (NaN) is quoted, as the csv module quotes it:
            texts[0] = [text or '""' for text in texts[0]]  # a bare empty line would read as no row
        out.write(os.linesep.join(map(",".join, zip(*texts))))
        out.write(os.linesep)


def _texts(values: np.ndarray) -> list[str]:
    """Each value as pandas writes it in a CSV."""
    kind = values.dtype.kind
    fmt = float.__repr__ if kind == "f" else int.__repr__ if kind in "iu" else str
    # floats told apart by their bits: 0.0 and -0.0 are equal but print differently
    keys = values.view(np.int64) if kind == "f" else values
    distinct, inverse = np.unique(keys, return_inverse=True)
    if kind == "f":
        distinct = distinct.view(np.float64)
    repeats = 2 * len(distinct) <= len(values)
    # few distinct values: each formatted once, then looked up; else each value formatted in turn
    texts = list(map(fmt, (distinct if repeats else values).tolist()))
    if kind == "f":
        for i in np.flatnonzero(np.isnan(distinct if repeats else values)).tolist():
            texts[i] = ""  # pandas' na_rep
    return list(map(texts.__getitem__, inverse.ravel().tolist())) if repeats else texts
