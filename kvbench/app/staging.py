"""Staging folders that name the process building them, so that a later run can clear the ones a
killed run left behind without ever touching a live run's.

A command that builds a folder in a staging folder and renames it into place (``kvbench paper``)
leaves that staging folder behind when SIGKILL stops it: nothing of the process runs again. The
staging folder's name carries its owner's process id and the time that process started
(``<prefix><pid>-<start>-<random>``), so a later run can tell a dead owner from a live one:

- the pid no longer exists: dead;
- the pid exists but started at another time (the pid was reused by another process): dead;
- otherwise: live, left alone.

Where the start time cannot be read (no ``/proc``), a live pid counts as live: a stale folder may
stay, a live one is never removed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

_NAME = re.compile(r"(?P<pid>\d+)-(?P<start>\d+)-")


def process_start(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``'s 22nd field);
    0 where it cannot be read (no ``/proc``, or the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    # the command name (field 2) is in parentheses and may hold spaces: count fields after it
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line is the 20th after the name
    except (IndexError, ValueError):
        return 0


def make_staging(parent: Path | None, prefix: str) -> Path:
    """A new private staging folder in ``parent`` (None: the system's temporary folder) whose name
    says which process owns it."""
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{pid}-{process_start(pid)}-", dir=parent))


def owner_alive(name: str, prefix: str) -> bool:
    """Whether the process a staging folder's name names still runs (True for a name kvbench did
    not make in this form: a folder it cannot attribute is never removed)."""
    match = _NAME.match(name[len(prefix) :]) if name.startswith(prefix) else None
    if match is None:
        return True
    pid, start = int(match["pid"]), int(match["start"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process with that pid: alive, and not ours to judge
    now = process_start(pid)
    return not (now and start and now != start)


def clear_stale(parent: Path | None, prefixes: tuple[str, ...]) -> list[Path]:
    """Remove the folders in ``parent`` (None: the temporary folder) that start with one of
    ``prefixes`` and whose owner process is gone; return them. Only this user's folders are
    looked at, and an error removing one (a folder another user owns) leaves it."""
    folder = Path(tempfile.gettempdir()) if parent is None else parent
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    uid = os.getuid() if hasattr(os, "getuid") else None
    for entry in entries:
        prefix = next((p for p in prefixes if entry.name.startswith(p)), None)
        try:  # (another run may remove it meanwhile: then there is nothing to clear)
            if prefix is None or not entry.is_dir(follow_symlinks=False):
                continue
            if uid is not None and entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if owner_alive(entry.name, prefix):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(Path(entry.path))
    return removed
