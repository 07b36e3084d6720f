"""Sweep folders as ``kvbench -m`` leaves them, built in process (quicker than the CLI): each job's
results, its ``.hydra/overrides.yaml``, and the sweep's ``multirun.yaml`` naming what it swept."""

from __future__ import annotations

from collections.abc import Callable
from itertools import product
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kvbench.api import run
from kvbench.errors import ConfigError
from kvbench.output.results import write_failure, write_run

SMALL = ["workload.num_requests=40", "wandb.mode=disabled"]


def make_sweep(sweep_dir: Path, sweeps: dict[str, list[str]], fixed: list[str] = ()) -> Path:
    """Run every combination of ``sweeps`` (key -> values, as typed after ``key=``) with ``fixed``
    overrides, writing each job as the CLI does (a job with bad input leaves its failure record)."""
    task = [f"{key}={','.join(values)}" for key, values in sweeps.items()] + [*fixed, *SMALL]
    OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"task": task}}}), sweep_dir / "multirun.yaml")
    for num, values in enumerate(product(*sweeps.values())):
        overrides = [f"{key}={value}" for key, value in zip(sweeps, values)] + [*fixed, *SMALL]
        job_dir = sweep_dir / str(num)
        (job_dir / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create(overrides), job_dir / ".hydra" / "overrides.yaml")
        label = ",".join(overrides)
        try:
            result = run(overrides)
        except ConfigError as exc:
            write_failure(job_dir, label, str(exc))
            continue
        result.summary["job"] = label
        write_run(result, job_dir, figures=False)
    return sweep_dir


@pytest.fixture(scope="session")
def sweep(tmp_path_factory) -> Callable[..., Path]:
    """``sweep(name, sweeps, fixed)``: a sweep folder, built once per session and name."""
    built: dict[str, Path] = {}

    def get(name: str, sweeps: dict[str, list[str]], fixed: list[str] = ()) -> Path:
        if name not in built:
            built[name] = make_sweep(tmp_path_factory.mktemp(name), sweeps, fixed)
        return built[name]

    return get


@pytest.fixture
def allocator_sweep(sweep) -> Path:
    """The quick start's sweep: ``-m allocator=naive,per_request,paged``."""
    return sweep("allocators", {"allocator": ["naive", "per_request", "paged"]})


@pytest.fixture
def block_preemption_sweep(sweep) -> Path:
    """Two keys (one group, one nested key), a budget small enough to preempt, and a bad block size."""
    return sweep(
        "blocks",
        {"allocator.block_size_tokens": ["16", "7", "64"], "preemption": ["recompute", "swap"]},
        ["hardware.kv_budget_bytes=5e9"],
    )
