"""Run the ``kvbench`` command as a user does, in a fresh process, and check its one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hang import HANG_S

MAIN = "from kvbench.commands.main import main; main()"


def kvbench(*args: str, cwd: Path, code: str = MAIN) -> subprocess.CompletedProcess:
    """``kvbench <args>`` in ``cwd``; ``code`` replaces the entry point (a test may wrap it first)."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S
    )


def error_lines(proc: subprocess.CompletedProcess, prefix: str = "kvbench: error:") -> list[str]:
    """The lines of stderr starting with ``prefix``, after checking that nothing printed a traceback."""
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith(prefix)]


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str, status: int | None = None) -> str:
    """Exactly one ``kvbench: error:`` line, holding every fragment; a non-zero (or the given) status."""
    assert proc.returncode != 0 if status is None else proc.returncode == status, (proc.returncode, proc.stderr)
    errors = error_lines(proc)
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]
