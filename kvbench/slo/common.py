"""What the SLO studies write: an output folder written atomically (every file whole or absent,
``COMPLETE`` last), and SLOs as people write them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from kvbench.io.atomic import (
    COMPLETE,
    check_targets,
    clear_incomplete,
    folder_lock,
    mark_complete,
    whole_or_none,
    write_file,
    write_frame,
    write_json,
)

#: what a refused output file's line says to do
_HINT = "remove it or choose another --out folder"


def folder_files(tables: Iterable[str], others: Iterable[str] = ()) -> list[str]:
    """Every name :func:`write_folder` writes for these tables (Parquet + CSV) and other files."""
    return [*(f"{name}.{ext}" for name in tables for ext in ("parquet", "csv")), *others, COMPLETE]


def check_folder_files(out_dir: Path, names: Iterable[str]) -> None:
    """Refuse, before any work, an output folder where one of ``names`` is a FIFO, a device, a
    socket or a folder (:func:`kvbench.io.atomic.check_target`)."""
    check_targets(out_dir, names, _HINT)


def write_folder(out_dir: Path, frames: dict[str, pd.DataFrame], figures: dict, documents: dict) -> None:
    """Tables (Parquet + CSV), figures (``name -> matplotlib figure``) and JSON documents, then
    the ``COMPLETE`` marker that vouches for them."""
    made = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    names = folder_files(frames, [*figures, *documents])
    try:
        with folder_lock(out_dir):
            check_folder_files(out_dir, names)
            clear_incomplete(out_dir)
            with whole_or_none(out_dir, names):
                _write_files(out_dir, frames, figures, documents)
    except BaseException:
        if made:  # a folder made for this result, left empty: not left behind either
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise


def _write_files(out_dir: Path, frames: dict[str, pd.DataFrame], figures: dict, documents: dict) -> None:
    files: list[str] = []
    for name, frame in frames.items():
        write_frame(frame, out_dir, name)
        files += [f"{name}.parquet", f"{name}.csv"]
    for name, fig in figures.items():
        # the temporary name has no .png suffix: the format must be explicit
        write_file(out_dir / name, lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=110))
        files.append(name)
    for name, data in documents.items():
        write_json(out_dir / name, data)
        files.append(name)
    mark_complete(out_dir, files)


def fmt_seconds(value_s: float) -> str:
    """2 -> '2 s', 0.05 -> '50 ms': an SLO as a person writes it."""
    return f"{value_s:g} s" if value_s >= 1 else f"{value_s * 1e3:g} ms"
