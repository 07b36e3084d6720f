"""``kvbench paper``'s progress: runs done of as many as the last build made (its ``data/runs.csv``),
the time left and the run in progress, on a terminal; in a pipe, a plain line every 10 s (on stderr:
stdout keeps the command's own lines)."""

from __future__ import annotations

import io

import pytest
from kvbench_cli import main_status
from rich.console import Console

from kvbench.app import progress
from kvbench.commands import paper as cli

COMMAND = "kvbench kernel=torch allocator=naive workload.num_requests=40"  # the fake source's one run


@pytest.fixture
def screen(monkeypatch):
    """What a terminal on stderr shows, as text."""
    out = io.StringIO()
    monkeypatch.setattr(
        progress, "_stderr_console", lambda: Console(file=out, force_terminal=True, width=120, color_system=None)
    )
    return out


def paper(monkeypatch, *args: str) -> int:
    return main_status(monkeypatch, "paper", cli.main, *args)


def test_the_total_is_what_the_last_build_ran(fake_paper, monkeypatch, tmp_path, screen):
    out = tmp_path / "paper"
    assert paper(monkeypatch, "--out", str(out)) == 0
    first = screen.getvalue()
    assert "kvbench paper" in first and COMMAND in first and "so far" in first  # no earlier build: a count
    assert cli.expected_runs(out, None) == 1
    screen.truncate(0)
    screen.seek(0)
    assert paper(monkeypatch, "--out", str(out)) == 0
    again = screen.getvalue()
    assert "1/1" in again and "runs" in again and "left" in again and COMMAND in again


def test_the_total_is_unknown_without_an_earlier_build_or_with_only(tmp_path):
    assert cli.expected_runs(tmp_path / "nothing", None) is None
    data = tmp_path / "paper" / "data"
    data.mkdir(parents=True)
    (data / "runs.csv").write_text('command,seed\n"kvbench a=1,2",0\nkvbench b=1,0\nkvbench,0\n')
    assert cli.expected_runs(tmp_path / "paper", None) == 3  # a quoted comma is one cell
    assert cli.expected_runs(tmp_path / "paper", ["lecture"]) is None  # which source ran which run: unknown
    (data / "runs.csv").write_text("command,seed\n")
    assert cli.expected_runs(tmp_path / "paper", None) is None
    (data / "runs.csv").write_bytes(b"\xff\xfe\x00damaged")
    assert cli.expected_runs(tmp_path / "paper", None) is None


def test_plain_lines_on_stderr_in_a_pipe(fake_paper, monkeypatch, tmp_path, capsys):
    ticks = iter(range(0, 10**6, 11))  # a fake clock: 11 s pass between two readings
    monkeypatch.setattr(progress, "monotonic", lambda: float(next(ticks)))
    monkeypatch.setattr(progress, "PLAIN_POLL_S", 3600.0)  # lines come from the runs, not the ticker
    monkeypatch.setattr(progress, "_last_line_s", float("-inf"))  # no line written yet in this process
    assert paper(monkeypatch, "--out", str(tmp_path / "paper")) == 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("kvbench paper: ")]
    assert lines and lines[-1].startswith("kvbench paper: done, 1 runs in "), err
    assert f"({COMMAND})" in lines[0]
    assert "kvbench paper: " not in out
