"""A run's table as named numpy columns of one length: what the run path builds, summarizes, writes
and draws, without pandas.

Importing pandas (which loads pyarrow's compute kernels) cost a run time and memory for tables it
only adds up, writes and draws: without it a 1-request run took 1.10 s instead of 1.35 s and
100,000 requests peaked at 178 MB instead of 208 MB (``benchmarks/peak_memory.py``, paired runs on
a 2-core x86_64 machine: ``benchmarks/results/peak_memory-2026-12-05c/``). A
:class:`ColumnTable` does those with numpy; :meth:`ColumnTable.to_pandas` gives the same table as a
DataFrame (the columns' own memory, no copy) where a user asks for one (``RunResult.requests``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def _column(values: Any) -> np.ndarray:
    """``values`` as a 1-D numpy array; text (and anything numpy would not hold as numbers) as an
    object array of the values themselves, as pandas holds it."""
    if isinstance(values, np.ndarray):
        array = values
    else:
        values = list(values)
        if values and all(_is_number(v) for v in values):
            array = np.asarray(values)
        else:  # one by one: a value that is itself a list (a real run's token ids) stays one value
            array = np.empty(len(values), object)
            for i, value in enumerate(values):
                array[i] = value
    if array.dtype.kind in "US":  # numpy's fixed-width text: pandas holds text as objects
        array = array.astype(object)
    if array.ndim != 1:
        raise ValueError(f"a table's column must be one-dimensional, not of shape {array.shape}")
    return array


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating))


class ColumnTable:
    """Columns by name, in order, each a 1-D numpy array of the table's length. Indexing by a name
    gives the column; by a boolean array, the rows where it holds (a new table). As a DataFrame
    does, ``len`` counts rows and iterating gives the column names."""

    def __init__(self, columns: Mapping[str, Any] | None = None) -> None:
        self._columns: dict[str, np.ndarray] = {}
        for name, values in (columns or {}).items():
            self[name] = values

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ColumnTable:
        """A one-row table (a run's summary): each value's column typed as ``pd.DataFrame([row])``
        types it (a bool, an int64, a float64, an object for text and None)."""
        return cls({name: [value] for name, value in row.items()})

    @classmethod
    def from_pandas(cls, frame: pd.DataFrame) -> ColumnTable:
        """A DataFrame's columns (its own memory where pandas holds them as numpy arrays)."""
        return cls({str(name): frame[name].to_numpy() for name in frame.columns})

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        """The number of rows (as ``len(DataFrame)``), not of columns."""
        return len(next(iter(self._columns.values()))) if self._columns else 0

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    def __getitem__(self, key: str | np.ndarray) -> Any:
        if isinstance(key, str):
            return self._columns[key]
        mask = np.asarray(key)
        if mask.dtype != bool or mask.shape != (len(self),):
            raise TypeError("a table is indexed by a column's name or by a boolean array of its length")
        return ColumnTable({name: values[mask] for name, values in self._columns.items()})

    def __setitem__(self, name: str, values: Any) -> None:
        column = _column(values)
        if self._columns and name not in self._columns and len(column) != len(self):
            raise ValueError(f"column {name!r} has {len(column)} values for a table of {len(self)} rows")
        self._columns[name] = column

    def get(self, name: str, default: Any = None) -> Any:
        return self._columns.get(name, default)

    def every(self, step: int) -> ColumnTable:
        """Every ``step``-th row from the first (views, not copies)."""
        return self if step <= 1 else ColumnTable({name: values[::step] for name, values in self._columns.items()})

    def select(self, names: Sequence[str]) -> ColumnTable:
        """Those of ``names`` the table has, in that order."""
        return ColumnTable({name: self._columns[name] for name in names if name in self._columns})

    def to_pandas(self) -> pd.DataFrame:
        """The table as a DataFrame, on the same memory (``copy=False``)."""
        import pandas as pd

        return pd.DataFrame(dict(self._columns), columns=self.columns, copy=False)

    def __repr__(self) -> str:
        return f"ColumnTable({len(self)} rows: {', '.join(self._columns)})"


def as_table(table: ColumnTable | pd.DataFrame) -> ColumnTable:
    """A ColumnTable, or a DataFrame's columns as one (the run path's functions take either)."""
    return table if isinstance(table, ColumnTable) else ColumnTable.from_pandas(table)
