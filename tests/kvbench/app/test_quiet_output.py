"""A sweep's stdout holds kvbench's table and lines only: Hydra's own log (``Launching 3 jobs
locally``, each job's overrides) and libraries' INFO lines (matplotlib's ``generated new
fontManager``) are off, by kvbench's logging options for Hydra (conf/hydra/); a warning or an error
still reaches stderr, once. Which job is running is said by kvbench's progress, on a terminal only."""

from __future__ import annotations

import logging
import os
import pty
import subprocess
import sys
import threading

import pytest
from hang import HANG_S
from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.utils import configure_log
from kvbench_cli import MAIN, kvbench

from kvbench.app.config import KvbenchConfig

SWEEP = ["-m", "allocator=naive,paged", "workload.num_requests=40", "wandb.mode=disabled", "output.steps=false"]
#: what Hydra's default logging printed on stdout above the table
HYDRA_LINES = ("[HYDRA]", "Launching", "#0 :", "#1 :", "[INFO]", "Joblib.Parallel")


@pytest.fixture
def hydra_config():
    ConfigStore.instance().store(name="kvbench_schema", node=KvbenchConfig)
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        return compose("config", return_hydra_config=True).hydra


@pytest.fixture
def restored_logging():
    """Put the root logger back as it was: the test reconfigures it as Hydra does."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("which", ["hydra_logging", "job_logging"])
def test_info_is_dropped_and_a_warning_reaches_stderr_once(hydra_config, restored_logging, capsys, which):
    configure_log(hydra_config[which])
    library = logging.getLogger("matplotlib.font_manager")
    library.info("generated new fontManager")
    logging.getLogger("hydra._internal.core_plugins.basic_launcher").info("Launching 3 jobs locally")
    library.warning("Matplotlib is building the font cache; this may take a moment.")
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "matplotlib.font_manager: WARNING: Matplotlib is building the font cache; this may take a moment.\n"


def test_in_a_sweep_s_process_a_warning_is_said_once(hydra_config, restored_logging, capsys):
    """A sweep's process configures Hydra's logging, then each job's, over it: one handler, one line."""
    configure_log(hydra_config.hydra_logging)
    configure_log(hydra_config.job_logging)
    configure_log(hydra_config.job_logging)  # the next job
    logging.getLogger("kvbench_plugins.some_plugin").error("could not do it")
    out, err = capsys.readouterr()
    assert (out, err) == ("", "kvbench_plugins.some_plugin: ERROR: could not do it\n")


def test_no_job_log_file_is_configured(hydra_config):
    """kvbench prints and never logs: Hydra's ``<job>/kvbench.log`` was always empty."""
    for which in ("hydra_logging", "job_logging"):
        handlers = hydra_config[which].handlers.values()
        assert [h["class"] for h in handlers] == ["logging.StreamHandler"]
        assert [h["stream"] for h in handlers] == ["ext://sys.stderr"]


def test_a_sweep_s_stdout_is_the_table_alone(tmp_path):
    proc = kvbench(*SWEEP, "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("kvbench comparison (2 jobs), swept: allocator"), proc.stdout
    assert lines[-1] == "comparison: sweep/comparison.csv"
    assert not [line for line in lines if any(mark in line for mark in HYDRA_LINES)], proc.stdout
    assert not [line for line in proc.stderr.splitlines() if any(mark in line for mark in HYDRA_LINES)]
    assert not list((tmp_path / "sweep").rglob("*.log"))


def _run_on_a_terminal(args: list[str], cwd) -> tuple[subprocess.CompletedProcess, str]:
    """``kvbench <args>`` with stderr on a pseudo-terminal (what a person watches) and stdout on a
    pipe; returns the process and what the terminal received."""
    leader, follower = pty.openpty()
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore", "TERM": "xterm", "COLUMNS": "100"}
    child = subprocess.Popen(
        [sys.executable, "-c", MAIN, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=follower, text=True
    )
    os.close(follower)
    received = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                return
            if not chunk:
                return
            received.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    stdout, _ = child.communicate(timeout=HANG_S)
    reader.join(timeout=HANG_S)
    os.close(leader)
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, ""), received.decode(errors="replace")


def test_on_a_terminal_each_job_s_progress_says_which_job_it_is(tmp_path):
    proc, terminal = _run_on_a_terminal([*SWEEP, "workload.num_requests=2000", "hydra.sweep.dir=sweep"], tmp_path)
    assert proc.returncode == 0, terminal
    assert "job 1/2 allocator=naive" in terminal and "job 2/2 allocator=paged" in terminal, terminal
    assert "simulating" in terminal and "2000/2000" in terminal
    assert "writing results" in terminal
    # the bars went to the terminal, never into the piped table
    assert proc.stdout.startswith("kvbench comparison (2 jobs)") and "simulating" not in proc.stdout
