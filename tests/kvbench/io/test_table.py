"""kvbench.io.table: a run's tables as numpy columns, typed and indexed as pandas would."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from summary_row import SUMMARY_ROW

from kvbench.io.table import ColumnTable, as_table


def test_a_row_is_typed_as_a_one_row_dataframe_types_it():
    table = ColumnTable.from_row(SUMMARY_ROW)
    frame = pd.DataFrame([SUMMARY_ROW])
    assert len(table) == 1 and table.columns == list(SUMMARY_ROW)
    for name in SUMMARY_ROW:
        expected = frame[name].to_numpy()
        assert (
            (table[name].dtype == object)
            if expected.dtype.kind in "OU" or str(frame[name].dtype) == "str"
            else (table[name].dtype == expected.dtype)
        ), name
    assert table["allocator"].tolist() == ["paged"] and table["calibration"].tolist() == [None]


def test_a_column_is_indexed_by_name_and_rows_by_a_boolean_mask():
    table = ColumnTable({"request_id": np.arange(5), "finish_s": [1.0, -1.0, 2.0, -1.0, 3.0]})
    assert len(table) == 5 and "finish_s" in table and "admitted_s" not in table
    assert list(table) == ["request_id", "finish_s"]
    done = table[table["finish_s"] >= 0]
    assert done["request_id"].tolist() == [0, 2, 4] and len(done) == 3
    assert table.every(2)["request_id"].tolist() == [0, 2, 4]
    assert table.select(["finish_s", "missing"]).columns == ["finish_s"]
    assert table.get("missing") is None


def test_bad_indexing_and_a_column_of_another_length_are_refused():
    table = ColumnTable({"a": np.arange(3)})
    with pytest.raises(TypeError, match="boolean array of its length"):
        table[np.array([0, 1])]
    with pytest.raises(TypeError, match="boolean array of its length"):
        table[np.array([True, False])]
    with pytest.raises(ValueError, match="has 2 values for a table of 3 rows"):
        table["b"] = [1, 2]
    with pytest.raises(ValueError, match="one-dimensional"):
        ColumnTable({"a": np.zeros((2, 2))})


def test_a_column_of_lists_holds_each_list_as_one_value():
    table = ColumnTable({"request_id": [0, 1]})
    table["output_token_ids"] = [[[1, 2, 3]], [[4], [5, 6]]]
    assert table["output_token_ids"].dtype == object
    assert table["output_token_ids"][1] == [[4], [5, 6]]


def test_to_pandas_shares_the_columns_and_as_table_reads_a_frame_back():
    values = np.arange(4, dtype=np.float64)
    table = ColumnTable({"x": values, "name": ["a", "b", None, "d"]})
    frame = table.to_pandas()
    assert list(frame.columns) == ["x", "name"] and len(frame) == 4
    assert np.shares_memory(frame["x"].to_numpy(), values)
    back = as_table(frame)
    assert back.columns == ["x", "name"] and back["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert as_table(table) is table
