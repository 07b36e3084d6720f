"""Run the ``kvbench`` command as a user does, in a fresh process, and check its one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from hang import HANG_S

MAIN = "from kvbench.commands.main import main; main()"


def kvbench(
    *args: str, cwd: Path, code: str = MAIN, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``kvbench <args>`` in ``cwd``; ``code`` replaces the entry point (a test may wrap it first),
    ``env`` this process's environment. Either way Hydra's one-line errors and no warnings: what
    a user sees, whatever the developer's shell sets."""
    env = {**(os.environ if env is None else env), "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S
    )


def main_without(module: str) -> str:
    """The entry point's code with ``module`` hidden from the import system: None in sys.modules is
    what import and importlib.util.find_spec see for a package that is not installed."""
    return f"import sys; sys.modules[{module!r}] = None\n{MAIN}\n"


def main_status(monkeypatch, command: str, main: Callable[[], object], *args: str) -> int:
    """``kvbench <command> <args>`` run by the command's ``main`` in this process (quicker than a
    fresh one, and monkeypatches reach it); its exit status, 0 when ``main`` returns."""
    monkeypatch.setattr(sys, "argv", [f"kvbench {command}", *args])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


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
