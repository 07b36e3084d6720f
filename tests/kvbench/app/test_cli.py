"""The `kvbench` command as a user runs it: sweeps, one table, one-line errors, outside plugins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvbench_cli import assert_one_line_error, kvbench

SMALL = ["workload.num_requests=40", "wandb.mode=disabled", "progress=false"]
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "outside_plugin"




def test_sweep_runs_four_jobs_and_prints_one_table(tmp_path):
    proc = kvbench("-m", "allocator=naive,paged", "kernel=triton,flashinfer", *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("kvbench comparison (4 jobs)") == 1
    # the kernel axis changes nothing without a calibration, and the line above the table says so
    assert "kernel=flashinfer and kernel=triton run at the same simulated speed: no calibration for h100-sxm" in " ".join(
        proc.stdout.split())
    [sweep] = list((tmp_path / "results" / "multirun").glob("*/*"))
    table = pd.read_csv(sweep / "comparison.csv")
    assert len(table) == 4 and set(table["allocator"]) == {"naive", "paged"}
    assert set(table["kernel"]) == {"triton", "flashinfer"} and (table["calibration"] == "uncalibrated").all()
    assert (sweep / "comparison.png").is_file()
    # sustained beside peak, whole-run beside saturated, and the unfilled tail as its own column
    for header in ("peak seqs", "floor (sat.)", "util.", "util. (sat.)", "unfilled/seq"):
        assert header in proc.stdout
    assert {"min_concurrency_saturated", "utilization_mean", "mean_tail_waste_tokens_per_seq"} <= set(table)
    for job in range(4):
        assert (sweep / str(job) / "summary.parquet").is_file() and (sweep / str(job) / "memory.png").is_file()


def test_a_single_run_writes_parquet_csv_config_and_figure(tmp_path):
    proc = kvbench("allocator=naive", *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [run_dir] = list((tmp_path / "results" / "runs").glob("*/*"))
    for name in ("summary", "requests", "steps", "refusals"):
        assert (run_dir / f"{name}.parquet").is_file() and (run_dir / f"{name}.csv").is_file()
    assert (run_dir / "config.json").is_file() and (run_dir / "memory.png").is_file()
    assert "peak concurrency" in proc.stdout


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["allocator=pagd"], ["allocator='pagd'", "naive", "paged"]),
        (["allocator.block_size_tokens=7"], ["allocator.block_size_tokens=7", "power of two from 8 to 256"]),
        (["workload.arrival=poisson", "workload.rate_per_s=-2"], ["workload.rate_per_s=-2", "positive"]),
        (["allocator=naive", "workload.prompt_tokens=5000"], ["5000", "S_max"]),
        (["workload.rat=3"], ["workload.rat=3", "rate_per_s"]),
        (["mode=real"], ["mode='real'"]),
        (["seed=abc"], ["seed=abc", "Integer"]),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, fragments):
    assert_one_line_error(kvbench(*args, *SMALL, cwd=tmp_path), *fragments)


def test_a_bad_job_does_not_stop_the_sweep(tmp_path):
    proc = kvbench("-m", "allocator.block_size_tokens=16,7,32", *SMALL, cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    [sweep] = list((tmp_path / "results" / "multirun").glob("*/*"))
    table = pd.read_csv(sweep / "comparison.csv")
    assert len(table) == 3
    failed = table[table["failed"]]
    assert len(failed) == 1 and "power of two" in failed["error"].iloc[0]
    assert "failed" in proc.stdout


@pytest.fixture
def outside_plugin():
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "install", "--quiet", "--no-deps", "--no-build-isolation", str(FIXTURE)], check=True)
    yield
    subprocess.run([*pip, "uninstall", "--quiet", "--yes", "kvbench-outside-example"], check=True)


def test_an_outside_distribution_adds_an_allocator(tmp_path, outside_plugin):
    proc = kvbench("allocator=lifo_paged", *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [run_dir] = list((tmp_path / "results" / "runs").glob("*/*"))
    assert pd.read_parquet(run_dir / "summary.parquet")["allocator"].iloc[0] == "lifo_paged"


def test_help_lists_every_config_group_with_its_options(tmp_path):
    proc = kvbench("--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert "scheduler: chunked, mixed, prefill_first, static" in proc.stdout
    assert "preemption: length_aware, recompute, swap" in proc.stdout
    assert "kvbench -m preemption=recompute,swap,length_aware scheduler=mixed,prefill_first,chunked" in proc.stdout
