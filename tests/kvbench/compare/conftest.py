"""A small real sweep (two allocators, 40 requests), run once through the kvbench CLI, and
helpers that copy and edit it the way a regression or a broken run would."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from kvbench_cli import kvbench

SWEEP_ARGS = (
    "-m",
    "allocator=naive,paged",
    "workload.num_requests=40",
    "output.steps=false",
    "output.figures=false",
    "wandb.mode=disabled",
    "progress=false",
)


@pytest.fixture(scope="session")
def sweep_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("compare_sweep")
    proc = kvbench(*SWEEP_ARGS, "hydra.sweep.dir=sweep", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root / "sweep"


@pytest.fixture
def two_copies(sweep_dir, tmp_path) -> tuple[Path, Path]:
    """BASE and HEAD: two copies of the same sweep, free to edit."""
    return shutil.copytree(sweep_dir, tmp_path / "base"), shutil.copytree(sweep_dir, tmp_path / "head")


def _edit_summary(job_dir: Path, **values) -> None:
    from kvbench.io.atomic import write_table_parquet
    from kvbench.io.table import ColumnTable

    frame = pd.read_parquet(job_dir / "summary.parquet")
    for column, value in values.items():
        frame[column] = value
    # kvbench's own writer: the same schema, so a file of the same size (the marker still vouches for it)
    write_table_parquet(ColumnTable.from_pandas(frame), job_dir / "summary.parquet")


@pytest.fixture
def edit_summary():
    """``edit_summary(job_dir, column=value, ...)``: change summary values in place, leaving the
    folder complete (its COMPLETE marker untouched), as a real regression would read."""
    return _edit_summary


@pytest.fixture
def summary_value():
    """``summary_value(job_dir, column)``: one value of a job's summary."""
    return lambda job_dir, column: pd.read_parquet(job_dir / "summary.parquet")[column].iloc[0]
