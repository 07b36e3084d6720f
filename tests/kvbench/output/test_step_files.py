"""The step table written as the run goes: the same bytes as the whole table written at the end,
temporary until committed, removed when the run fails."""

from __future__ import annotations

import errno

import numpy as np
import pandas as pd
import pytest

from kvbench.io.atomic import PARQUET_ROW_GROUP_ROWS, write_table
from kvbench.io.table import ColumnTable
from kvbench.metrics.recorder import STEP_ROWS_BATCH
from kvbench.output.step_files import (
    STEP_FILES,
    StepFiles,
    StepFilesError,
    read_step_columns,
    step_file_column_max,
    step_file_rows,
)


def table(num_rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "step": np.arange(num_rows, dtype=np.int64),
            "start_s": np.cumsum(rng.exponential(0.01, num_rows)),
            "saturated": rng.random(num_rows) < 0.3,
            "token_bytes": rng.integers(0, 1 << 40, num_rows).astype(np.float64) / 3,
            "num_running": rng.integers(0, 300, num_rows),
        }
    )
    frame.loc[frame.index[::97], "token_bytes"] = np.nan  # NaN as pandas writes it: empty in the CSV
    frame.loc[frame.index[1::89], "start_s"] = -0.0  # -0.0 keeps its sign through the Parquet file
    return frame


def batches(frame: pd.DataFrame, size: int):
    for start in range(0, max(len(frame), 1), size):
        part = frame.iloc[start : start + size]
        yield {name: part[name].to_numpy() for name in frame.columns}


@pytest.mark.parametrize("num_rows", [0, 1, PARQUET_ROW_GROUP_ROWS, 2 * PARQUET_ROW_GROUP_ROWS + 5])
def test_streamed_files_are_the_bytes_of_the_whole_table(tmp_path, num_rows):
    frame = table(num_rows)
    whole, streamed = tmp_path / "whole", tmp_path / "streamed"
    whole.mkdir()
    streamed.mkdir()
    write_table(ColumnTable.from_pandas(frame), whole, "steps")  # a held table, written at the end
    files = StepFiles(streamed)
    for batch in batches(frame, STEP_ROWS_BATCH):
        files(batch)
        assert not (streamed / "steps.parquet").exists()  # temporary until the run is over
        assert len(list(streamed.iterdir())) == 1  # no CSV text while the run goes: it comes at commit
    files.commit()
    for name in STEP_FILES:
        assert (streamed / name).read_bytes() == (whole / name).read_bytes(), name
    assert sorted(p.name for p in streamed.iterdir()) == sorted(STEP_FILES)  # no temporary file left
    pd.testing.assert_frame_equal(pd.read_parquet(streamed / "steps.parquet"), frame)


def test_only_the_columns_asked_for_are_read_back(tmp_path):
    files = StepFiles(tmp_path)
    for batch in batches(table(10), 4):
        files(batch)
    files.commit()
    read = read_step_columns(tmp_path / "steps.parquet", ["num_running", "no_such_column", "start_s"])
    assert list(read.columns) == ["num_running", "start_s"] and len(read) == 10


@pytest.mark.parametrize("every", [1, 2, 5, 4096, 5000, 9000])
def test_every_kth_row_is_read_back_across_row_groups(tmp_path, every):
    frame = table(2 * PARQUET_ROW_GROUP_ROWS + 7)
    files = StepFiles(tmp_path)
    for batch in batches(frame, STEP_ROWS_BATCH):
        files(batch)
    files.commit()
    assert step_file_rows(tmp_path / "steps.parquet") == len(frame)
    read = read_step_columns(tmp_path / "steps.parquet", ["saturated", "token_bytes", "step"], every=every)
    expected = frame[["saturated", "token_bytes", "step"]].iloc[::every].reset_index(drop=True)
    pd.testing.assert_frame_equal(read.to_pandas(), expected)
    pd.testing.assert_frame_equal(read_step_columns(tmp_path / "steps.parquet").to_pandas(), frame)


def test_a_failed_run_leaves_no_file(tmp_path):
    files = StepFiles(tmp_path)
    files(next(batches(table(5), 5)))
    assert len(list(tmp_path.glob(".tmp-*"))) == 1  # the Parquet file's; the CSV is written at commit
    files.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_csv_that_cannot_be_written_at_commit_leaves_no_file(tmp_path, monkeypatch):
    files = StepFiles(tmp_path)
    files(next(batches(table(5), 5)))

    def full_disk(out, columns):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("kvbench.output.step_files.write_rows", full_disk)
    with pytest.raises(StepFilesError) as raised:
        files.commit()
    assert raised.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_cannot_be_written_is_a_step_files_error(tmp_path):
    files = StepFiles(tmp_path / "gone")
    with pytest.raises(StepFilesError) as raised:
        files(next(batches(table(5), 5)))
    assert raised.value.errno == errno.ENOENT and isinstance(raised.value, OSError)


def test_commit_before_any_batch_is_a_bug(tmp_path):
    with pytest.raises(RuntimeError, match="no batch"):
        StepFiles(tmp_path).commit()


@pytest.mark.parametrize("statistics", [True, False])
def test_a_columns_largest_value_is_the_tables_nan_ignored(tmp_path, statistics):
    """From the footer's statistics (kvbench's writers keep them) or, in a file without them, from
    the column itself: the same number either way, NaN ignored."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = table(2 * PARQUET_ROW_GROUP_ROWS + 7, seed=3)
    path = tmp_path / "steps.parquet"
    pq.write_table(
        pa.Table.from_pandas(frame, preserve_index=False),
        path,
        row_group_size=PARQUET_ROW_GROUP_ROWS,
        write_statistics=statistics,
    )
    assert pq.ParquetFile(path).metadata.row_group(0).column(3).is_stats_set is statistics
    assert step_file_column_max(path, "token_bytes") == float(np.nanmax(frame["token_bytes"]))
    assert step_file_column_max(path, "num_running") == float(frame["num_running"].max())
    assert step_file_column_max(path, "no_such_column") is None


def test_a_streamed_tables_largest_value_comes_from_its_footer(tmp_path, monkeypatch):
    frame = table(PARQUET_ROW_GROUP_ROWS + 3, seed=4)
    files = StepFiles(tmp_path)
    for batch in batches(frame, STEP_ROWS_BATCH):
        files(batch)
    files.commit()
    monkeypatch.setattr("kvbench.output.step_files.read_step_columns", None)  # no row is read
    assert step_file_column_max(tmp_path / "steps.parquet", "start_s") == float(frame["start_s"].max())


def test_an_empty_or_all_nan_column_has_no_largest_value(tmp_path):
    empty = StepFiles(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    empty(next(batches(table(0), STEP_ROWS_BATCH)))
    empty.commit()
    assert step_file_column_max(tmp_path / "empty" / "steps.parquet", "start_s") is None
    nan = table(5).assign(token_bytes=np.nan)
    write_table(ColumnTable.from_pandas(nan), tmp_path, "steps")
    assert step_file_column_max(tmp_path / "steps.parquet", "token_bytes") is None
