"""Where a benchmark writes its report, as kvbench's own commands write theirs: the folder checked
before the measurement starts (minutes of it must not end in "cannot write"), each file written
whole or not at all, and a FIFO, a device or a folder lying under a report's name refused in one
line and exit 2, never replaced (kvbench.io.atomic.check_target)."""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

from kvbench.app.folders import check_writable
from kvbench.errors import ConfigError, error_line
from kvbench.io.atomic import check_targets, write_file, write_text


def _refuse(prog: str, reason: object) -> NoReturn:
    print(error_line(prog, reason), file=sys.stderr)
    sys.exit(2)


def report_header(script: str, argv: list[str] | None) -> dict[str, str]:
    """What a report says first: when it was measured (UTC), the command that measured it (``argv``,
    or this process's arguments when None) and on what machine."""
    return {
        "measured_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"python benchmarks/{script}" + "".join(f" {a}" for a in (argv or sys.argv[1:])),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
    }


def check_report(prog: str, out_dir: Path, names: Iterable[str]) -> None:
    """Exit 2 with one line, before any measurement, when ``out_dir`` cannot hold ``names``."""
    try:
        check_writable(out_dir, "--out")
        check_targets(out_dir, names, "remove it or choose another --out")
    except ConfigError as exc:
        _refuse(prog, exc)


def write_report(
    prog: str,
    out_dir: Path,
    texts: Mapping[str, str],
    others: Mapping[str, Callable[[Path], object]] | None = None,
) -> None:
    """``texts`` (name -> text) and ``others`` (name -> a writer of that file, such as a figure's
    savefig) into ``out_dir``, each whole; exit 2 with one line when that fails."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        check_targets(out_dir, [*texts, *(others or {})], "remove it or choose another --out")
        for name, text in texts.items():
            write_text(out_dir / name, text)
        for name, write in (others or {}).items():
            write_file(out_dir / name, write)
    except ConfigError as exc:
        _refuse(prog, exc)
    except OSError as exc:
        _refuse(prog, f"cannot write to {out_dir}: {exc.strerror or exc}")
