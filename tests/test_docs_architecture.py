"""docs/architecture.md names the files each kind of change touches: every path it names exists,
and every room of the package is on its picture."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
#: a path in backticks: folders end with "/", files have a suffix; globs allowed (conf/model/*.yaml)
PATH = re.compile(r"`((?:kvbench|plugins|conf|tests|docs|benchmarks)/[\w./*<>-]*)`")


def named_paths() -> list[str]:
    return sorted(set(PATH.findall(DOC.read_text())))


def test_the_page_names_files():
    assert len(named_paths()) >= 30


def test_every_path_the_page_names_exists():
    missing = []
    for path in named_paths():
        if "<" in path:  # a pattern for the reader's own file: its folder must exist
            path = path[: path.index("<")]
        if "*" in path:
            if not list(ROOT.glob(path)):
                missing.append(path)
        elif not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"docs/architecture.md names what is not there: {missing}"


def test_every_room_is_on_the_picture():
    picture = DOC.read_text().split("```")[1]
    # data, not code: configs, calibration files, traces, tables shipped with the package
    data = {"conf", "calibrations", "traces", "profiles"}
    rooms = [f"{p.name}/" for p in (ROOT / "kvbench").iterdir() if p.is_dir() and p.name not in data]
    rooms += [p.name for p in (ROOT / "kvbench").glob("*.py") if p.name != "__init__.py"]
    missing = sorted(room for room in rooms if not room.startswith("__") and room not in picture)
    assert not missing, f"rooms missing from the picture: {missing}"


def example() -> tuple[str, str]:
    """The page's first allocator and its test module (the two python blocks of its example)."""
    text = DOC.read_text()
    section = text[text.index("### A first allocator on `BlockPool`") : text.index("## To add a scheduler option")]
    allocator, test = re.findall(r"```python\n(.*?)```", section, re.S)
    return allocator, test


def test_the_page_s_first_allocator_passes_the_conformance_suite(tmp_path):
    """A newcomer's plugin, from the page alone: built on BlockPool, through the whole suite."""
    allocator, test = example()
    assert "class MyAllocator(PooledAllocator)" in allocator and "BlockPool(" in allocator
    (tmp_path / "my_allocator.py").write_text(allocator)
    (tmp_path / "test_my_allocator.py").write_text(test)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_my_allocator.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-500:]
