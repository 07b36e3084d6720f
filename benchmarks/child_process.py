"""Run one command as a child process and measure it alone: wall time, start to exit, and peak RSS.

``resource.getrusage(RUSAGE_CHILDREN)`` cannot tell two children apart (its ``ru_maxrss`` is the
largest child so far, of the whole life of the parent), so each child is reaped with ``os.wait4``,
which returns that child's own usage: its peak RSS, or that of the largest process it waited for
(a shell script's ``ru_maxrss`` is its biggest command's).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    wall_s: float  #: from just before the fork to the child's exit being reaped
    peak_rss_bytes: int  #: the child's (or its largest waited-for descendant's) peak resident set
    returncode: int
    stdout: str
    stderr: str

    def check(self, what: str) -> Measured:
        """``self``, or a RuntimeError quoting the end of stderr if the command failed."""
        if self.returncode != 0:
            tail = "\n".join(self.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"{what} exited with status {self.returncode}:\n{tail}")
        return self


def measure(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None) -> Measured:
    """Run ``argv`` to completion; its output goes to temporary files (a pipe could fill and block it)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start_s = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - start_s
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        return Measured(
            wall_s,
            usage.ru_maxrss * 1024,
            proc.returncode,  # Linux: ru_maxrss is in KiB
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )
