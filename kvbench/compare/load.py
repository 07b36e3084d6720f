"""One side of a comparison: a run folder (one job) or a sweep folder (its numbered jobs), read
only through :func:`kvbench.output.results.read_job`, so an incomplete or failed job is flagged and
never read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.compare.configs import flatten, is_ignored
from kvbench.errors import ConfigError
from kvbench.output.results import finished_config, read_job
from kvbench.output.sweep_info import job_overrides, swept_keys, swept_values


@dataclass
class Job:
    """One finished job: its summary row, its resolved config and a label saying what it ran."""

    folder: Path
    summary: dict[str, Any]
    config: dict[str, Any]
    label: str


def _job_folders(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def _read(job_dir: Path, side: str) -> tuple[dict, dict] | str:
    """(summary, config) of a finished job, or why it cannot be compared."""
    try:
        row = read_job(job_dir)
    except (OSError, ValueError) as exc:  # a damaged table in a folder marked complete
        return f"{side} {job_dir} cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if row is None:
        return f"{side} {job_dir} holds no result (the job never ran or was interrupted before writing)"
    if row.get("failed"):
        status = row.get("status", "failed")
        return f"{side} {job_dir} is {status} ({str(row.get('error', '')).split(';')[0]})"
    try:
        config = finished_config(job_dir)
    except ConfigError as exc:
        return f"{side} {job_dir}: {exc}"
    if config is None:
        return f"{side} {job_dir} has no config.json, so it cannot be matched"
    return row, config


def load_side(folder: Path, side: str) -> list[Job]:
    """Every job of ``folder`` (``side`` is "base" or "head", for messages). A ConfigError when the
    folder is missing, holds no kvbench result, or any job in it is incomplete or failed."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{side} {folder} does not exist or is not a folder; give a kvbench run or sweep folder")
    single = read_job(folder) is not None
    job_dirs = [folder] if single else _job_folders(folder)
    if not job_dirs:
        raise ConfigError(
            f"{side} {folder} is not a kvbench result folder (no COMPLETE marker and no numbered job "
            "folders); give a run folder (results/runs/<date>/<time>) or a sweep folder "
            "(results/multirun/<date>/<time>)"
        )
    read = [_read(d, side) for d in job_dirs]
    problems = [r for r in read if isinstance(r, str)]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"{problems[0]}{more}: not compared; finish or re-run the job(s) first")
    keys = [] if single else swept_keys(folder)
    labels = [_swept_label(d, keys) for d in job_dirs] if keys else _difference_labels([c for _, c in read])
    if single and labels == ["run"]:
        # a single run's own overrides, less those that cannot change a number (output, progress...)
        own = {k: v for k, v in job_overrides(folder).items() if not is_ignored(k)}
        labels = [" ".join(f"{k}={v}" for k, v in own.items()) or "run"]
    return [Job(d, summary, config, label) for d, (summary, config), label in zip(job_dirs, read, labels)]


def _swept_label(job_dir: Path, keys: list[str]) -> str:
    return " ".join(f"{key}={value}" for key, value in swept_values(job_dir, keys).items())


def _difference_labels(configs: list[dict]) -> list[str]:
    """Without a record of what was swept: each job's values of the keys that differ between jobs."""
    flats = [{k: v for k, v in flatten(c).items() if not is_ignored(k)} for c in configs]
    keys = sorted({k for f in flats for k in f})
    varying = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
    return [" ".join(f"{k}={f.get(k)}" for k in varying) or "run" for f in flats]
