"""kvbench.io.arrow_columns: numpy columns to Arrow and back as pyarrow's own conversions do, without
importing pandas (pyarrow's do)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.io.arrow_columns import arrow_array, arrow_table, numpy_values


def _parquet_bytes(array: pa.Array) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_arrays([array], names=["x"]), sink)
    return sink.getvalue().to_pybytes()


TEXTS = st.lists(st.one_of(st.none(), st.text(max_size=12)), max_size=30)


@pytest.mark.parametrize(
    "values",
    [
        np.array([0.0, -0.0, 1.5, np.nan, np.inf, 5e-324]),
        np.arange(-3, 20, dtype=np.int64),
        np.arange(11, dtype=np.int32),
        np.array([0, 2**64 - 1], dtype=np.uint64),
        np.array([True, False, True, True, False, False, False, False, True, True, False]),
        np.arange(20, dtype=np.float64)[::3],  # not contiguous
        np.array([], dtype=np.float64),
        np.array([], dtype=bool),
    ],
    ids=["float64", "int64", "int32", "uint64", "bool", "strided", "empty_float", "empty_bool"],
)
def test_numbers_and_bools_are_the_arrays_pyarrow_makes(values):
    array = arrow_array(values)
    # the same Parquet bytes (NaN equals nothing, so Array.equals cannot say it)
    assert _parquet_bytes(array) == _parquet_bytes(pa.array(values))
    assert array.type == pa.array(values).type and array.null_count == 0
    assert np.array_equal(numpy_values(array), values, equal_nan=values.dtype.kind == "f")
    assert numpy_values(array).dtype == values.dtype


@settings(max_examples=60, deadline=None)
@given(TEXTS)
def test_text_and_none_are_the_arrays_pyarrow_makes(texts):
    values = np.empty(len(texts), dtype=object)
    values[:] = texts
    array = arrow_array(values)
    expected = pa.array(texts, type=pa.null() if all(t is None for t in texts) else pa.string())
    assert array.type == expected.type and array.to_pylist() == texts
    assert _parquet_bytes(array) == _parquet_bytes(expected)


def test_a_slice_and_a_chunked_column_read_back():
    values = np.arange(40, dtype=np.int64)
    flags = np.arange(40) % 3 == 0
    assert numpy_values(arrow_array(values).slice(5, 20)).tolist() == list(range(5, 25))
    assert numpy_values(arrow_array(flags).slice(5, 20)).tolist() == flags[5:25].tolist()
    chunked = pa.chunked_array([arrow_array(values[:10]), arrow_array(values[10:])])
    assert numpy_values(chunked).tolist() == values.tolist()
    assert numpy_values(pa.chunked_array([], type=pa.float64())).dtype == np.float64
    assert numpy_values(pa.array([], type=pa.int64())).dtype == np.int64  # no data buffer to read


def test_a_table_and_lists_of_token_ids():
    ids = np.empty(2, dtype=object)
    ids[:] = [[1, 2], [3]]
    table = arrow_table(["x", "ids"], [np.array([1.0, 2.0]), ids])
    assert table.column_names == ["x", "ids"] and table.column("ids").to_pylist() == [[1, 2], [3]]


def test_nothing_here_imports_pandas():
    code = (
        "import sys, numpy as np\n"
        "from kvbench.io.arrow_columns import arrow_table, numpy_values\n"
        "names = np.empty(2, dtype=object); names[:] = ['a', None]\n"
        "t = arrow_table(['x', 'b', 'name'], [np.arange(2.0), np.array([True, False]), names])\n"
        "numpy_values(t.column('x')); numpy_values(t.column('b'))\n"
        "print('pandas' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"
