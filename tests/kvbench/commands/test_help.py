"""``kvbench --help`` is Hydra's help page, rendered by kvbench without Hydra's cost."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hang import HANG_S
from kvbench_cli import MAIN, kvbench

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
        # Hydra writes each group's options on one line; kvbench wraps them at 100 columns
        assert proc.stdout.split() == hydra_help(*args, cwd=tmp_path).split()
    assert "num_requests: 7" in proc.stdout and "name: naive" in proc.stdout


def test_a_long_group_wraps_under_its_first_option():
    from kvbench.commands.help import group_lines

    text = group_lines({"workload": [f"option_{i}" for i in range(30)], "engine": ["kvbench"]}, width=60)
    lines = text.splitlines()
    assert all(len(line) <= 60 for line in lines) and lines[-1] == "engine: kvbench"
    assert lines[0].startswith("workload: option_0, ") and lines[1].startswith(" " * len("workload: ") + "option_")
    assert " ".join(text.split()) == "workload: " + ", ".join(f"option_{i}" for i in range(30)) + " engine: kvbench"


def test_bench_kernels_help_says_what_it_does_and_that_it_needs_a_gpu(tmp_path):
    proc = kvbench("bench-kernels", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    page = " ".join(proc.stdout.split())
    assert page.startswith("kvbench bench-kernels: time decode-attention kernels on a CUDA GPU")
    assert "It needs a CUDA GPU and torch: pip install -e '.[kernels]' in a clone" in page
    assert "dry_run=true runs tiny shapes on the CPU" in page and "powered by Hydra" not in page
    assert "hardware: a100-40gb, a100-80gb, b200-sxm, b300-sxm, gb200, gb300, h100-sxm, h200, h200-sxm" in page
    assert "allocator:" not in page  # its one group
    assert "block_sizes:" in proc.stdout  # the config it overrides
    assert max(map(len, proc.stdout.splitlines())) <= 100
    typo = kvbench("bench-kernels", "hardware=h1", "--help", cwd=tmp_path)
    assert typo.returncode == 2 and typo.stderr.startswith("kvbench bench-kernels: error: hardware='h1'")


def test_help_with_a_typo_is_one_line(tmp_path):
    proc = kvbench("allocator=pagd", "--help", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("kvbench: error: allocator='pagd' is not a known allocator")


def test_help_lists_every_subcommand_with_its_line(tmp_path):
    from kvbench.commands.main import SUBCOMMANDS

    proc = kvbench("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for name, sub in SUBCOMMANDS.items():
        # one line each: the name, then its summary
        [line] = [line for line in lines if line.split()[:2] == ["kvbench", name]]
        assert line.rstrip().endswith(sub.summary), line


@pytest.mark.parametrize("name", ["bench-kernels", "calibrate", "compare", "diff-engine", "paper", "profiles",
                                  "slo-batch", "slo-search", "validate"])  # fmt: skip
def test_every_subcommand_has_its_own_help(tmp_path, name):
    from kvbench.commands.main import SUBCOMMANDS

    assert name in SUBCOMMANDS  # the list above is the dispatch's
    proc = kvbench(name, "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert f"kvbench {name}" in proc.stdout or "bench_kernels" in proc.stdout


def test_a_help_page_cut_short_by_its_reader_is_no_traceback(tmp_path):
    # `kvbench --help | head -1`, with the reader gone before the page is written (head may be
    # gone or not yet, depending on timing: closing the only read end first makes it certain)
    proc = subprocess.Popen(
        [sys.executable, "-c", MAIN, "--help"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=HANG_S) == 141 and stderr == "", stderr
