"""``kvbench --help`` is Hydra's help page, rendered by kvbench without Hydra's cost."""

from __future__ import annotations

import os
import subprocess
import sys

from kvbench_cli import kvbench

#: Hydra's own --help, for the same command line (kvbench's main() renders it itself)
HYDRA_HELP = (
    "import sys; from kvbench.commands import main as cli; from kvbench.app.searchpath import register; register(); "
    "sys.argv = ['kvbench', *sys.argv[1:]]; cli._hydra_main()"
)


def hydra_help(*args: str, cwd) -> str:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run([sys.executable, "-c", HYDRA_HELP, *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_help_is_hydra_s_page_word_for_word(tmp_path):
    for args in (["--help"], ["allocator=naive", "workload.num_requests=7", "--help"]):
        proc = kvbench(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == hydra_help(*args, cwd=tmp_path)
    assert "num_requests: 7" in proc.stdout and "name: naive" in proc.stdout


def test_help_with_a_typo_is_one_line(tmp_path):
    proc = kvbench("allocator=pagd", "--help", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("kvbench: error: allocator='pagd' is not a known allocator")
