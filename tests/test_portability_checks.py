"""tests/portability.py reruns named test files under other numpy and BLAS kernels: each file it
names must exist, or a move of a test file would leave it running nothing (pytest's "file or
directory not found" is a failure there, found only by CI's last step)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_check_portability_runs_exists(monkeypatch):
    spec = importlib.util.spec_from_file_location("portability", ROOT / "tests" / "portability.py")
    portability = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "portability", portability)  # its dataclasses look themselves up there
    spec.loader.exec_module(portability)
    missing = [path for path in portability.CHECKS if not (ROOT / path).is_file()]
    assert portability.CHECKS and not missing, f"tests/portability.py runs files that are not there: {missing}"
