"""The step table written to its files while the run goes, a batch of rows at a time.

A run of a million requests makes millions of step rows (about 300 bytes each): held until the
end, the table alone would be most of the run's memory. :class:`StepFiles` is the recorder's step
sink instead: each batch of rows is appended to ``steps.parquet`` (one row group per batch) under a
temporary name, and :meth:`StepFiles.commit`, when the run has finished, writes ``steps.csv`` from
that file a row group at a time and renames both into place. Nothing reads the CSV before the run
is over, and turning numbers into text is most of what writing the step table costs: written in the
loop, it was loop time (``benchmarks/loop_instructions.py --streamed`` counts the difference). The
files are the very bytes that writing the whole table at the end gives
(:func:`kvbench.io.atomic.write_table`: the recorder's batches are the Parquet writer's row groups,
and the CSV is the same text row by row); the tests compare them.

Readers (the figures) take only the columns they need back from the Parquet file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvbench.errors import ConfigError
from kvbench.io.atomic import PARQUET_ROW_GROUP_ROWS, commit, temporary_path
from kvbench.io.numeric_csv import write_header, write_rows
from kvbench.io.table import ColumnTable

#: the files a streamed step table is written to, in a run's folder
STEP_FILES = ("steps.parquet", "steps.csv")


class StepFilesError(OSError):
    """Writing the step table's files failed (a full disk, a folder removed under the run)."""


class StepFiles:
    """``steps.parquet`` in ``out_dir``, written a batch of rows at a time, and ``steps.csv`` from it.

    Call it with each batch (a column name -> numpy values mapping, every column in table order),
    then :meth:`commit` once the run is over, or :meth:`discard` if it failed: until ``commit``
    only temporary files exist, which readers never take for a result."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._parquet_tmp: Path | None = None
        self._csv_tmp: Path | None = None
        self._writer = None  # pyarrow's ParquetWriter, opened with the first batch
        self._schema = None

    @property
    def parquet_path(self) -> Path:
        return self.out_dir / STEP_FILES[0]

    def __call__(self, batch: dict[str, np.ndarray]) -> None:
        try:
            self._write(batch)
        except OSError as exc:
            raise StepFilesError(exc.errno, exc.strerror or str(exc)) from exc

    def _write(self, batch: dict[str, np.ndarray]) -> None:
        import pyarrow.parquet as pq

        from kvbench.io.arrow_columns import arrow_table

        names, columns = list(batch), [np.asarray(values) for values in batch.values()]
        if self._writer is None:
            dtypes = {name: values.dtype for name, values in zip(names, columns)}
            if not columns or not all(d == np.float64 or d.kind in "iub" for d in dtypes.values()):
                raise TypeError(f"a step table holds numbers only, got dtypes {dtypes}")
            self._parquet_tmp = temporary_path(self.out_dir / STEP_FILES[0])
            # the schema a whole-table write gives (kvbench.io.atomic.write_table_parquet)
            self._schema = arrow_table(names, columns).schema
            self._writer = pq.ParquetWriter(self._parquet_tmp, self._schema)
        # (an empty batch, a run with no step, is an empty row group, as the whole empty table writes)
        table = arrow_table(names, columns)
        if table.schema != self._schema:  # a plugin's rows changed shape mid-run
            raise TypeError(f"a batch of step rows has columns {table.schema.names}, not {self._schema.names}")
        self._writer.write_table(table, row_group_size=PARQUET_ROW_GROUP_ROWS)

    def commit(self) -> None:
        """Close the Parquet file, write the CSV from it, and rename both into place (the run is over)."""
        if self._writer is None:
            raise RuntimeError("StepFiles.commit: no batch was written (the recorder sends one even for no row)")
        try:
            self._close()
            self._write_csv()
            commit(self._parquet_tmp, self.out_dir / STEP_FILES[0])
            commit(self._csv_tmp, self.out_dir / STEP_FILES[1])
        except OSError as exc:
            self.discard()
            raise StepFilesError(exc.errno, exc.strerror or str(exc)) from exc
        except ConfigError:  # a name that became a FIFO, a device or a folder meanwhile: never replaced
            self.discard()
            raise

    def _write_csv(self) -> None:
        """``steps.csv`` (temporary) from the closed Parquet file, a row group at a time: the values
        read back are the batches' own (numbers and bools, stored exactly), so the text is theirs."""
        import pyarrow.parquet as pq

        from kvbench.io.arrow_columns import numpy_values

        self._csv_tmp = temporary_path(self.out_dir / STEP_FILES[1])
        with (
            pq.ParquetFile(self._parquet_tmp, pre_buffer=False) as file,
            open(self._csv_tmp, "w", encoding="utf-8", newline="") as out,
        ):
            names = file.schema_arrow.names
            write_header(out, names)
            for group in range(file.num_row_groups):
                table = file.read_row_group(group, use_threads=False)
                if table.num_rows:
                    write_rows(out, [numpy_values(table.column(name)) for name in names])

    def discard(self) -> None:
        """Close and remove the temporary files (the run failed: no table)."""
        try:
            self._close()
        finally:
            for tmp in (self._parquet_tmp, self._csv_tmp):
                if tmp is not None:
                    tmp.unlink(missing_ok=True)

    def _close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()


def step_file_rows(path: Path) -> int:
    """The rows of a step table's Parquet file (from its footer: nothing else is read)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def read_step_columns(path: Path, columns: Sequence[str] | None = None, every: int = 1) -> ColumnTable:
    """The columns of a step table's Parquet file that it has, of ``columns`` (None: all), in that
    order; with ``every=k`` only rows 0, k, 2k, ... (what a figure draws of a long run).

    Read a row group at a time into arrays made for the result: ``pandas.read_parquet`` held about
    5x the columns' bytes at its peak (Arrow's buffers, then pandas' copy), which set a run's peak."""
    import pyarrow.parquet as pq

    from kvbench.io.arrow_columns import numpy_values

    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    file = pq.ParquetFile(path, pre_buffer=False)
    schema = file.schema_arrow
    names = list(schema.names) if columns is None else [name for name in columns if name in schema.names]
    num_rows = file.metadata.num_rows
    kept = -(-num_rows // every)  # rows 0, every, 2 every, ... below num_rows
    out = {name: np.empty(kept, dtype=schema.field(name).type.to_pandas_dtype()) for name in names}
    first = 0  # the file's row at which the row group starts
    for group in range(file.num_row_groups):
        size = file.metadata.row_group(group).num_rows
        offset = -first % every  # the group's first kept row
        if offset < size:
            table = file.read_row_group(group, columns=names, use_threads=False)
            at = (first + offset) // every
            for name in names:
                values = numpy_values(table.column(name))[offset::every]
                out[name][at : at + len(values)] = values
        first += size
    return ColumnTable(out)


def step_file_column_max(path: Path, name: str) -> float | None:
    """The largest value of column ``name`` of a step table's Parquet file (NaN ignored, as
    Parquet's statistics ignore it); None when the file has no such column or no value. From the
    footer's statistics (each row group's largest value, kept exactly) when every row group has
    them, so that asking whether a table of millions of rows ever cached a block reads no row;
    otherwise from the column itself."""
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    metadata = file.metadata
    index = file.schema_arrow.get_field_index(name)
    if index < 0 or metadata.num_rows == 0:
        return None
    groups = (metadata.row_group(g) for g in range(metadata.num_row_groups))
    stats = [group.column(index).statistics for group in groups if group.num_rows]
    if all(s is not None and s.has_min_max for s in stats):
        return float(max(s.max for s in stats))
    return largest_value(np.asarray(read_step_columns(path, [name])[name], dtype=float))


def largest_value(values: np.ndarray) -> float | None:
    """The largest of ``values``, NaN ignored; None when nothing else is left."""
    values = values[~np.isnan(values)]
    return float(values.max()) if len(values) else None
