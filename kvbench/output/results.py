"""A finished run and how it is written to ``results/``: Parquet (source of truth), CSV, config, figure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

TABLES = ("summary", "requests", "steps", "refusals")


@dataclass
class RunResult:
    """One job's outputs. ``summary`` is one row; ``out_dir`` is set once written."""

    config: dict[str, Any]
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    refusals: pd.DataFrame
    out_dir: Path | None = None

    def summary_frame(self) -> pd.DataFrame:
        return pd.DataFrame([self.summary])


def write_run(result: RunResult, out_dir: Path, *, steps: bool = True, figures: bool = True) -> Path:
    """Write the run's tables as Parquet and CSV, its resolved config, and its memory figure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frames = {"summary": result.summary_frame(), "requests": result.requests, "refusals": result.refusals}
    if steps:
        frames["steps"] = result.steps
    for name, frame in frames.items():
        frame.to_parquet(out_dir / f"{name}.parquet", index=False)
        frame.to_csv(out_dir / f"{name}.csv", index=False)
    (out_dir / "config.json").write_text(json.dumps(result.config, indent=2, default=str) + "\n")
    if figures and len(result.steps):
        from kvbench.output.figures import plot_memory_timeline

        plot_memory_timeline(result.steps, result.summary, out_dir / "memory.png")
    result.out_dir = out_dir
    return out_dir


def write_failure(out_dir: Path, label: str, reason: str) -> None:
    """Record a job that stopped on bad input, so a multirun's table can show it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "failed.json").write_text(json.dumps({"job": label, "error": reason}) + "\n")


def read_job(job_dir: Path) -> dict[str, Any] | None:
    """A job folder's summary row, or a failure row, or None when the folder holds neither."""
    summary = job_dir / "summary.parquet"
    if summary.is_file():
        return pd.read_parquet(summary).iloc[0].to_dict()
    failed = job_dir / "failed.json"
    if failed.is_file():
        return {"failed": True, **json.loads(failed.read_text())}
    return None
