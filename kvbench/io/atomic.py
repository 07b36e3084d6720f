"""Files that are either whole or absent, a marker that says a folder is complete, and a lock
that lets one writer into a folder at a time.

A reader must never mistake a half-written table for a result: a killed process, a full disk, a
power cut or a second writer can each leave a truncated CSV that pandas reads back without
complaint. So every file is written to a temporary name in the same folder, flushed to the disk
(``fsync``), and renamed over its final name (a rename within one filesystem is atomic on POSIX);
a folder's ``COMPLETE`` marker is written last, after every file it vouches for, and lists each
of them with its size. Readers trust a folder only when the marker is there and the files match it
(:func:`check_complete`): a file truncated or replaced afterwards, or a file of the writer's left
behind by another run, makes it untrusted.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import socket
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvbench.errors import ConfigError, visible

if TYPE_CHECKING:  # pandas is only needed once a DataFrame is written: the lock and marker paths stay light
    import pandas as pd

    from kvbench.io.table import ColumnTable

#: written last into a finished run folder; its absence means "incomplete, do not read"
COMPLETE = "COMPLETE"
#: held (locked with flock) while a process writes into a folder
LOCK = ".kvbench.lock"
_TMP_PREFIX = ".tmp-"


def _fsync_path(path: Path) -> None:
    """Flush ``path``'s bytes (a file) or its entries (a folder) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems cannot fsync a folder; the file's own fsync is what matters
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


#: what a path that is not a regular file is, by its mode's type bits, in a refusal's words
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(path: Path) -> str | None:
    """What ``path`` is when it exists and is not a regular file (``"a FIFO"``, ``"a symbolic link
    to a character device"``), following a symbolic link to what a write would reach; None for a
    regular file, or where nothing is (a dangling link included: a rename replaces the link)."""
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return None  # unreadable metadata: the write itself will say what is wrong
    if stat.S_ISREG(info.st_mode):
        return None
    kind = next((words for test, words in _KINDS if test(info.st_mode)), "not a regular file")
    return f"a symbolic link to {kind}" if os.path.islink(path) else kind


def check_target(path: Path, hint: str = "remove it or write elsewhere") -> None:
    """Refuse, in one line, to write ``path`` when it exists and is not a regular file.

    Every file kvbench writes is renamed onto its name (:func:`commit`), which would put a regular
    file where a device, a FIFO or a socket was (``/dev/null`` itself, as root), or fail on a
    folder; writing through a symbolic link to one of them is no better. So each writer asks here
    first: before any work for a path the user named (``--json FILE``), and again at the rename."""
    kind = kind_of(path)
    if kind is not None:
        raise ConfigError(f"{visible(str(path), 200)} is {kind}, not a regular file: kvbench never replaces it; {hint}")


def check_targets(out_dir: Path, names: Iterable[str], hint: str = "remove it or write elsewhere") -> None:
    """:func:`check_target` for each file ``names`` a writer will put in ``out_dir``, before the first
    is written or an earlier one cleared: a refusal leaves the folder as it was."""
    for name in names:
        check_target(out_dir / name, hint)


def temporary_path(path: Path) -> Path:
    """A new, empty temporary file beside ``path``, to be renamed onto it by :func:`commit` (or
    removed): a reader takes it for a writer's leftover, never for a result. Refused when ``path``
    is not a regular file (:func:`check_target`), before anything is made beside it."""
    check_target(path)
    tmp = path.parent / f"{_TMP_PREFIX}{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    # created here with the usual permissions (0666 less the umask; mkstemp would make it 0600)
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    return tmp


def commit(tmp: Path, path: Path) -> None:
    """Flush the written ``tmp`` to the disk and rename it onto ``path``, unless ``path`` has become
    something other than a regular file meanwhile (:func:`check_target`)."""
    check_target(path)
    # before the rename: otherwise a crash could leave the final name pointing at no data yet
    _fsync_path(tmp)
    os.replace(tmp, path)


@contextmanager
def _temporary(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``, flushed and renamed onto it on success, removed on failure."""
    tmp = temporary_path(path)
    try:
        yield tmp
        commit(tmp, path)
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


def json_text(data: Any) -> str:
    """``data`` as the JSON text kvbench writes (indented, values it cannot encode as strings)."""
    return json.dumps(data, indent=2, default=str) + "\n"


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json_text(data))


#: rows per Parquet row group: what the writer converts and encodes at a time (about 1 MB of a
#: steps table), so that writing a long run's table costs little memory beyond the table itself
PARQUET_ROW_GROUP_ROWS = 4096


def write_frame(frame: pd.DataFrame, out_dir: Path, name: str, csv_float_format: str | None = None) -> None:
    """``<name>.parquet`` (the source of truth, full precision) and ``<name>.csv``, each written
    atomically; ``csv_float_format`` (``"%.10g"``) rounds the CSV's float columns, else they are exact."""
    write_file(out_dir / f"{name}.parquet", lambda tmp: write_parquet(frame, tmp))
    write_file(out_dir / f"{name}.csv", lambda tmp: write_csv(frame, tmp, csv_float_format))


def write_table(table: ColumnTable, out_dir: Path, name: str) -> None:
    """A run's table as ``<name>.parquet`` and ``<name>.csv``, each written atomically, without
    pandas: the Parquet file holds the same columns as :func:`write_frame`'s (no pandas metadata:
    ``pandas.read_parquet`` gives them a default index, as a written frame has), the CSV the same
    bytes (:func:`kvbench.io.numeric_csv.write_table_csv`)."""
    from kvbench.io.numeric_csv import write_table_csv

    write_file(out_dir / f"{name}.parquet", lambda tmp: write_table_parquet(table, tmp))
    write_file(out_dir / f"{name}.csv", lambda tmp: write_table_csv(table, tmp))


def write_table_parquet(table: ColumnTable, path: Path, row_group_rows: int = PARQUET_ROW_GROUP_ROWS) -> None:
    """``table`` as Parquet, a row group of ``row_group_rows`` at a time (as :func:`write_parquet`)."""
    import pyarrow.parquet as pq

    from kvbench.io.arrow_columns import arrow_table

    arrow = arrow_table(table.columns, [table[name] for name in table.columns])
    with pq.ParquetWriter(path, arrow.schema) as writer:
        writer.write_table(arrow, row_group_size=row_group_rows)


def write_csv(frame: pd.DataFrame, path: Path, float_format: str | None = None) -> None:
    """``frame.to_csv(path, index=False, float_format=float_format)``: a table of plain numbers
    with full-precision floats through kvbench's own writer (the same bytes in under half the
    time: :mod:`kvbench.io.numeric_csv`), anything else through pandas."""
    from kvbench.io.numeric_csv import write_numeric_csv, writes_numeric_csv

    if float_format is None and writes_numeric_csv(frame):
        write_numeric_csv(frame, path)
    else:
        frame.to_csv(path, index=False, float_format=float_format)


def write_parquet(frame: pd.DataFrame, path: Path, row_group_rows: int = PARQUET_ROW_GROUP_ROWS) -> None:
    """``frame`` as Parquet, encoded one row group of ``row_group_rows`` at a time:
    ``DataFrame.to_parquet`` encodes the whole table as one row group, which at 270,000 steps (a
    100,000-request run) raised the peak by 74 MB, this by a fraction of that. The frame is
    converted to Arrow once (its numeric columns are wrapped, not copied): converting it a row
    group at a time wrote the same bytes in 2.3x the time. ``pandas.read_parquet`` reads back the
    same frame (the schema, with pandas' metadata, is the whole frame's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.Schema.from_pandas(frame, preserve_index=False)
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
    with pq.ParquetWriter(path, schema) as writer:
        writer.write_table(table, row_group_size=row_group_rows)


def mark_complete(out_dir: Path, files: list[str]) -> None:
    """Write the completion marker last: it lists the files it vouches for (paths relative to
    ``out_dir``) with their sizes in bytes. The folder's entries are flushed first, so that the
    marker never reaches the disk before the renames it vouches for."""
    sizes = {name: (out_dir / name).stat().st_size for name in sorted(files)}
    _fsync_path(out_dir)
    write_json(out_dir / COMPLETE, {"files": sizes})
    _fsync_path(out_dir)


def check_complete(out_dir: Path, owned: Iterable[str] = ()) -> str | None:
    """None when ``out_dir`` is a complete result: its marker lists exactly the files there with
    their sizes. Otherwise why not, in words: no marker, an unreadable marker, a listed file
    missing or of another size, an ``owned`` file (a name the folder's writer writes) present but
    not listed, or a temporary file of a writer that did not finish."""
    marker = out_dir / COMPLETE
    if not marker.is_file():
        return "no COMPLETE marker (the run was interrupted or could not finish writing)"
    try:
        listed = json.loads(marker.read_text(encoding="utf-8"))["files"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
        return "its COMPLETE marker is damaged (not the JSON kvbench writes)"
    # a marker of an older kvbench lists names only: existence is all it can vouch for
    sizes = listed if isinstance(listed, dict) else dict.fromkeys(listed) if isinstance(listed, list) else None
    if sizes is None or not all(isinstance(name, str) for name in sizes):
        return "its COMPLETE marker is damaged (not the JSON kvbench writes)"
    for name, size in sizes.items():
        path = out_dir / name
        if not path.is_file():
            return f"{name}, listed in COMPLETE, is missing"
        if isinstance(size, int) and path.stat().st_size != size:
            return (
                f"{name} is {path.stat().st_size:,} bytes where COMPLETE says {size:,} (changed after the run wrote it)"
            )
    for name in owned:
        if name != COMPLETE and name not in sizes and (out_dir / name).is_file():
            return f"{name} is there but not listed in COMPLETE (left by another run)"
    leftovers = sorted(p.name for p in out_dir.glob(f"{_TMP_PREFIX}*"))
    if leftovers:
        return f"a writer's temporary file {leftovers[0]} is there (a run is writing, or died writing)"
    return None


def is_complete(out_dir: Path, owned: Iterable[str] = ()) -> bool:
    """Whether ``out_dir`` is a complete, untouched result (:func:`check_complete`)."""
    return check_complete(out_dir, owned) is None


def clear_incomplete(out_dir: Path) -> None:
    """Remove leftovers of an interrupted write (temporary files, a stale marker) before rewriting."""
    if not out_dir.is_dir():
        return
    check_target(out_dir / COMPLETE)  # a FIFO or a device there is the user's: never unlinked
    for leftover in out_dir.glob(f"{_TMP_PREFIX}*"):
        leftover.unlink(missing_ok=True)
    (out_dir / COMPLETE).unlink(missing_ok=True)


@contextmanager
def whole_or_none(out_dir: Path, names: Iterable[str]) -> Iterator[None]:
    """A set of files written together, each atomically: if the block fails (a full disk, a
    signal), the ones it wrote are removed, so the folder holds the whole set or none of it, never
    some files of a result without its ``COMPLETE``. Only regular files are removed: a name that
    is a FIFO, a device or a folder is the user's."""
    try:
        yield
    except BaseException:
        for name in names:
            path = out_dir / name
            if path.is_file() and not path.is_symlink():
                path.unlink(missing_ok=True)
        raise


#: the locks this process holds: lock path -> [fd, depth] (a holder may lock its folder again)
_HELD: dict[str, list[int]] = {}


@contextmanager
def folder_lock(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir`` for one writer: a second run into the same folder is refused in one line.

    The lock is ``flock`` on an open file: the kernel releases it when its holder exits, however it
    exits (SIGKILL included), so a lock is never stale and never taken over by guesswork about
    process ids. The holder's pid and host are written into the file for the refusal's message
    only. The file is opened without following a symbolic link and without blocking, and must be a
    regular file (a FIFO there would otherwise block the run forever). The holder removes the
    file while still holding it; a process that locked the removed file finds that the path no
    longer names what it locked, and tries again.
    """
    lock = out_dir / LOCK
    key = os.path.abspath(lock)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    fd = _acquire(lock, out_dir)
    _HELD[key] = [fd, 1]
    try:
        _write_owner(fd)
        yield
    finally:
        del _HELD[key]
        try:
            lock.unlink(missing_ok=True)  # while still held: see the docstring
        except OSError:
            pass  # a folder gone or made read-only under the run: the kernel still drops the lock
        os.close(fd)


def _acquire(lock: Path, out_dir: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    while True:
        try:
            fd = os.open(lock, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ConfigError(
                    f"{lock} is a symbolic link: kvbench does not follow it; remove it and run again"
                ) from None
            raise ConfigError(
                f"cannot lock {out_dir} for writing ({exc.strerror or exc} on {lock.name}); "
                "free space or write elsewhere with hydra.run.dir=<folder>"
            ) from None
        try:
            held = _lock_open_file(fd, lock, out_dir)
        except BaseException:
            os.close(fd)
            raise
        if held:
            return fd
        os.close(fd)  # the holder we waited behind removed this file: lock the new one


def _lock_open_file(fd: int, lock: Path, out_dir: Path) -> bool:
    """Lock the open ``fd`` of ``lock``: True when held and ``lock`` still names it, False when the
    file was removed or replaced meanwhile; a ConfigError when another process holds it."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{lock} is not a regular file (a FIFO, a socket or a device): remove it and run again")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(
            f"{out_dir} is being written by another kvbench run ({_owner_text(fd)}): wait for it, "
            "or write elsewhere with hydra.run.dir=<folder> (hydra.sweep.dir=<folder> for a sweep)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot lock {out_dir} for writing ({exc.strerror or exc}): write elsewhere") from None
    try:
        now = os.stat(lock, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)


def _write_owner(fd: int) -> None:
    """``pid <pid> on <host>`` into the held lock file, for a refused writer's message. Best effort:
    on a full disk the lock still holds, the message just cannot name its holder."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except OSError:
        pass


def _owner_text(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    if text.isdigit():  # a lock file of an older kvbench: the pid only
        text = f"pid {text}"
    return text if text.startswith("pid ") and text.isprintable() else "its holder did not say who it is"
