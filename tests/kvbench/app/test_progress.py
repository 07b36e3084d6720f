"""Progress on a terminal: each bar with its total and the time left, the sweep job it belongs to
above it; in a pipe, a plain line every 10 s of a long phase (a fake clock stands in for time);
nothing with progress=false, no bars where jobs run side by side. The sweep's Hydra callback counts
the jobs as Hydra's basic sweeper splits them and names each by its swept values."""

from __future__ import annotations

import io
import threading
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


class FakeClock:
    """Seconds as the test sets them."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(progress, "monotonic", fake)
    monkeypatch.setattr(progress, "PLAIN_POLL_S", 3600.0)  # the ticker never ticks in a test: lines come from advance
    monkeypatch.setattr(progress, "_last_line_s", float("-inf"))  # no line written yet in this process
    return fake


@pytest.fixture
def pipe(monkeypatch, clock):
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


def test_a_short_phase_says_nothing_in_a_pipe(pipe, clock):
    with progress_bar(10, "simulating", enabled=True) as advance:
        clock.now_s = 9.9
        advance(10, note="x")
    say("kvbench: job 1/2: started", enabled=True)
    assert pipe.getvalue() == ""


def test_a_long_phase_writes_a_plain_line_every_10_s_in_a_pipe(pipe, clock):
    with progress_bar(10_000, "simulating", enabled=True, unit="requests") as advance:
        clock.now_s = 4.0
        advance(1_000)  # not yet 10 s: nothing
        clock.now_s = 10.0
        advance(1_000)
        clock.now_s = 19.0
        advance(1_000)  # 9 s after the last line: nothing
        clock.now_s = 20.5
        advance(2_000)
        clock.now_s = 40.0
        advance(5_000)
    assert pipe.getvalue().splitlines() == [
        "kvbench: simulating: 2,000/10,000 requests (20%), 10 s so far, about 40 s left",
        "kvbench: simulating: 5,000/10,000 requests (50%), 20 s so far, about 20 s left",
        "kvbench: simulating: 10,000/10,000 requests (100%), 40 s so far",
        "kvbench: simulating: done, 10,000/10,000 requests (100%) in 40 s",
    ]


def test_a_plain_line_names_the_sweep_job_and_what_is_being_done(pipe, clock):
    set_current_job(job(parallel=True))  # beside other jobs: no bar, but a log takes lines
    with progress_bar(None, "writing results", enabled=True, unit="files") as advance:
        clock.now_s = 12.0
        advance(3, note="steps.parquet")
    lines = pipe.getvalue().splitlines()
    assert lines[0] == "kvbench: job 2/3 allocator=paged: writing results: 3 files, 12 s so far (steps.parquet)"
    assert lines[1] == "kvbench: job 2/3 allocator=paged: writing results: done, 3 files in 12 s"


def test_a_plain_line_fits_100_columns(pipe, clock):
    with progress_bar(137, "kvbench paper", enabled=True, unit="runs") as advance:
        clock.now_s = 10.0
        advance(1, note="kvbench " + "allocator=naive " * 20)
    first = pipe.getvalue().splitlines()[0]
    assert first.startswith("kvbench paper: 1/137 runs (1%), 10 s so far") and len(first) == 100
    assert first.endswith("...")


def test_the_ticker_writes_while_the_work_does_not_advance(clock):
    """One probe or one file can take minutes: the phase still says it is alive every 10 s."""
    written: list[str] = []
    said = threading.Event()

    def write(line: str) -> None:
        written.append(line)
        said.set()

    plain = progress.PlainProgress(5, "slo-search", write=write, unit="probes")
    clock.now_s = 12.0
    with progress._ticking(plain, poll_s=0.001):
        assert said.wait(timeout=60)
    assert written[0] == "kvbench: slo-search: 0/5 probes (0%), 12 s so far"


def test_a_sweep_says_how_many_jobs_are_done_after_10_s_of_silence(pipe, clock):
    progress.start_sweep(3, enabled=True)
    clock.now_s = 1.0
    with progress_bar(100, "simulating", enabled=True, unit="requests") as advance:
        clock.now_s = 11.0
        advance(50)  # the job's phase speaks
    clock.now_s = 15.0
    progress.sweep_job_done()  # 4 s after the phase's line: the sweep stays quiet
    clock.now_s = 26.0
    progress.sweep_job_done()
    clock.now_s = 30.0
    progress.end_sweep()
    assert pipe.getvalue().splitlines() == [
        "kvbench: simulating: 50/100 requests (50%), 10 s so far, about 10 s left",
        "kvbench: simulating: done, 50/100 requests (50%) in 10 s",
        "kvbench: sweep: 2/3 jobs (67%), 26 s so far, about 13 s left",
        "kvbench: sweep: done, 2/3 jobs (67%) in 30 s",
    ]


def test_a_sweep_on_a_terminal_or_with_progress_false_has_no_plain_lines(screen, clock, monkeypatch):
    progress.start_sweep(3, enabled=True)  # stderr is a terminal: each job's bars say which job it is
    assert progress._sweep is None
    log = io.StringIO()
    monkeypatch.setattr(progress, "_stderr_console", lambda: Console(file=log, width=100))
    progress.start_sweep(3, enabled=False)
    assert progress._sweep is None
    clock.now_s = 20.0
    progress.sweep_job_done()
    progress.end_sweep()
    assert screen.getvalue() == log.getvalue() == ""


def test_nothing_with_progress_false_or_beside_other_jobs(screen):
    with progress_bar(10, "simulating", enabled=False) as advance:
        advance(10)
    set_current_job(job(parallel=True))  # two processes' bars would overwrite each other
    with progress_bar(10, "simulating", enabled=True) as advance:
        advance(10)
    say("kvbench: line", enabled=False)
    assert screen.getvalue() == ""


def test_nothing_in_a_pipe_with_progress_false(pipe, clock):
    with progress_bar(10, "simulating", enabled=False) as advance:
        clock.now_s = 100.0
        advance(5)
    assert pipe.getvalue() == ""


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


def test_the_callback_counts_the_jobs_it_runs_in_a_pipe(pipe, clock, tmp_path):
    callback = JobProgress()
    config = multirun_config(["allocator=naive,paged"])
    config.hydra.launcher = {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}
    config.progress = True
    callback.on_multirun_start(config)
    for num, allocator in enumerate(("naive", "paged")):
        callback.on_job_start(job_config(num, [f"allocator={allocator}"], tmp_path), task_function=None)
        clock.now_s += 11.0
        callback.on_job_end(job_config(num, [f"allocator={allocator}"], tmp_path), job_return=JobReturn())
    callback.on_multirun_end(config)
    assert progress._sweep is None
    assert pipe.getvalue().splitlines() == [
        "kvbench: sweep: 1/2 jobs (50%), 11 s so far, about 11 s left",
        "kvbench: sweep: 2/2 jobs (100%), 22 s so far",
        "kvbench: sweep: done, 2/2 jobs (100%) in 22 s",
    ]


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
