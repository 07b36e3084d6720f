"""Files whole or absent, the completion marker, and the one-writer lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
from hang import HANG_S
from locks import held_lock
from special_files import KINDS, assert_unchanged, make, words

from kvbench.errors import ConfigError
from kvbench.io.atomic import (
    COMPLETE,
    LOCK,
    check_target,
    clear_incomplete,
    folder_lock,
    is_complete,
    mark_complete,
    write_file,
    write_frame,
    write_parquet,
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
    assert not is_complete(tmp_path) and sorted(p.name for p in tmp_path.iterdir()) == [
        "summary.csv",
        "summary.parquet",
    ]


@pytest.mark.parametrize("num_rows", [0, 1, 7, 9])
def test_parquet_is_written_a_row_group_at_a_time_and_reads_back_the_same_frame(tmp_path, num_rows):
    import pyarrow.parquet as pq

    frame = pd.DataFrame(
        {
            "step": pd.Series(range(num_rows), dtype="int64"),
            "duration_s": [0.1 * i if i % 3 else float("nan") for i in range(num_rows)],
            "saturated": [i % 2 == 0 for i in range(num_rows)],
            "reason": [None if i % 4 == 0 else f"r{i}" for i in range(num_rows)],
        }
    )
    write_parquet(frame, tmp_path / "steps.parquet", row_group_rows=3)
    assert pq.ParquetFile(tmp_path / "steps.parquet").num_row_groups == max(1, -(-num_rows // 3))
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "steps.parquet"), frame, check_exact=True)


def test_bytes_reach_the_disk_before_the_rename_and_the_marker(tmp_path, monkeypatch):
    import kvbench.io.atomic as atomic

    synced: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if sys.platform.startswith("linux") else "fd")
        real_fsync(fd)

    def replace(src, dst):
        synced.append(f"rename {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    write_text(tmp_path / "summary.csv", "x\n")
    mark_complete(tmp_path, ["summary.csv"])
    if sys.platform.startswith("linux"):
        assert ".tmp-summary.csv." in synced[0] and synced[1] == "rename summary.csv"  # the file, then its name
        assert synced[2] == str(tmp_path)  # the folder's entries before the marker
        assert ".tmp-COMPLETE." in synced[3] and synced[4] == "rename COMPLETE" and synced[5] == str(tmp_path)


def test_the_marker_vouches_for_sizes_and_catches_a_truncated_or_stray_file(tmp_path):
    from kvbench.io.atomic import check_complete

    write_text(tmp_path / "summary.csv", "a,b\n1,2\n")
    mark_complete(tmp_path, ["summary.csv"])
    assert json.loads((tmp_path / "COMPLETE").read_text()) == {"files": {"summary.csv": 8}}
    assert check_complete(tmp_path) is None
    (tmp_path / "steps.csv").write_text("left by another run")
    assert "steps.csv is there but not listed" in check_complete(tmp_path, owned=["steps.csv"])
    assert check_complete(tmp_path) is None  # a file the writer does not own (a log) is no concern
    (tmp_path / "summary.csv").write_text("a,b\n")
    assert check_complete(tmp_path) == "summary.csv is 4 bytes where COMPLETE says 8 (changed after the run wrote it)"


def test_a_lock_whose_owner_line_cannot_be_written_still_holds(tmp_path, monkeypatch):
    import kvbench.io.atomic as atomic

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "pwrite", full)
    with folder_lock(tmp_path):  # a full disk at start: the lock needs no bytes, only its file
        with held_lock_refused(tmp_path):
            pass


def test_a_second_writer_is_refused_while_the_first_lives(tmp_path):
    with held_lock(tmp_path) as holder:
        with pytest.raises(ConfigError, match=f"another kvbench run \\(pid {holder.pid} on "):
            with folder_lock(tmp_path):
                pass
    with folder_lock(tmp_path):  # released when its holder ended
        assert (tmp_path / LOCK).read_text().startswith(f"pid {os.getpid()} on ")
    assert not (tmp_path / LOCK).exists()


def test_a_holder_killed_with_sigkill_releases_the_lock(tmp_path):
    with held_lock(tmp_path) as holder:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with folder_lock(tmp_path):  # the kernel dropped the lock with the process: nothing stale
            pass


def test_a_lock_file_left_behind_is_no_lock(tmp_path):
    (tmp_path / LOCK).write_text("12345")  # an older kvbench's pid file, its process long gone
    with folder_lock(tmp_path):
        assert (tmp_path / LOCK).read_text().startswith(f"pid {os.getpid()}")
    assert not (tmp_path / LOCK).exists()


def test_the_holder_may_lock_its_own_folder_again(tmp_path):
    with folder_lock(tmp_path), folder_lock(tmp_path):
        assert (tmp_path / LOCK).exists()
    assert not (tmp_path / LOCK).exists()


@pytest.mark.parametrize("kind", ["symlink to a FIFO", "FIFO", "folder"])
def test_a_lock_path_that_is_not_a_plain_file_is_one_line_not_a_hang(tmp_path, kind):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    lock = tmp_path / LOCK
    if kind == "symlink to a FIFO":
        lock.symlink_to(fifo)
    elif kind == "FIFO":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    expected = {"symlink to a FIFO": "is a symbolic link", "FIFO": "not a regular file", "folder": "cannot lock"}[kind]
    with pytest.raises(ConfigError, match=expected):
        with folder_lock(tmp_path):
            pass


STRESS = """
import os, sys
from pathlib import Path
from kvbench.errors import ConfigError
from kvbench.io.atomic import folder_lock
folder, target = Path(sys.argv[1]), int(sys.argv[2])
inside = folder / "inside"
held = refused = double = 0
print("ready", flush=True)
sys.stdin.readline()  # all start together: the parent releases them at once
while held < target and refused < 1_000_000:  # retried at once: contention, not a schedule
    try:
        with folder_lock(folder):
            held += 1
            try:
                os.close(os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                double += 1  # another process is inside too
                continue
            os.unlink(inside)
    except ConfigError:
        refused += 1
print(held, refused, double)
"""


def test_four_processes_contending_never_hold_the_lock_together(tmp_path):
    # each holds the lock 1,500 times, retrying whenever another holds it: 6,000 acquisitions under contention
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", STRESS, str(tmp_path), "1500"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    assert all(w.stdout.readline().strip() == "ready" for w in workers)
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    counts = [tuple(map(int, w.communicate(timeout=HANG_S)[0].split())) for w in workers]
    assert [c[0] for c in counts] == [1500] * 4, counts
    assert sum(c[2] for c in counts) == 0, counts  # never two holders at once
    assert sum(c[1] for c in counts) > 0, counts  # they did contend
    assert not (tmp_path / LOCK).exists() and not (tmp_path / "inside").exists()


@contextmanager
def held_lock_refused(folder):
    """Another process tries the lock ``folder``'s holder has: it must be refused."""
    code = (
        "import sys; from pathlib import Path; from kvbench.errors import ConfigError; "
        "from kvbench.io.atomic import folder_lock\n"
        "try:\n    folder_lock(Path(sys.argv[1])).__enter__()\nexcept ConfigError as exc:\n    print(exc)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=HANG_S)
    assert "being written by another kvbench run (its holder did not say who it is)" in done.stdout, (
        done.stdout + done.stderr
    )
    yield


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("kind", KINDS)
def test_no_write_replaces_what_is_not_a_regular_file(tmp_path, kind):
    target = tmp_path / "out.json"
    before = make(target, kind)
    with pytest.raises(ConfigError, match=words(kind)):
        write_text(target, "{}")
    assert_unchanged(target, before)
    assert not list(tmp_path.glob(".tmp-*")), "nothing is made beside it either"


@pytest.mark.parametrize("kind", ["FIFO", "device"])
def test_a_name_that_becomes_a_fifo_during_the_write_is_not_replaced(tmp_path, kind):
    target = tmp_path / "out.json"
    holder = {}

    def write(tmp: Path) -> None:  # the target appears while the temporary file is written
        tmp.write_text("{}")
        holder["before"] = make(target, kind)

    with pytest.raises(ConfigError, match=words(kind)):
        write_file(target, write)
    assert_unchanged(target, holder["before"])
    assert not list(tmp_path.glob(".tmp-*")), "the temporary file is removed"


def test_regular_files_links_to_them_and_dangling_links_are_written(tmp_path):
    (tmp_path / "plain").write_text("old")
    check_target(tmp_path / "plain")
    (tmp_path / "link").symlink_to("plain")
    check_target(tmp_path / "link")  # a rename replaces the link itself, never what it points to
    (tmp_path / "dangling").symlink_to("nowhere")
    write_text(tmp_path / "dangling", "new")
    assert (tmp_path / "dangling").read_text() == "new" and not (tmp_path / "nowhere").exists()
    check_target(tmp_path / "absent")


def test_clearing_an_incomplete_folder_never_unlinks_a_fifo_marker(tmp_path):
    before = make(tmp_path / COMPLETE, "FIFO")
    with pytest.raises(ConfigError, match="is a FIFO"):
        clear_incomplete(tmp_path)
    assert_unchanged(tmp_path / COMPLETE, before)
