"""Run folders: written with a marker, rewritten cleanly, and read only when complete."""

from __future__ import annotations

import pandas as pd

from kvbench.io.atomic import COMPLETE
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


def test_the_tables_are_columns_and_dataframes_alike_and_a_frame_set_is_what_is_written(tmp_path):
    from kvbench.io.table import ColumnTable

    result = RunResult(
        config={},
        summary={"job": "j"},
        requests=ColumnTable({"request_id": [0, 1]}),
        steps=None,
        refusals=ColumnTable({"step": []}),
    )
    assert isinstance(result.requests, pd.DataFrame) and result.requests is result.requests  # made once
    assert result.requests["request_id"].tolist() == [0, 1] and result.steps is None
    frame = pd.DataFrame({"step": [0, 1], "num_running": [3, 4]})
    result.steps = frame  # a frame set replaces the columns that are written
    assert result.steps is frame and result.step_columns.columns == ["step", "num_running"]
    write_run(result, tmp_path, steps=True, figures=False)
    assert pd.read_parquet(tmp_path / "steps.parquet")["num_running"].tolist() == [3, 4]


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


def test_writing_reports_its_files_and_reaches_the_total(tmp_path):
    """Writing a long run's tables and figures takes a second or more: progress counts the files."""
    import contextlib

    log = []

    @contextlib.contextmanager
    def progress(total, description):
        steps = []
        yield steps.append
        log.append((description, total, sum(steps)))

    write_run(_result(), tmp_path / "a", steps=True, figures=False, progress=progress)
    # summary, requests, refusals, steps: Parquet and CSV each; summary.json and config.json
    assert log == [("writing results", 10, 10)]
    log.clear()
    from kvbench.api import run

    result = run(["workload.num_requests=20", "progress=false", "wandb.mode=disabled"])
    write_run(result, tmp_path / "b", steps=False, figures=True, progress=progress)
    # three tables, two JSON files, the memory figure and the prefix-cache one (when the run cached
    # prefixes or could have: not this one, yet it counts among the files that may be written)
    assert log == [("writing results", 10, 10)]
    assert read_job(tmp_path / "b")["num_requests"] == 20
    assert (tmp_path / "b" / "memory.png").is_file() and not (tmp_path / "b" / "prefix_cache.png").exists()


def _streamed_run(folder, overrides):
    from kvbench.api import compose
    from kvbench.app.run import execute

    cfg, choices = compose(["workload.num_requests=40", "progress=false", "wandb.mode=disabled", *overrides])
    folder.mkdir()
    return execute(cfg, choices, steps_dir=folder)


def test_a_run_without_a_prefix_cache_reads_back_only_the_memory_figures_columns(tmp_path, monkeypatch):
    """Whether the prefix-cache figure is drawn is decided before any step is read back: a run that
    never cached reads its streamed table once, for the memory figure (on a long run, reading the
    cache's columns too set the peak memory)."""
    import kvbench.output.results as results
    from kvbench.output.figures import CACHE_STEP_COLUMNS, TIMELINE_STEP_COLUMNS

    read = []
    reader = results.read_step_columns

    def recording(path, columns=None, every=1):
        read.append(tuple(columns))
        return reader(path, columns, every)

    monkeypatch.setattr(results, "read_step_columns", recording)
    plain = _streamed_run(tmp_path / "plain", [])
    assert plain.step_column_max("cached_bytes") == 0.0
    write_run(plain, tmp_path / "plain", figures=True)
    assert read == [TIMELINE_STEP_COLUMNS] and not (tmp_path / "plain" / "prefix_cache.png").exists()
    read.clear()
    cached = _streamed_run(tmp_path / "cached", ["workload.shared_prefix_tokens=256", "allocator.prefix_caching=true"])
    write_run(cached, tmp_path / "cached", figures=True)
    assert read == [TIMELINE_STEP_COLUMNS, CACHE_STEP_COLUMNS] and (tmp_path / "cached" / "prefix_cache.png").is_file()


def test_a_columns_largest_value_is_the_same_held_or_streamed(tmp_path):
    from kvbench.api import run

    overrides = ["workload.shared_prefix_tokens=256", "allocator.prefix_caching=true"]
    held, streamed = (
        run(["workload.num_requests=40", "progress=false", *overrides]),
        _streamed_run(tmp_path / "s", overrides),
    )
    for name in ("cached_bytes", "token_bytes", "num_running"):
        assert held.step_column_max(name) == streamed.step_column_max(name) == held.steps[name].max(), name
    assert held.step_column_max("cached_bytes") > 0
    assert held.step_column_max("no_such_column") is None and streamed.step_column_max("no_such_column") is None
