"""Run folders: written with a marker, rewritten cleanly, and read only when complete."""

from __future__ import annotations

import pandas as pd

from kvbench.atomic import COMPLETE
from kvbench.output.results import RunResult, finished_config, read_job, write_failure, write_run


def _result(steps_rows: int = 0) -> RunResult:
    return RunResult(
        config={"seed": 0, "progress": True},
        summary={"job": "allocator=paged", "peak_concurrency": 3},
        requests=pd.DataFrame({"request_id": [0]}),
        steps=pd.DataFrame({"step": range(steps_rows)}),
        refusals=pd.DataFrame({"step": []}),
    )


def test_a_written_run_is_complete_and_reads_back(tmp_path):
    write_run(_result(), tmp_path, steps=True, figures=False)
    assert read_job(tmp_path)["peak_concurrency"] == 3
    assert finished_config(tmp_path) == {"seed": 0, "progress": True}


def test_tables_without_the_marker_are_flagged_not_read(tmp_path):
    write_run(_result(), tmp_path, steps=True, figures=False)
    (tmp_path / COMPLETE).unlink()  # as if killed between the last table and the marker
    row = read_job(tmp_path)
    assert row["failed"] and row["status"] == "incomplete" and "not read" in row["error"]
    assert "peak_concurrency" not in row and finished_config(tmp_path) is None


def test_rewriting_a_folder_drops_tables_the_new_run_does_not_write(tmp_path):
    write_run(_result(), tmp_path, steps=True, figures=False)
    write_run(_result(), tmp_path, steps=False, figures=False)
    assert not (tmp_path / "steps.parquet").exists() and read_job(tmp_path)["peak_concurrency"] == 3


def test_a_failure_replaces_an_earlier_result(tmp_path):
    write_run(_result(), tmp_path, figures=False)
    write_failure(tmp_path, "seed=-1", "seed=-1 is invalid")
    assert read_job(tmp_path) == {"failed": True, "status": "failed", "job": "seed=-1", "error": "seed=-1 is invalid"}


def test_an_empty_folder_is_no_job(tmp_path):
    assert read_job(tmp_path) is None


def test_a_job_killed_before_writing_anything_is_incomplete(tmp_path):
    # Hydra wrote the job's .hydra/ when it started; nothing else followed
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- allocator=paged\n")
    row = read_job(tmp_path)
    assert row["status"] == "incomplete" and row["failed"] and row["job"] == "allocator=paged"
