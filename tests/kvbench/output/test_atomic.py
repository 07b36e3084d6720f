"""Files whole or absent, the completion marker, and the one-writer lock."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from kvbench.errors import ConfigError
from kvbench.output.atomic import (
    LOCK,
    clear_incomplete,
    folder_lock,
    is_complete,
    mark_complete,
    write_file,
    write_frame,
    write_text,
)


def test_a_file_is_replaced_whole_and_keeps_normal_permissions(tmp_path):
    path = tmp_path / "table.csv"
    write_text(path, "old\n")
    write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "table.csv"
    write_text(path, "whole\n")

    def half_then_fail(tmp):
        tmp.write_text("hal")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_file(path, half_then_fail)
    assert path.read_text() == "whole\n"
    assert [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_an_interrupted_write_leaves_nothing_under_the_final_name(tmp_path):
    def interrupted(tmp):
        tmp.write_text("hal")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_file(tmp_path / "summary.csv", interrupted)
    assert list(tmp_path.iterdir()) == []


def test_frames_round_trip_and_the_marker_comes_last(tmp_path):
    frame = pd.DataFrame({"a": [1, 2]})
    write_frame(frame, tmp_path, "summary")
    assert not is_complete(tmp_path)
    mark_complete(tmp_path, ["summary.parquet", "summary.csv"])
    assert is_complete(tmp_path)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "summary.parquet"), frame)
    (tmp_path / ".tmp-steps.csv.1.ab").write_text("x")
    clear_incomplete(tmp_path)
    assert not is_complete(tmp_path) and sorted(p.name for p in tmp_path.iterdir()) == ["summary.csv", "summary.parquet"]


def test_a_second_writer_is_refused_while_the_first_lives(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)  # alive until killed
    try:
        (tmp_path / LOCK).write_text(str(holder.pid))
        with pytest.raises(ConfigError, match=f"another kvbench run \\(pid {holder.pid}\\)"):
            with folder_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
        holder.stdin.close()


def test_a_stale_lock_is_taken_over_and_released(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / LOCK).write_text(dead.stdout.strip())
    with folder_lock(tmp_path):
        assert (tmp_path / LOCK).read_text() == str(os.getpid())
    assert not (tmp_path / LOCK).exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
