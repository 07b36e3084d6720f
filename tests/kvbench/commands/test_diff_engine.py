"""``kvbench diff-engine``: its table, its exit codes (0 identical, 1 diverged, 2 bad input) and its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from hang import HANG_S

NANO = ["--peer", "nano_vllm", "engine=nano_vllm", "allocator.block_size_tokens=256", "workload.num_requests=200"]


def kvbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbench.commands.diff_engine", *args], capture_output=True, text=True, timeout=HANG_S
    )


def test_identical_decisions_exit_0_and_the_json_holds_both_sides(tmp_path):
    out = tmp_path / "diff.json"
    done = kvbench(*NANO, "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "made the same decisions at every step" in done.stdout
    report = json.loads(out.read_text())
    assert report["identical"] and report["requests"] == 200
    assert set(report["steps"]) == {"kvbench (nano_vllm 0.2.0 (bb823b3))", "nano-vllm 0.2.0 (bb823b3)"}


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
    ):
        done = kvbench(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, done.stderr
