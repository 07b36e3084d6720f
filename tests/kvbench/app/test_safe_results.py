"""Results a user can trust: a run killed mid-write is flagged, not read; an interrupted sweep
resumes; signals end with one line; one folder, one writer; a folder that cannot be written is one
line before any work."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from kvbench_cli import error_lines, kvbench
from locks import held_lock

SMALL = ["workload.num_requests=30", "wandb.mode=disabled", "progress=false"]

# Runs kvbench with the table writers wrapped: when it reaches the named table of the given job
# folder, it does what a user, the kernel or a full disk would do mid-write (the step table is
# written during the run, the others after it).
PRELUDE = """
import os, signal, sys
from pathlib import Path
import kvbench.output.results as results
# a shell running this test in the background may have set SIGINT to "ignored", which Python then
# keeps: restore the default (KeyboardInterrupt) that a user's Ctrl-C meets
signal.signal(signal.SIGINT, signal.default_int_handler)
action, table, job = sys.argv[1], sys.argv[2], sys.argv[3]
del sys.argv[1:4]
real = results.write_table
def write_table(table_, out_dir, name):
    if name == table and (job == "*" or Path(out_dir).name == job):
        if action == "enospc":
            raise OSError(28, "No space left on device")
        os.kill(os.getpid(), getattr(signal, action))
    return real(table_, out_dir, name)
results.write_table = write_table
# the step table is written while the run goes, a batch of rows at a time
import kvbench.output.step_files as step_files
real_batch = step_files.StepFiles._write
def write_batch(self, batch):
    if table == "steps" and (job == "*" or Path(self.out_dir).name == job):
        if action == "enospc":
            raise OSError(28, "No space left on device")
        os.kill(os.getpid(), getattr(signal, action))
    return real_batch(self, batch)
step_files.StepFiles._write = write_batch
from kvbench.commands.main import main
main()
"""


def run(*args: str, cwd: Path, fault: tuple[str, str, str] | None = None) -> subprocess.CompletedProcess:
    """``kvbench <args>``, with the fault injected when given (action, table, job folder or "*")."""
    if fault is None:
        return kvbench(*args, cwd=cwd)
    return kvbench(*fault, *args, cwd=cwd, code=PRELUDE)


def notices(proc: subprocess.CompletedProcess) -> list[str]:
    return error_lines(proc, prefix="kvbench: ")


def test_a_sweep_killed_mid_write_is_flagged_then_resumed(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "allocator=naive,paged", f"hydra.sweep.dir={sweep}", *SMALL]
    killed = run(*args, cwd=tmp_path, fault=("SIGKILL", "refusals", "1"))
    assert killed.returncode == -9
    # job 1 died between its summary table and its marker: its summary is on disk, and whole
    assert (sweep / "1" / "summary.parquet").is_file() and not (sweep / "1" / "COMPLETE").exists()
    from kvbench.output.report import comparison_frame

    frame = comparison_frame(sweep).set_index("job_num")
    assert frame.loc[0, "allocator"] == "naive" and pd.isna(frame.loc[0, "status"])  # a result, read
    assert frame.loc[1, "status"] == "incomplete" and pd.isna(frame.loc[1, "peak_concurrency"])

    resumed = run(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert any("job 0" in line and "already complete" in line for line in notices(resumed))
    table = pd.read_csv(sweep / "comparison.csv")
    assert list(table["allocator"]) == ["naive", "paged"] and not table["failed"].any()


@pytest.mark.parametrize("signame, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_ends_a_sweep_with_one_line_and_nothing_that_looks_complete(tmp_path, signame, status):
    sweep = tmp_path / "sweep"
    proc = run(
        "-m",
        "allocator=naive,paged",
        f"hydra.sweep.dir={sweep}",
        *SMALL,
        cwd=tmp_path,
        fault=(signame, "requests", "1"),
    )
    assert proc.returncode == status
    [line] = notices(proc)
    assert line.startswith(f"kvbench: interrupted by {signame}") and f"hydra.sweep.dir={sweep}" in line
    assert "1 job(s) complete" in line
    assert (sweep / "0" / "COMPLETE").is_file() and not (sweep / "1" / "COMPLETE").exists()
    assert not list(sweep.glob("*/.tmp-*")) and not (sweep / ".kvbench.lock").exists()


def test_a_full_disk_is_one_line_and_leaves_no_result(tmp_path):
    proc = run(f"hydra.run.dir={tmp_path / 'run'}", *SMALL, cwd=tmp_path, fault=("enospc", "steps", "*"))
    assert proc.returncode == 2
    [line] = notices(proc)
    assert line.startswith("kvbench: error: could not write the results to") and "No space left on device" in line
    assert not (tmp_path / "run" / "COMPLETE").exists() and not list((tmp_path / "run").glob(".tmp-*"))


@pytest.mark.parametrize("table", ["requests", "refusals"])
def test_a_full_disk_after_some_tables_leaves_none_of_the_run_s_files(tmp_path, table):
    """Each file is written atomically, and the set is too: the tables written before the disk
    filled (the step table, the summary) go with the run, never left without a COMPLETE."""
    proc = run(f"hydra.run.dir={tmp_path / 'run'}", *SMALL, cwd=tmp_path, fault=("enospc", table, "*"))
    assert proc.returncode == 2
    left = sorted(p.name for p in (tmp_path / "run").iterdir()) if (tmp_path / "run").exists() else []
    assert left in ([], [".hydra"]), left


def test_a_signal_while_the_step_table_is_written_leaves_no_temporary_file(tmp_path):
    """The step table is written during the run: a signal there ends it with one line, and the
    table's temporary files go with it."""
    proc = run(f"hydra.run.dir={tmp_path / 'run'}", *SMALL, cwd=tmp_path, fault=("SIGTERM", "steps", "*"))
    assert proc.returncode == 143
    [line] = notices(proc)
    assert line.startswith("kvbench: interrupted by SIGTERM")
    assert not (tmp_path / "run" / "COMPLETE").exists() and not list((tmp_path / "run").glob(".tmp-*"))
    assert not (tmp_path / "run" / "steps.parquet").exists()


def test_a_second_run_into_a_folder_being_written_is_refused(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    with held_lock(folder) as holder:
        proc = kvbench(f"hydra.run.dir={folder}", *SMALL, cwd=tmp_path)
    assert proc.returncode == 2
    [line] = notices(proc)
    assert f"being written by another kvbench run (pid {holder.pid} on " in line
    assert not (folder / "summary.parquet").exists()


@pytest.mark.parametrize(
    "folder, fragment",
    [
        ("a_file/run", "is a file, not a folder"),
        ("x" * 300, "over this filesystem's"),
        ("/proc/kvbench-results", "cannot write /proc/kvbench-results"),
    ],
)
def test_an_unusable_results_folder_is_one_line_before_any_work(tmp_path, folder, fragment):
    (tmp_path / "a_file").write_text("")
    proc = kvbench(f"hydra.run.dir={folder}", *SMALL, cwd=tmp_path)
    assert proc.returncode == 2
    [line] = notices(proc)
    assert line.startswith("kvbench: error: hydra.run.dir=") and fragment in line, line


# Runs kvbench with one function replaced by a fault: a full disk where Hydra saves the job's
# config, or a signal while the folder lock is being taken
HYDRA_SAVE_ENOSPC = """
import hydra.core.utils as utils
def _save_config(*args, **kwargs):
    raise OSError(28, "No space left on device", "results/x/.hydra/config.yaml")
utils._save_config = _save_config
from kvbench.commands.main import main
main()
"""

SIGNAL_IN_LOCK = """
import os, signal
import kvbench.io.atomic as atomic
def _write_owner(fd):
    os.kill(os.getpid(), signal.SIGTERM)
atomic._write_owner = _write_owner
from kvbench.commands.main import main
main()
"""


def test_a_disk_full_when_hydra_saves_its_config_is_one_line(tmp_path):
    proc = kvbench(f"hydra.run.dir={tmp_path / 'run'}", *SMALL, cwd=tmp_path, code=HYDRA_SAVE_ENOSPC)
    assert proc.returncode == 2
    [line] = notices(proc)
    assert line.startswith("kvbench: error: could not write results/x/.hydra/config.yaml: No space left on device")


def test_a_signal_while_the_lock_is_taken_is_one_line_and_releases_it(tmp_path):
    proc = kvbench(f"hydra.run.dir={tmp_path / 'run'}", *SMALL, cwd=tmp_path, code=SIGNAL_IN_LOCK)
    assert proc.returncode == 143
    [line] = notices(proc)
    assert line.startswith("kvbench: interrupted by SIGTERM")
    assert not (tmp_path / "run" / ".kvbench.lock").exists()


# the second run of a resumed sweep reports a different kvbench than the one that computed job 0
OTHER_VERSION = """
import kvbench.output.provenance as provenance
provenance.kvbench_version.cache_clear()
provenance.kvbench_version = lambda: "9.9.9"
from kvbench.commands.main import main
main()
"""


def test_a_resumed_sweep_reruns_jobs_of_another_kvbench_or_calibration(tmp_path):
    sweep, calibrations = tmp_path / "sweep", tmp_path / "cal"
    (calibrations / "h100-sxm").mkdir(parents=True)
    (calibrations / "h100-sxm" / "triton.json").write_text(json.dumps({"efficiency": {"16": 0.5}}))
    args = ["-m", "allocator=naive,paged", f"hydra.sweep.dir={sweep}", f"calibration_dir={calibrations}", *SMALL]
    assert run(*args, cwd=tmp_path).returncode == 0
    again = run(*args, cwd=tmp_path)
    assert sum("already complete" in line for line in notices(again)) == 2  # nothing changed: skipped
    (calibrations / "h100-sxm" / "triton.json").write_text(json.dumps({"efficiency": {"16": 0.25}}))
    changed = run(*args, cwd=tmp_path)
    assert changed.returncode == 0, changed.stderr
    lines = notices(changed)
    assert sum("another calibration file" in line and "re-running it" in line for line in lines) == 2, lines
    newer = kvbench(*args, cwd=tmp_path, code=OTHER_VERSION)
    assert newer.returncode == 0, newer.stderr
    assert sum("not by this kvbench 9.9.9" in line for line in notices(newer)) == 2, newer.stderr
    assert set(pd.read_parquet(sweep / "0" / "summary.parquet")["kvbench_version"]) == {"9.9.9"}


def test_an_unwritable_default_folder_is_named_not_called_a_bad_option(tmp_path, monkeypatch):
    """A read-only ``results/`` (the default, no hydra.run.dir given): the line names the folder and
    how to fix it, and never says the user gave a bad hydra.run.dir."""
    from kvbench.app import folders
    from kvbench.errors import ConfigError

    (tmp_path / "results").mkdir()
    monkeypatch.chdir(tmp_path)
    real_access = folders.os.access
    monkeypatch.setattr(folders.os, "access", lambda p, mode: Path(p).name != "results" and real_access(p, mode))
    for args, option in (([], "hydra.run.dir"), (["-m"], "hydra.sweep.dir")):
        with pytest.raises(ConfigError) as refused:
            folders.prepare_output(args)
        line = str(refused.value)
        assert line.startswith(f"cannot write the results: {tmp_path / 'results'} is not writable"), line
        assert f"write elsewhere with {option}=<folder>" in line and f"{option}=" not in line.split(";")[0]
    with pytest.raises(ConfigError, match=r"^hydra.run.dir='results/x' is invalid: .* is not writable"):
        folders.prepare_output(["hydra.run.dir=results/x"])
