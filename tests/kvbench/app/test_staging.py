"""Staging folders named by their owner process: a killed run's are cleared, a live run's never."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvbench.app.staging import clear_stale, make_staging, owner_alive, process_start

PREFIX = ".paper-"


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_sigkilled_owner_s_folder_is_cleared(tmp_path):
    code = (
        "import os, signal, sys; from pathlib import Path; from kvbench.app.staging import make_staging; "
        f"s = make_staging(Path({str(tmp_path)!r}), {PREFIX!r}); (s / 'half.md').write_text('x'); "
        "print(s, flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.returncode == -9
    left = [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]
    assert len(left) == 1 and (left[0] / "half.md").is_file()  # SIGKILL: nothing of it cleaned up
    assert clear_stale(tmp_path, (PREFIX,)) == left
    assert not any(tmp_path.iterdir())


def test_a_live_run_s_folder_and_a_folder_of_another_form_stay(tmp_path):
    mine = make_staging(tmp_path, PREFIX)  # this process: alive
    legacy = tmp_path / ".paper-k3j4h5"  # no owner in its name: never removed
    legacy.mkdir()
    other = tmp_path / "paper"
    other.mkdir()
    assert clear_stale(tmp_path, (PREFIX,)) == []
    assert {p.name for p in tmp_path.iterdir()} == {mine.name, legacy.name, "paper"}


def test_a_dead_pid_and_a_reused_pid_are_both_stale(tmp_path):
    gone = tmp_path / f"{PREFIX}{dead_pid()}-123-abc"
    gone.mkdir()
    start = process_start(os.getpid())
    if not start:
        pytest.skip("no /proc: a live pid's start time cannot be read, so a reused pid counts as live")
    reused = tmp_path / f"{PREFIX}{os.getpid()}-{start + 1}-abc"  # this pid, but another process's start
    reused.mkdir()
    assert sorted(clear_stale(tmp_path, (PREFIX,))) == sorted([gone, reused])


def test_the_longer_prefix_is_matched_first():
    pid = dead_pid()
    assert not owner_alive(f".paper-old-.paper-{pid}-1-x", ".paper-old-.paper-")
    assert owner_alive(f".paper-old-.paper-{pid}-1-x", ".paper-")  # read with the short prefix: no owner, kept


def test_a_file_with_the_prefix_is_not_a_staging_folder(tmp_path):
    f = tmp_path / f"{PREFIX}{dead_pid()}-1-x"
    f.write_text("a user's file")
    assert clear_stale(tmp_path, (PREFIX,)) == []
    assert f.read_text() == "a user's file"
