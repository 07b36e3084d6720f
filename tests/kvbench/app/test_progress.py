"""Progress on a terminal: each bar with its total and the time left, the sweep job it belongs to
above it; nothing in a pipe, with progress=false, or where jobs run side by side. The sweep's Hydra
callback counts the jobs as Hydra's basic sweeper splits them and names each by its swept values."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf
from rich.console import Console

from kvbench.app import progress
from kvbench.app.progress import Job, current_job, progress_bar, say, set_current_job
from kvbench.app.sweep_progress import JobProgress, job_label, sweep_size

BASIC = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


@pytest.fixture
def screen(monkeypatch):
    """What a terminal on stderr shows, as text (a terminal 100 columns wide)."""
    out = io.StringIO()
    monkeypatch.setattr(
        progress, "_stderr_console", lambda: Console(file=out, force_terminal=True, width=100, color_system=None)
    )
    monkeypatch.setattr(progress, "_job", None)
    return out


@pytest.fixture
def pipe(monkeypatch):
    """stderr as a pipe or a file: not a terminal."""
    out = io.StringIO()
    monkeypatch.setattr(progress, "_stderr_console", lambda: Console(file=out, width=100))
    monkeypatch.setattr(progress, "_job", None)
    return out


def job(**changes) -> Job:
    fields = dict(num=1, num_jobs=3, label="allocator=paged", sweep_dir=Path("/sweep"), parallel=False)
    return Job(**{**fields, **changes})


def test_a_bar_shows_its_total_and_the_time_left(screen):
    with progress_bar(11185, "simulating", enabled=True, unit="requests") as advance:
        advance(5000)
        advance(6185)
    shown = screen.getvalue()
    assert "simulating" in shown and "11185/11185" in shown and "requests" in shown and "left" in shown


def test_a_sweep_job_s_bar_says_which_job_it_is(screen):
    set_current_job(job())
    with progress_bar(4, "prefix bounds 2/4: ceiling", enabled=True) as advance:
        advance(4)
    assert "job 2/3 allocator=paged" in screen.getvalue()


def test_a_note_says_what_is_being_done(screen):
    with progress_bar(137, "kvbench paper", enabled=True, unit="runs") as advance:
        advance(0, note="kvbench allocator=naive")
    assert "kvbench allocator=naive" in screen.getvalue() and "0/137" in screen.getvalue()


def test_without_a_total_the_count_and_the_time_spent(screen):
    with progress_bar(None, "kvbench paper", enabled=True, unit="runs") as advance:
        advance(3)
    assert "so far" in screen.getvalue() and "left" not in screen.getvalue()


def test_nothing_goes_into_a_pipe(pipe):
    with progress_bar(10, "simulating", enabled=True) as advance:
        advance(10, note="x")
    say("kvbench: job 1/2: started", enabled=True)
    assert pipe.getvalue() == ""


def test_nothing_with_progress_false_or_beside_other_jobs(screen):
    with progress_bar(10, "simulating", enabled=False) as advance:
        advance(10)
    set_current_job(job(parallel=True))  # two processes' bars would overwrite each other
    with progress_bar(10, "simulating", enabled=True) as advance:
        advance(10)
    say("kvbench: line", enabled=False)
    assert screen.getvalue() == ""


def test_a_job_is_counted_from_one_and_its_label_cut_to_fit():
    assert job().name == "job 2/3 allocator=paged"
    assert job(num=0, num_jobs=None).name == "job 1 allocator=paged"
    assert job(label="").name == "job 2/3"
    long = job(label="workload.s_max_mix=[" + "x" * 100 + "]").name
    assert len(long) == len("job 2/3 ") + progress.LABEL_CHARS + len("...")


# --- the sweep's size and each job's label, as Hydra's basic sweeper splits the command -----------


def multirun_config(task: list[str], params: dict | None = None, sweeper: str = BASIC):
    return OmegaConf.create(
        {"hydra": {"sweeper": {"_target_": sweeper, "params": params}, "overrides": {"task": task}}}
    )


def test_the_sweep_s_size_and_keys():
    config = multirun_config(["allocator=naive,paged", "seed=range(3)", "model=llama2-7b", "+x=choice(1,2)"])
    assert sweep_size(config) == (12, ("allocator", "seed", "+x"))
    # hydra.sweeper.params sweep too, before the command line's
    config = multirun_config(["allocator=naive,paged"], params={"kernel": "triton,flashinfer"})
    assert sweep_size(config) == (4, ("kernel", "allocator"))
    assert sweep_size(multirun_config(["seed=0"])) == (1, ())


def test_an_unknown_sweep_has_no_size():
    assert sweep_size(multirun_config(["allocator=naive,paged"], sweeper="hydra_plugins.optuna.OptunaSweeper")) == (
        None,
        (),
    )
    assert sweep_size(multirun_config(["allocator=glob(*)"])) == (None, ())  # needs the config tree
    assert sweep_size(multirun_config(["allocator=(("])) == (None, ())  # Hydra itself says what is wrong


def test_a_job_s_label_is_its_swept_values():
    task = ["workload=mooncake_conversation", "allocator.block_size_tokens=64", "seed=1"]
    assert job_label(task, ("allocator.block_size_tokens",)) == "allocator.block_size_tokens=64"
    assert job_label(task, ("seed", "allocator.block_size_tokens")) == "seed=1 allocator.block_size_tokens=64"
    assert job_label(task, ()) == ",".join(task)  # another sweeper: the job's overrides


# --- the callback, as Hydra calls it -----------------------------------------------------------------


def job_config(num: int, task: list[str], sweep_dir: Path, mode: RunMode = RunMode.MULTIRUN):
    config = OmegaConf.create(
        {
            "progress": True,
            "hydra": {"job": {"num": num}, "overrides": {"task": task}, "sweep": {"dir": str(sweep_dir)}},
        }
    )
    config.hydra.mode = mode
    return config


def test_the_callback_sets_each_job_and_clears_it(screen, tmp_path):
    callback = JobProgress()
    callback.on_multirun_start(multirun_config(["allocator=naive,paged", "seed=0"]))
    callback.on_job_start(job_config(1, ["allocator=paged", "seed=0"], tmp_path), task_function=None)
    assert current_job() == Job(1, 2, "allocator=paged", tmp_path.absolute(), parallel=False)
    callback.on_job_end(job_config(1, ["allocator=paged", "seed=0"], tmp_path), job_return=JobReturn())
    assert current_job() is None
    assert screen.getvalue() == ""  # one job at a time: its bars say which it is


def test_a_single_run_is_no_sweep_job(screen, tmp_path):
    callback = JobProgress()
    callback.on_job_start(job_config(0, [], tmp_path, mode=RunMode.RUN), task_function=None)
    assert current_job() is None


def test_jobs_in_worker_processes_say_when_they_start_and_end(screen, tmp_path):
    callback = JobProgress()
    callback.on_multirun_start(multirun_config(["allocator=naive,paged"]))
    callback.launcher_pid = -1  # as a launcher's worker process sees it: another process launched the sweep
    config = job_config(0, ["allocator=naive"], tmp_path)
    callback.on_job_start(config, task_function=None)
    assert current_job().parallel
    failed = JobReturn()
    failed.status = JobStatus.FAILED
    callback.on_job_end(config, job_return=failed)
    lines = screen.getvalue().splitlines()
    assert lines[0] == "kvbench: job 1/2 allocator=naive: started"
    assert lines[1].startswith("kvbench: job 1/2 allocator=naive: failed after ") and len(lines) == 2
