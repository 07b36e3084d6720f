"""The comparison's folder, written only where ``--out DIR`` asks for it: compare.parquet (source
of truth), compare.csv, compare.png, each written atomically, and ``COMPLETE`` last."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.compare.figure import plot_changes
from kvbench.io.atomic import (
    COMPLETE,
    check_targets,
    clear_incomplete,
    folder_lock,
    mark_complete,
    write_frame,
)


def file_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The table as stored: base and head as float64 (a summary mixes ints and floats)."""
    stored = frame.copy()
    for column in ("base", "head"):
        stored[column] = pd.to_numeric(stored[column], errors="coerce").astype("float64")
    return stored


#: what ``--out DIR`` receives, besides ``COMPLETE``
FILES = ("compare.parquet", "compare.csv", "compare.png")


def save(frame: pd.DataFrame, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    with folder_lock(out_dir):
        check_targets(out_dir, (*FILES, COMPLETE), "remove it or choose another --out DIR")
        clear_incomplete(out_dir)
        write_frame(file_frame(frame), out_dir, "compare")
        plot_changes(frame, out_dir / "compare.png")
        mark_complete(out_dir, list(FILES))
    return out_dir
