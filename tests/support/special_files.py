"""Paths that are not regular files, made in a test's own folder, for the tests that check that no
command replaces one given as its output: a FIFO, a folder holding a file, a character device
(as root only: ``os.mknod`` with ``/dev/null``'s numbers, so that nothing written to it lands
anywhere; never the real ``/dev/null``) and a symbolic link to a FIFO."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

#: every kind :func:`make` makes
KINDS = ("FIFO", "folder", "device", "link to a FIFO")
#: the kinds every command is checked with (the issue's minimum); the others where they matter
BASIC = ("FIFO", "folder")


def make(path: Path, kind: str) -> tuple:
    """Make ``path`` a ``kind`` (its parent made first) and return what :func:`assert_unchanged`
    compares it with afterwards; skips the test where this machine cannot make a device node."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
        (path / "kept.txt").write_text("the user's file\n")
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except (PermissionError, OSError) as exc:
            pytest.skip(f"making a device node needs root here ({exc.strerror})")
    elif kind == "link to a FIFO":
        target = path.with_name(path.name + ".fifo")
        os.mkfifo(target)
        path.symlink_to(target.name)
    else:
        raise ValueError(kind)
    return snapshot(path)


def snapshot(path: Path) -> tuple:
    """What ``path`` is: its own type, inode and device numbers, a folder's entries, a link's target."""
    info = os.lstat(path)
    detail: object = None
    if stat.S_ISDIR(info.st_mode):
        detail = sorted((p.name, p.read_text()) for p in path.iterdir())
    elif stat.S_ISLNK(info.st_mode):
        detail = (os.readlink(path), snapshot(path.parent / os.readlink(path)))
    return (stat.S_IFMT(info.st_mode), info.st_ino, info.st_rdev, detail)


def assert_unchanged(path: Path, before: tuple) -> None:
    assert snapshot(path) == before, f"{path} was replaced or changed"


def words(kind: str) -> str:
    """How a refusal names ``kind`` (kvbench.io.atomic.kind_of)."""
    return {
        "FIFO": "is a FIFO",
        "folder": "is a folder",
        "device": "is a character device",
        "link to a FIFO": "is a symbolic link to a FIFO",
    }[kind]
