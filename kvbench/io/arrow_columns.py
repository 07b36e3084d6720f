"""numpy columns to Arrow arrays and back, without pandas.

pyarrow's own conversions (``pa.array(ndarray)``, ``Array.to_numpy()``) import pandas to ask
whether their argument is a pandas object, and importing pandas is most of what a run that
writes its tables would otherwise import (:mod:`kvbench.io.table`). Arrow's columns are plain
buffers, so a run's columns are wrapped as they are: numbers and bools as their values' buffer
(bools packed into bits, as Arrow holds them), text as UTF-8 bytes and offsets, a column of None
only as Arrow's null type. The same arrays come out as ``pa.array`` makes them (the tests compare
them), and so the same Parquet bytes. Any other column (a real run's lists of token ids) is left
to ``pa.array``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa


def _bits(flags: np.ndarray) -> pa.Buffer:
    """Booleans as Arrow's bitmap: bit i of byte i // 8, least significant first."""
    return pa.py_buffer(np.packbits(flags, bitorder="little"))


def arrow_array(values: np.ndarray) -> pa.Array:
    """One column as an Arrow array (its memory shared where Arrow holds it the same way)."""
    kind = values.dtype.kind
    if kind in "iuf":
        values = np.ascontiguousarray(values)
        return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])
    if kind == "b":
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, _bits(values)])
    texts = values.tolist() if kind == "O" else None
    if texts is not None and all(value is None or isinstance(value, str) for value in texts):
        if all(text is None for text in texts):  # (as pyarrow types an empty object column too)
            return pa.nulls(len(texts))
        valid = np.array([text is not None for text in texts], dtype=bool)
        encoded = [text.encode("utf-8") if text is not None else b"" for text in texts]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        validity = None if valid.all() else _bits(valid)
        return pa.Array.from_buffers(
            pa.string(), len(texts), [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
        )
    return pa.array(values)  # anything else (lists, mixed objects): pyarrow's own conversion


def arrow_table(names: Sequence[str], columns: Sequence[np.ndarray]) -> pa.Table:
    """Named numpy columns as an Arrow table."""
    return pa.Table.from_arrays([arrow_array(values) for values in columns], names=list(names))


def numpy_values(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric or bool Arrow column without nulls as a numpy array (a copy where it has several
    chunks or is bits); any other column through pyarrow's own conversion."""
    if isinstance(array, pa.ChunkedArray):
        chunks = [numpy_values(chunk) for chunk in array.chunks]
        if chunks:
            return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        return np.empty(0, dtype=_numpy_dtype(array.type))
    kind = array.type
    if len(array) == 0 and (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        return np.empty(0, dtype=_numpy_dtype(kind))  # (an empty array may have no data buffer)
    if array.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        dtype = _numpy_dtype(kind)
        data = array.buffers()[1]
        return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
    if array.null_count == 0 and pa.types.is_boolean(kind):
        bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little", count=array.offset + len(array))[array.offset :].astype(bool)
    return array.to_numpy(zero_copy_only=False)


def _numpy_dtype(kind: pa.DataType) -> np.dtype:
    return np.dtype(kind.to_pandas_dtype())
