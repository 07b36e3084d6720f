"""The collector while a command starts up: off for the imports and the compose, then what start-up
made is frozen once and the collector is back on for the work; a caller's process (a test, a
script calling the entry point) gets the collector back as it was, however the command ended."""

from __future__ import annotations

import gc

import pytest
from kvbench_cli import kvbench

from kvbench.commands import entry, startup_gc


@pytest.fixture
def collector(monkeypatch):
    """A fresh start-up state; the collector as it was afterwards, and nothing left frozen."""
    monkeypatch.setattr(startup_gc, "_paused", False)
    monkeypatch.setattr(startup_gc, "_frozen", False)
    was_enabled = gc.isenabled()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable() if was_enabled else gc.disable()


def test_start_up_pauses_the_collector_and_freezes_what_it_made_once(collector):
    gc.enable()
    startup_gc.begin()
    assert not gc.isenabled()
    startup_gc.end()
    assert gc.isenabled() and gc.get_freeze_count() > 0
    frozen = gc.get_freeze_count()
    kept = [[] for _ in range(1000)]  # made after the first start-up: never frozen by a later one
    startup_gc.begin()
    startup_gc.end()
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    assert kept


def test_ending_without_freezing_only_turns_the_collector_back_on(collector):
    gc.enable()
    startup_gc.begin()
    startup_gc.end(freeze=False)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    startup_gc.end()  # a second end: start-up is already over
    assert gc.get_freeze_count() == 0


def test_a_collector_that_was_off_stays_off(collector):
    gc.disable()
    startup_gc.begin()
    startup_gc.end()
    assert not gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("argv, status", [(["kvbench", "--version"], None), (["kvbench", "allocator=pagd"], 2)])
def test_the_entry_point_gives_the_collector_back(collector, monkeypatch, capsys, argv, status):
    gc.enable()
    monkeypatch.setattr("sys.argv", argv)
    if status is None:
        entry.main()
    else:
        with pytest.raises(SystemExit) as exited:  # a typo: one line and exit 2, composed in this process
            entry.main()
        assert exited.value.code == status
    assert gc.isenabled()
    capsys.readouterr()


#: the entry point, reporting the collector's state where the work starts: a run's ``execute``, or
#: a subcommand's ``main``
PROBE = """
import gc, importlib, sys
import kvbench.app.run as run
from kvbench.commands.main import SUBCOMMANDS

def report(where):
    print(f"GC {where} enabled={gc.isenabled()} frozen={gc.get_freeze_count() > 0}")

execute = run.execute
def probed_execute(*args, **kwargs):
    report("run")
    return execute(*args, **kwargs)
run.execute = probed_execute
compare = importlib.import_module(SUBCOMMANDS["compare"].module)
compare.main = lambda: report("subcommand")

from kvbench.commands.main import ComparisonTable
sweep_start = ComparisonTable.on_multirun_start
def probed_sweep_start(self, *args, **kwargs):
    sweep_start(self, *args, **kwargs)
    report("sweep")  # before its first job: a launcher may run the jobs in other processes
ComparisonTable.on_multirun_start = probed_sweep_start

from kvbench.commands.entry import main
main()
"""


@pytest.mark.parametrize(
    "args, where",
    [
        (("workload.num_requests=1", "output.write=false", "progress=false"), "run"),
        (("compare",), "subcommand"),
        (("-m", "workload.num_requests=1", "output.figures=false", "progress=false", "hydra.sweep.dir=s"), "sweep"),
    ],
)
def test_the_work_runs_with_the_collector_on_and_start_up_frozen(tmp_path, args, where):
    proc = kvbench(*args, cwd=tmp_path, code=PROBE)
    assert proc.returncode == 0, proc.stderr
    assert f"GC {where} enabled=True frozen=True" in proc.stdout.splitlines()
