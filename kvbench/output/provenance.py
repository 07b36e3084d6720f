"""Which kvbench produced a result: its version and, in a git checkout, its commit.

Recorded in every result (summary row, ``config.json``'s neighbour ``summary.json``) so that a
number can be traced to the code that computed it, and printed by ``kvbench --version``.
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def kvbench_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvbench")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


@lru_cache(maxsize=1)
def kvbench_commit() -> str | None:
    """The commit of the checkout kvbench runs from, ``+dirty`` when it has uncommitted changes to
    tracked files; None for an installed wheel or where git is missing."""
    source = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def provenance() -> dict[str, str | None]:
    """``{"kvbench_version": ..., "kvbench_commit": ...}``: the columns every result carries."""
    return {"kvbench_version": kvbench_version(), "kvbench_commit": kvbench_commit()}


def version_line() -> str:
    commit = kvbench_commit()
    return f"kvbench {kvbench_version()}" + (
        f" (commit {commit[:12]}{'+dirty' if commit.endswith('+dirty') else ''})" if commit else ""
    )
