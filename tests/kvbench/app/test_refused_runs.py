"""A single run refused inside its job (a value only the run's setup checks) leaves no folder:
the one Hydra made for it, holding only Hydra's own files, goes again, with the parents this
command made for it. A folder that was there before (a user's ``hydra.run.dir=``) stays, with its
files, and so does a sweep's failed job (its record says why it failed)."""

from __future__ import annotations

import pytest
from kvbench_cli import assert_one_line_error, kvbench

SMALL = ["wandb.mode=disabled", "progress=false"]
REFUSED = "workload.num_requests=0"  # checked by the run's setup, inside Hydra's job
#: Hydra's job log as Hydra writes it by default (an empty kvbench.log), and none at all
LOGGING = ["hydra/job_logging=default", "hydra/job_logging=disabled"]


def _tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def refuse(tmp_path, *args):
    proc = kvbench(*args, REFUSED, *SMALL, cwd=tmp_path)
    assert_one_line_error(proc, "workload.num_requests=0", status=2)


@pytest.mark.parametrize("logging", LOGGING)
def test_a_refused_run_leaves_no_folder(tmp_path, logging):
    refuse(tmp_path, logging)
    assert _tree(tmp_path) == set()  # not even results/: this command made it


@pytest.mark.parametrize("logging", LOGGING)
def test_a_refused_run_leaves_the_results_that_were_there(tmp_path, logging):
    earlier = tmp_path / "results" / "runs" / "2020-01-01" / "00-00-00-000000"
    earlier.mkdir(parents=True)
    (earlier / "summary.json").write_text("{}")
    (tmp_path / "results" / "runs" / "empty-by-hand").mkdir()
    before = _tree(tmp_path)
    refuse(tmp_path, logging)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("logging", LOGGING)
@pytest.mark.parametrize("folder", ["new/deep/run", "out/run-${now:%H-%M-%S-%f}", "out/${now:%Y}/${now:%H-%M-%S-%f}"])
def test_a_refused_run_into_a_new_named_folder_leaves_nothing(tmp_path, logging, folder):
    (tmp_path / "kept").mkdir()
    refuse(tmp_path, logging, f"hydra.run.dir={folder}")
    assert _tree(tmp_path) == {"kept"}


@pytest.mark.parametrize("logging", LOGGING)
def test_a_refused_run_into_an_existing_folder_leaves_it_and_its_files(tmp_path, logging):
    mine, empty = tmp_path / "mine", tmp_path / "empty"
    mine.mkdir()
    empty.mkdir()
    (mine / "notes.txt").write_text("mine")
    refuse(tmp_path, logging, f"hydra.run.dir={mine}")
    refuse(tmp_path, logging, f"hydra.run.dir={empty}")
    assert (mine / "notes.txt").read_text() == "mine"
    assert empty.is_dir()  # it held nothing, yet it was the user's


def test_a_sweep_keeps_its_failed_job_s_record(tmp_path):
    proc = kvbench("-m", "workload.num_requests=0,5", *SMALL, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    [sweep] = (tmp_path / "results" / "multirun").glob("*/*")
    assert (sweep / "0").is_dir() and (sweep / "1" / "COMPLETE").is_file()


# --- the rule itself, without Hydra: only Hydra's files of this command, never anything else ----


def _hydra_made(folder, log: str | None = None):
    """What Hydra writes into a job's folder before the job runs."""
    (folder / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (folder / ".hydra" / name).write_text("x: 1\n")
    if log is not None:
        (folder / "kvbench.log").write_text(log)


@pytest.fixture
def started(tmp_path, monkeypatch):
    """A command started in ``tmp_path``, where earlier runs made ``results/runs/``, with results in
    the default, clock-named folders."""
    from kvbench.app import folders

    (tmp_path / "results" / "runs").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(folders, "_BEFORE", None)
    folders.prepare_output(["workload.num_requests=0"])
    return folders


PATTERN = "results/runs/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}"


def test_a_folder_holding_anything_else_stays(tmp_path, started):
    run = tmp_path / "results" / "runs" / "d" / "t"
    _hydra_made(run)
    (run / "steps.parquet").write_text("")
    assert not started.remove_refused_run(run, PATTERN, ".hydra")
    assert (run / "steps.parquet").is_file() and (run / ".hydra" / "config.yaml").is_file()


def test_hydra_files_from_before_this_command_stay(tmp_path, monkeypatch):
    import os

    from kvbench.app import folders

    # a folder the pattern names again (a coarse clock), left by an earlier run that wrote nothing
    run = tmp_path / "results" / "runs" / "d" / "t"
    _hydra_made(run, log="")
    an_hour_ago_s = run.stat().st_mtime - 3600
    for path in (run, *run.rglob("*")):
        os.utime(path, (an_hour_ago_s, an_hour_ago_s))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(folders, "_BEFORE", None)
    folders.prepare_output([])
    (run / ".hydra" / "config.yaml").write_text("x: 2\n")  # this command's Hydra rewrites its files
    assert not folders.remove_refused_run(run, PATTERN, ".hydra")
    assert (run / "kvbench.log").is_file()


def test_a_folder_named_by_a_config_file_without_interpolation_stays(tmp_path, started):
    run = tmp_path / "fixed"
    _hydra_made(run)
    assert not started.remove_refused_run(run, "fixed", ".hydra")
    assert run.is_dir()


def test_without_a_record_of_before_nothing_is_removed(tmp_path, monkeypatch):
    from kvbench.app import folders

    monkeypatch.setattr(folders, "_BEFORE", None)
    run = tmp_path / "t"
    _hydra_made(run)
    assert not folders.remove_refused_run(run, str(tmp_path / "${now:%H}"), ".hydra") and run.is_dir()


def test_a_fresh_folder_of_hydra_s_files_goes_with_its_clock_named_parents(tmp_path, started):
    run = tmp_path / "results" / "runs" / "d" / "t"
    _hydra_made(run)
    assert started.remove_refused_run(run, PATTERN, ".hydra")
    assert _tree(tmp_path) == {"results", "results/runs"}  # the pattern's fixed folder stays
