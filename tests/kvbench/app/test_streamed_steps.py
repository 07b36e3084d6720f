"""A run that writes its step table to its folder as it goes (what the command line does) holds no
table, yet gives the same table and the same summary, to the last bit, as a run that holds it."""

from __future__ import annotations

import math

import pandas as pd
import pytest

import kvbench.metrics.recorder as recorder
from kvbench.api import compose
from kvbench.app.run import execute
from kvbench.io.atomic import write_csv

SMALL = ["workload.num_requests=300", "progress=false", "wandb.mode=disabled"]


def same_summary(a: dict, b: dict) -> None:
    timed = {"sim_wall_s", "loop_wall_s", "simulated_requests_per_wall_s"}  # the loop's wall times
    assert [k for k in a if k not in timed] == [k for k in b if k not in timed]
    for key in a.keys() - timed:
        if isinstance(a[key], float) and math.isnan(a[key]):
            assert math.isnan(b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["allocator=vattention"],  # an allocator that maps pages: more columns
        ["preemption=swap", "scheduler=prefill_first"],
    ],
)
def test_a_streamed_run_has_the_held_runs_table_and_summary(tmp_path, monkeypatch, overrides):
    cfg, choices = compose([*SMALL, *overrides])
    folder = tmp_path / "run"
    folder.mkdir()
    held = execute(cfg, choices)
    # batches of 7 rows: the summary is added up over dozens of them
    monkeypatch.setattr(recorder, "STEP_ROWS_BATCH", 7)
    streamed = execute(cfg, choices, steps_dir=folder)
    assert streamed.steps is None and streamed.steps_file == folder / "steps.parquet"
    assert len(held.steps) > 7 * 3
    pd.testing.assert_frame_equal(pd.read_parquet(streamed.steps_file), held.steps)
    write_csv(held.steps, tmp_path / "held.csv")
    assert (folder / "steps.csv").read_bytes() == (tmp_path / "held.csv").read_bytes()
    pd.testing.assert_frame_equal(
        streamed.step_table(["start_s", "num_running"]).to_pandas(), held.steps[["start_s", "num_running"]]
    )
    same_summary(streamed.summary, held.summary)
    pd.testing.assert_frame_equal(streamed.requests, held.requests)


def test_a_run_with_no_step_still_writes_the_tables_columns(tmp_path):
    sunk = []
    record = recorder.Recorder(16, step_sink=sunk.append).finish()
    assert record.steps is None
    [batch] = sunk
    assert list(batch) == list(recorder.STEP_COLUMNS) and all(len(v) == 0 for v in batch.values())
    assert batch["saturated"].dtype == bool and batch["num_steps"].dtype == "int64"


def test_a_failed_run_leaves_no_step_file(tmp_path, monkeypatch):
    cfg, choices = compose(SMALL)

    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr("kvbench.app.run.summarize", broken)
    with pytest.raises(RuntimeError, match="planted"):
        execute(cfg, choices, steps_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
