"""kvbench's CSV writer for numeric tables: the bytes pandas' ``to_csv(index=False)`` writes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from summary_row import SUMMARY_ROW

from kvbench.api import run
from kvbench.io import numeric_csv
from kvbench.io.atomic import write_csv
from kvbench.io.numeric_csv import write_numeric_csv, writes_numeric_csv

# floats as a run's tables hold them, and the awkward ones: NaN (written empty), infinities, -0.0,
# subnormals, the bounds where the text switches to exponent notation, integral values
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e16, 9999999999999998.0, 1e-4, 9.999999999999999e-05, 5e-324, 62075699200.0]),
    st.integers(-(2**53), 2**53).map(float),
)
COLUMNS = {
    "float64": (np.float64, FLOATS),
    "int64": (np.int64, st.integers(-(2**63), 2**63 - 1)),
    "uint64": (np.uint64, st.integers(0, 2**64 - 1)),
    "int32": (np.int32, st.integers(-(2**31), 2**31 - 1)),
    "bool": (np.bool_, st.booleans()),
}


@st.composite
def numeric_frames(draw):
    num_rows = draw(st.integers(0, 24))
    kinds = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=5))
    data = {}
    for i, kind in enumerate(kinds):
        dtype, values = COLUMNS[kind]
        # a few distinct values repeated (a steps table's counts) or all drawn (its times)
        pool = draw(st.lists(values, min_size=1, max_size=3 if draw(st.booleans()) else max(num_rows, 1)))
        column = [draw(st.sampled_from(pool)) for _ in range(num_rows)]
        data[f"{kind}_{i}"] = np.array(column, dtype=dtype)
    return pd.DataFrame(data)


@settings(max_examples=300, deadline=None)
@given(frame=numeric_frames(), chunk_rows=st.integers(1, 8))
# a one-column row that is NaN: the csv module quotes the empty field, so that it reads as a row
@example(frame=pd.DataFrame({"x": [np.nan, 1.0, np.nan]}), chunk_rows=2)
@example(frame=pd.DataFrame({"x": [np.nan], "y": [np.nan]}), chunk_rows=1)
def test_writes_the_bytes_pandas_writes(tmp_path_factory, frame, chunk_rows):
    folder = tmp_path_factory.mktemp("csv")
    assert writes_numeric_csv(frame)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(numeric_csv, "CHUNK_ROWS", chunk_rows)  # rows split across several chunks
        write_numeric_csv(frame, folder / "kvbench.csv")
    frame.to_csv(folder / "pandas.csv", index=False)
    assert (folder / "kvbench.csv").read_bytes() == (folder / "pandas.csv").read_bytes()


def test_a_runs_tables_are_written_as_pandas_writes_them(tmp_path):
    result = run(["workload.num_requests=40", "workload.rate_per_s=20", "progress=false", "wandb.mode=disabled"])
    for name, frame in (("steps", result.steps), ("requests", result.requests)):
        assert writes_numeric_csv(frame), name
        write_csv(frame, tmp_path / f"{name}.csv")
        frame.to_csv(tmp_path / f"{name}.pandas.csv", index=False)
        assert (tmp_path / f"{name}.csv").read_bytes() == (tmp_path / f"{name}.pandas.csv").read_bytes(), name


@pytest.mark.parametrize(
    "frame",
    [
        pd.DataFrame({"reason": ["no_memory"], "n": [1]}),  # text
        pd.DataFrame({"x": np.array([0.1], dtype=np.float32)}),  # float32 prints its own shortest digits
        pd.DataFrame({"x": pd.array([1, None], dtype="Int64")}),  # pandas' nullable integers
        pd.DataFrame({"x": pd.array([1.5, None], dtype="Float64")}),  # and nullable floats
        pd.DataFrame({"t": pd.to_datetime(["2026-12-03"])}),
        pd.DataFrame({0: [1.5]}),  # a column name that is not text
        pd.DataFrame(index=range(3)),  # no column
    ],
    ids=["text", "float32", "nullable_int", "nullable_float", "datetime", "int_name", "no_columns"],
)
def test_other_tables_are_left_to_pandas(tmp_path, frame):
    assert not writes_numeric_csv(frame)
    write_csv(frame, tmp_path / "out.csv")
    frame.to_csv(tmp_path / "pandas.csv", index=False)
    assert (tmp_path / "out.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_a_float_format_is_left_to_pandas(tmp_path):
    frame = pd.DataFrame({"x": [math.pi, 1.0]})
    write_csv(frame, tmp_path / "out.csv", "%.10g")
    assert (tmp_path / "out.csv").read_text().splitlines() == ["x", "3.141592654", "1"]


# --- a run's tables without pandas: kvbench.io.numeric_csv.write_table_csv ----------------------------


def _pandas_csv(frame: pd.DataFrame, tmp_path) -> bytes:
    path = tmp_path / "pandas.csv"
    frame.to_csv(path, index=False)
    return path.read_bytes()


def test_a_summary_row_is_written_as_pandas_writes_it(tmp_path):
    from kvbench.io.numeric_csv import write_table_csv
    from kvbench.io.table import ColumnTable

    write_table_csv(ColumnTable.from_row(SUMMARY_ROW), tmp_path / "ours.csv")
    assert (tmp_path / "ours.csv").read_bytes() == _pandas_csv(pd.DataFrame([SUMMARY_ROW]), tmp_path)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**6), FLOATS, st.one_of(st.none(), st.sampled_from(["fragmented", "too large", ""]))
        ),
        max_size=12,
    )
)
def test_a_table_with_a_text_column_is_written_as_pandas_writes_it(tmp_path_factory, rows):
    from kvbench.io.numeric_csv import write_table_csv
    from kvbench.io.table import ColumnTable

    tmp_path = tmp_path_factory.mktemp("csv")
    columns = dict(zip(("request_id", "free_s", "reason"), map(list, zip(*rows)))) if rows else {}
    table = ColumnTable(columns or {"request_id": [], "free_s": [], "reason": []})
    write_table_csv(table, tmp_path / "ours.csv")
    assert (tmp_path / "ours.csv").read_bytes() == _pandas_csv(table.to_pandas(), tmp_path)
