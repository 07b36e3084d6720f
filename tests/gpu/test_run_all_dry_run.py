"""gpu/run_all.sh --dry-run: every step of the GPU script runs on a CPU at tiny sizes.

No wall-clock bound: how long the dry run takes depends on the machine and its load (about 25 s
on an idle 2-core CPU), and the script sets no time limit on a dry run's steps (its deadline is the
GPU run's). Its guard (tests/support/hang.py) only stops a hang."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hang import HANG_S, hang_message

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_gpu_script_dry_run_passes_its_steps_on_cpu(tmp_path):
    if importlib.util.find_spec("triton") is None:  # found, not imported: see test_kernel_triton.py's NOTE
        pytest.skip("the triton package is not installed")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    try:
        done = subprocess.run(
            ["bash", str(ROOT / "gpu" / "run_all.sh"), "--dry-run"],
            capture_output=True,
            text=True,
            timeout=HANG_S,
            env=env,
            cwd=ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(hang_message("the dry run (about 25 s on an idle 2-core CPU)"))
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    for number in range(6):
        assert f"] {number}. " in log, f"step {number} missing:\n{log[-3000:]}"
    assert "FATAL" not in log, f"a step failed fatally:\n{log[-3000:]}"
    assert "headline exit status: 0" in log, f"the headline step did not exit 0:\n{log[-3000:]}"
    assert (out / "run_all.log").is_file() and (out / "headline" / "results.csv").is_file()
    # the real-mode step either ran its tiny model or said in one line why not
    assert "batch 1 exit status: 0" in log or "SKIP: mode=real is not available" in log
