"""``kvbench diff-engine``: its table, its exit codes (0 identical, 1 diverged, 2 bad input) and its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hang import HANG_S

from kvbench.validation.peers import nano_vllm

NANO = ["--peer", "nano_vllm", "engine=nano_vllm", "allocator.block_size_tokens=256", "workload.num_requests=200"]
#: nano-vllm comes from its repository, not PyPI: the tests that run it skip without it, with the line that says how
needs_nano_vllm = pytest.mark.skipif(
    nano_vllm.unavailable_reason() is not None, reason=str(nano_vllm.unavailable_reason())
)


def kvbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbench.commands.diff_engine", *args], capture_output=True, text=True, timeout=HANG_S
    )


@needs_nano_vllm
def test_identical_decisions_exit_0_and_the_json_holds_both_sides(tmp_path):
    out = tmp_path / "diff.json"
    done = kvbench(*NANO, "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "made the same decisions at every step" in done.stdout
    report = json.loads(out.read_text())
    assert report["identical"] and report["requests"] == 200
    # the peer is named by the installed nano-vllm's version and, for a git install, its commit
    assert set(report["steps"]) == {"kvbench (nano_vllm 0.2.0 (bb823b3))", nano_vllm.load().label}


@needs_nano_vllm
def test_a_checkout_given_by_path_runs_and_is_named_by_its_version(tmp_path):
    out = tmp_path / "diff.json"
    package_dir = nano_vllm.load().package_dir  # the installed package's folder stands for a checkout
    done = kvbench(*NANO, "--nano-vllm-path", str(package_dir), "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["identical"]


@needs_nano_vllm
def test_a_block_size_nano_vllm_refuses_says_what_to_do_and_any_block_size_runs_it():
    sixteen = [*NANO[:3], "allocator.block_size_tokens=16", "workload.num_requests=100"]
    done = kvbench(*sixteen)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "allocator.block_size_tokens=256 (or a multiple of it), or add --any-block-size" in done.stderr
    done = kvbench(*sixteen, "--any-block-size")
    assert done.returncode == 0, done.stderr
    assert "made the same decisions at every step" in done.stdout


def test_without_nano_vllm_one_line_says_how_to_get_it_and_exits_2():
    # nano-vllm hidden from import, as on a machine without it
    hide = (
        "import importlib.util, sys; find_spec = importlib.util.find_spec; "
        "importlib.util.find_spec = lambda name, *a: None if name == 'nanovllm' else find_spec(name, *a); "
        "from kvbench.commands.diff_engine import main; main()"
    )
    done = subprocess.run([sys.executable, "-c", hide, *NANO], capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for words in (
        "pip install --no-deps git+https://github.com/GeeeekExplorer/nano-vllm.git",
        "xxhash",
        "--nano-vllm-path",
    ):
        assert words in done.stderr


@needs_nano_vllm
def test_a_divergence_exits_1_and_names_the_step():
    done = kvbench(*NANO, "scheduler.step_seq_cap=false", "scheduler.max_num_seqs=8")
    assert done.returncode == 1, done.stderr
    assert "first divergent step:" in done.stdout and "differing: request" in done.stdout


def test_bad_input_is_one_line_and_exit_2():
    for args, words in (
        (["--peer", "sglang"], "--peer='sglang'"),
        (["--peer", "nano_vllm", "allocator=naive"], "use allocator=paged"),
        (["--peer", "nano_vllm", "--step-ms", "0"], "--step-ms"),
        (["engine=kvbench"], "choose one of vllm_v1, nano_vllm"),
        (["--peer", "nano_vllm", "scheduler.nope=1"], "nope"),
        (["--peer", "nano_vllm", "--nano-vllm-path", "/nonexistent-kvbench-path"], "no nanovllm/engine/scheduler.py"),
        (["--peer", "vllm_v1", "--any-block-size"], "nano_vllm's options, not --peer=vllm_v1's"),
        (["--peer", "vllm_v1", "--nano-vllm-path", "."], "nano_vllm's options"),
    ):
        done = kvbench(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, done.stderr
