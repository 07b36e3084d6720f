"""Files that are either whole or absent, and a marker that says a folder is complete.

A reader must never mistake a half-written table for a result: a killed process, a full disk or a
second writer can each leave a truncated CSV that pandas reads back without complaint. So every
file is written to a temporary name in the same folder and renamed over its final name (a rename
within one filesystem is atomic on POSIX), and a folder's ``COMPLETE`` marker is written last, after
every file it vouches for. Readers trust a folder only when the marker is there.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvbench.errors import ConfigError

if TYPE_CHECKING:  # pandas is only needed once a table is written: the lock and marker paths stay light
    import pandas as pd

#: written last into a finished run folder; its absence means "incomplete, do not read"
COMPLETE = "COMPLETE"
#: held (created exclusively) while a process writes into a folder
LOCK = ".kvbench.lock"
_TMP_PREFIX = ".tmp-"


@contextmanager
def _temporary(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed onto it on success and removed on failure."""
    tmp = path.parent / f"{_TMP_PREFIX}{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    # created here with the usual permissions (0666 less the umask; mkstemp would make it 0600)
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_file(path: Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp_path)`` and rename the result onto ``path``: ``path`` is whole or absent."""
    with _temporary(path) as tmp:
        write(tmp)
    return path


def write_text(path: Path, text: str) -> Path:
    return write_file(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def write_frame(frame: pd.DataFrame, out_dir: Path, name: str, csv_float_format: str | None = None) -> None:
    """``<name>.parquet`` (the source of truth, full precision) and ``<name>.csv``, each written
    atomically; ``csv_float_format`` (``"%.10g"``) rounds the CSV's float columns, else they are exact."""
    write_file(out_dir / f"{name}.parquet", lambda tmp: frame.to_parquet(tmp, index=False))
    write_file(out_dir / f"{name}.csv", lambda tmp: frame.to_csv(tmp, index=False, float_format=csv_float_format))


def mark_complete(out_dir: Path, files: list[str]) -> None:
    """Write the completion marker last: it lists the files it vouches for."""
    write_json(out_dir / COMPLETE, {"files": sorted(files)})


def is_complete(out_dir: Path) -> bool:
    return (out_dir / COMPLETE).is_file()


def clear_incomplete(out_dir: Path) -> None:
    """Remove leftovers of an interrupted write (temporary files, a stale marker) before rewriting."""
    if not out_dir.is_dir():
        return
    for leftover in out_dir.glob(f"{_TMP_PREFIX}*"):
        leftover.unlink(missing_ok=True)
    (out_dir / COMPLETE).unlink(missing_ok=True)


@contextmanager
def folder_lock(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir`` for one writer: a second run into the same folder is refused in one line.

    The lock is a file created with O_EXCL and holding the owner's pid; a lock whose process is gone
    (a run killed with SIGKILL) is stale and taken over.
    """
    lock = out_dir / LOCK
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _lock_owner(lock)
            if owner is not None and owner != os.getpid() and _alive(owner):
                raise ConfigError(
                    f"{out_dir} is being written by another kvbench run (pid {owner}): wait for it, or "
                    "write elsewhere with hydra.run.dir=<folder> (hydra.sweep.dir=<folder> for a sweep)"
                ) from None
            lock.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as handle:
            handle.write(str(os.getpid()))
        break
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _lock_owner(lock: Path) -> int | None:
    try:
        return int(lock.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
