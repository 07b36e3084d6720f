"""Sweeps through Hydra's other launchers (docs/launchers.md): joblib's local worker processes,
Submitit's local executor (the code path of its Slurm one) and a local Ray instance run the same
jobs as the serial launcher, to the same results, one comparison table, and the same exit status
when a job fails. Each launcher is an optional extra: its test is skipped where it is not installed."""

from __future__ import annotations

import tempfile

import pandas as pd
import pytest
from kvbench_cli import kvbench

#: two allocators, two seeds of which one (-1) is refused when its job runs: two results, two failures
SWEEP = [
    "-m",
    "allocator=naive,paged",
    "seed=0,-1",
    "workload.num_requests=30",
    "progress=false",
    "wandb.mode=disabled",
    "output.steps=false",
    "output.figures=false",
]


def comparison_of(table: pd.DataFrame) -> pd.DataFrame:
    """A comparison table less what measures the machine rather than the run (wall-clock times)."""
    return table.drop(columns=[c for c in table.columns if "wall" in c])


def comparison(sweep) -> pd.DataFrame:
    return comparison_of(pd.read_parquet(sweep / "comparison.parquet")).sort_values("job_num", ignore_index=True)


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> pd.DataFrame:
    cwd = tmp_path_factory.mktemp("serial")
    proc = kvbench(*SWEEP, "hydra.sweep.dir=sweep", cwd=cwd)
    assert proc.returncode == 1, proc.stderr  # a failed job fails the command, after the others ran
    table = comparison(cwd / "sweep")
    assert list(table["status"]) == ["ok", "failed", "ok", "failed"]
    return table


#: Hydra's log on stderr, where the launchers' lines show that they ran the jobs (kvbench's
#: logging options drop Hydra's INFO lines; they never go to stdout, which holds the table)
HYDRA_INFO = "hydra.hydra_logging.root.level=INFO"


def assert_like_serial(proc, sweep, serial: pd.DataFrame) -> None:
    assert proc.returncode == 1, proc.stderr  # the failures are read from the sweep folder
    assert proc.stdout.startswith("kvbench comparison (4 jobs)"), proc.stdout
    assert proc.stdout.count("kvbench comparison (4 jobs)") == 1, proc.stdout
    assert "Launch" not in proc.stdout and "launch" not in proc.stdout, "Hydra's log on stdout"
    assert (sweep / "comparison.csv").is_file() and (sweep / "comparison.png").is_file()
    pd.testing.assert_frame_equal(comparison(sweep), serial)


def test_a_sweep_split_across_machines_is_one_folder_each_then_one_table(tmp_path, serial):
    """docs/launchers.md's recipe without a launcher: each machine its share of the values and its
    own sweep folder (one shared folder would number both shares' jobs from 0), then one table.
    ``choice(v)`` keeps a key swept with one value: its ``swept.*`` column and label stay."""
    for machine, allocator in (("host-a", "naive"), ("host-b", "paged")):
        share = [f"allocator=choice({allocator})" if arg.startswith("allocator=") else arg for arg in SWEEP]
        proc = kvbench(*share, f"hydra.sweep.dir=study/{machine}", cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr  # its seed=-1 job
    folders = sorted((tmp_path / "study").glob("*/comparison.parquet"))
    table = pd.concat([pd.read_parquet(f) for f in folders], ignore_index=True)
    # only the job numbers are per folder: every row is the one-machine sweep's
    one_sweep = serial.drop(columns="job_num").sort_values("job", ignore_index=True)
    pd.testing.assert_frame_equal(
        comparison_of(table).drop(columns="job_num").sort_values("job", ignore_index=True), one_sweep
    )


def test_a_joblib_sweep_s_stdout_is_the_table_alone(tmp_path):
    """With Hydra's default logging, joblib's ~250-character ``Joblib.Parallel(...)`` line and the
    launcher's ``Launching jobs, sweep output dir`` went to stdout above the table."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    proc = kvbench(*SWEEP[:2], *SWEEP[3:], "hydra/launcher=joblib", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("kvbench comparison (2 jobs)") and lines[-1] == "comparison: sweep/comparison.csv"
    assert not [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "oblib" in line]


def test_a_joblib_sweep_gives_the_serial_results(tmp_path, serial):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    proc = kvbench(
        *SWEEP, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=sweep", HYDRA_INFO, cwd=tmp_path
    )
    assert "Joblib.Parallel(n_jobs=2" in proc.stderr, "not run by joblib"
    assert_like_serial(proc, tmp_path / "sweep", serial)


def test_a_submitit_local_sweep_gives_the_serial_results(tmp_path, serial):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = kvbench(*SWEEP, "hydra/launcher=submitit_local", "hydra.sweep.dir=sweep", HYDRA_INFO, cwd=tmp_path)
    assert "Submitit 'local' sweep output dir" in proc.stderr, "not run by submitit"
    assert_like_serial(proc, tmp_path / "sweep", serial)


def test_a_ray_sweep_on_a_local_instance_gives_the_serial_results(tmp_path, serial, monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # Ray would report usage to its servers
    # a throwaway instance on this machine, gone with the test: no token written to ~/.ray
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # Ray's Unix sockets live under its temp folder: a short path, within the 107-byte socket limit
    with tempfile.TemporaryDirectory(prefix="kvb-ray-", dir="/tmp") as ray_tmp:
        proc = kvbench(
            *SWEEP,
            "hydra/launcher=ray",
            "+hydra.launcher.ray.init.num_cpus=2",
            "+hydra.launcher.ray.init.include_dashboard=false",
            f"+hydra.launcher.ray.init._temp_dir={ray_tmp}",
            "hydra.sweep.dir=sweep",
            HYDRA_INFO,
            cwd=tmp_path,
        )
    assert "Ray Launcher is launching 4 jobs" in proc.stderr, "not run by Ray"
    assert_like_serial(proc, tmp_path / "sweep", serial)
