"""``fake_paper``: ``kvbench paper`` over the small fake source, for the tests of its files and its progress."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvbench.commands import paper as cli


@pytest.fixture
def fake_paper(monkeypatch):
    """``kvbench paper`` over the small fake source instead of the lecture and the paper."""
    monkeypatch.setattr(cli, "SOURCES", {"fake": "fake_source"})
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "studies" / "paper"))
    sys.modules.pop("fake_source", None)
