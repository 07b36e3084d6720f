"""docs/schedulers.md's own scheduler and queue, built from the page's code blocks and run through
the scheduling conformance suite with the page's own test module, as a plugin author would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kvbench.testing.schedulers import ALLOCATORS

DOC = Path(__file__).resolve().parents[1] / "docs" / "schedulers.md"


def blocks() -> tuple[str, str]:
    """The page's plugin module and its test module (the two python blocks of its recipe)."""
    text = DOC.read_text()
    section = text[text.index("## A scheduler and a queue of your own") : text.index("## Engine presets")]
    plugin, test = re.findall(r"```python\n(.*?)```", section, re.S)
    return plugin, test


def test_the_page_names_the_file_it_shows():
    plugin, _ = blocks()
    assert "`my_scheduling.py`:" in DOC.read_text()
    assert "class OnePrefillScheduler(Scheduler)" in plugin and "class ShortestJobQueue(KeyedQueue)" in plugin


def test_the_pages_scheduler_and_queue_pass_the_conformance_suite(tmp_path):
    plugin, test = blocks()
    (tmp_path / "my_scheduling.py").write_text(plugin)
    (tmp_path / "test_mine.py").write_text(test)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_mine.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"{len(ALLOCATORS)} passed" in done.stdout  # one per allocator of the suite
