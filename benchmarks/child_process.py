"""Run one command as a child process and measure it alone: wall time, start to exit, and peak RSS.

``resource.getrusage(RUSAGE_CHILDREN)`` cannot tell two children apart (its ``ru_maxrss`` is the
largest child so far, of the whole life of the parent), so each child is reaped with ``os.wait4``,
which returns that child's own usage: its peak RSS, or that of the largest process it waited for
(a shell script's ``ru_maxrss`` is its biggest command's).

A child must not be started by the measuring process itself. On Linux a process's ``ru_maxrss``
starts from the high-water mark of the memory it had before ``exec``, and a child that Python's
``subprocess`` starts (``vfork`` then ``exec``) had its parent's: a 1-request run started from a
benchmark that had read 100,000-request tables reported the benchmark's 400 MB as its own. So
:func:`measure` starts a small launcher (Python without ``site``, about 10 MB), which starts the
command, reaps it with ``os.wait4`` and writes its wall time, peak RSS and exit status to a file:
the command's peak is then its own (at least the launcher's few MB).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

#: the launcher: runs argv[2:] (searched on PATH), reaps it, writes "wall_s ru_maxrss_kib exit_status" to argv[1]
LAUNCHER = """
import os, sys, time
start_s = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
wall_s = time.perf_counter() - start_s
with open(sys.argv[1], "w") as f:
    f.write(f"{wall_s!r} {usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
"""


@dataclass(frozen=True)
class Measured:
    wall_s: float  #: from just before the command's spawn to its exit being reaped
    peak_rss_bytes: int  #: the command's (or its largest waited-for descendant's) peak resident set
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False  #: killed after ``timeout_s``

    def check(self, what: str) -> Measured:
        """``self``, or a RuntimeError quoting the end of stderr if the command failed."""
        if self.timed_out:
            raise RuntimeError(f"{what} did not finish in {self.wall_s:.0f} s (killed)")
        if self.returncode != 0:
            tail = "\n".join(self.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"{what} exited with status {self.returncode}:\n{tail}")
        return self


def measure(
    argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None, timeout_s: float | None = None
) -> Measured:
    """Run ``argv`` to completion, or kill it (and the processes it started) after ``timeout_s``; its
    output goes to temporary files (a pipe could fill and block it)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "usage")
        start_s = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-S", "-c", LAUNCHER, report, *argv],
            stdout=out,
            stderr=err,
            env=env,
            cwd=cwd,
            start_new_session=True,  # a group of its own: a timeout kills the launcher and what it started
        )
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:  # it exited meanwhile
                pass

        timer = threading.Timer(timeout_s, kill) if timeout_s is not None else None
        if timer is not None:
            timer.start()
        try:
            launcher_status = proc.wait()
        except BaseException:  # Ctrl-C or SIGTERM here: the command's own session gets no signal, so stop it
            kill()
            proc.wait()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        wall_s = time.perf_counter() - start_s
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        if killed.is_set() or not os.path.exists(report):  # killed, or the command could not start
            return Measured(wall_s, 0, launcher_status or 1, stdout, stderr, killed.is_set())
        with open(report) as f:
            command_wall_s, maxrss_kib, returncode = f.read().split()
        # Linux: ru_maxrss is in KiB
        return Measured(float(command_wall_s), int(maxrss_kib) * 1024, int(returncode), stdout, stderr)
