"""The committed ``paper/`` is what ``kvbench paper`` produces: a change that moves any reproduced
number, verdict or table must come with the regenerated ``paper/`` (run ``kvbench paper`` and
commit it). Figures and Parquet files must exist; their bytes are left to library versions, and
their numbers are the CSVs'."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvbench.paper import cli

PAPER_DIR = Path(__file__).resolve().parents[1] / "paper"


def test_committed_paper_is_what_kvbench_paper_produces(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kvbench paper", "--check", "--out", str(PAPER_DIR)])
    with pytest.raises(SystemExit) as stop:
        cli.main()
        raise SystemExit(0)
    report = capsys.readouterr()
    assert stop.value.code == 0, f"{report.out}{report.err}\nIf the change is intended, run `kvbench paper` and commit paper/."
    assert "up to date" in report.out
