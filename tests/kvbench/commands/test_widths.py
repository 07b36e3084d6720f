"""Every command's output fits 100 columns where stdout is a pipe or a log (as the main table
does): the help pages, ``profiles``, ``slo-batch``, ``slo-search``, ``validate`` and ``compare``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kvbench_cli import MAIN

from kvbench.commands.main import SUBCOMMANDS

WIDTH = 100
GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "lecture"


def piped(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``kvbench <args>`` with stdout a pipe and no COLUMNS: what a CI log receives."""
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    env.update(HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-c", MAIN, *args], cwd=cwd, env=env, capture_output=True, text=True)


def assert_fits(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.splitlines()
    assert lines, proc.stderr
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"{len(wide)} line(s) over {WIDTH} columns, the widest {max(map(len, wide))}: {wide[0]!r}"


@pytest.mark.parametrize("args", [["--help"], *([name, "--help"] for name in SUBCOMMANDS)], ids=" ".join)
def test_help_pages(tmp_path, args):
    assert_fits(piped(*args, cwd=tmp_path))


def test_profiles(tmp_path):
    proc = piped("profiles", cwd=tmp_path)
    assert_fits(proc)
    # the coverage matrix is in it: a row per model (nine GPU columns: cells are cut to fit)
    assert re.search(r"^llama2-7b +32/32/128 +trtllm ", proc.stdout, re.M)


def test_slo_batch(tmp_path):
    assert_fits(piped("slo-batch", "--out", str(tmp_path / "batch"), cwd=tmp_path))


def test_slo_search(tmp_path):
    proc = piped(
        "slo-search",
        "--over",
        "rate",
        "--max-runs",
        "3",
        "workload=sharegpt_like",
        "workload.num_requests=60",
        "slo.ttft_s=2",
        "--out",
        str(tmp_path / "search"),
        cwd=tmp_path,
    )
    assert_fits(proc)
    assert "goodput" in proc.stdout


def test_validate(tmp_path):
    proc = piped("validate", "--limit", "2", "--workers", "1", "--out", str(tmp_path / "v"), cwd=tmp_path)
    assert_fits(proc)
    assert "largest profiled TPOT errors" in proc.stdout


def test_compare_with_every_metric(tmp_path):
    assert_fits(piped("compare", str(GOLDEN), str(GOLDEN), "--all", cwd=tmp_path))
