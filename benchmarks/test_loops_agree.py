"""loops_agree.py: its comparison finds what differs and nothing else, and its --quick mode finds both
loops writing the same tables on an arrival-heavy replay and a preemption storm (about 10 s)."""

from __future__ import annotations

import json

import loops_agree
import pytest


def _run_dir(folder, summary: dict):
    folder.mkdir()
    for name in loops_agree.TABLE_FILES:
        (folder / name).write_bytes(f"{name}\n1,2.5\n".encode())
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_only_what_was_simulated_is_compared(tmp_path):
    summary = {"num_steps": 10, "tpot_p50_s": float("nan"), "sim_wall_s": 0.5, "job": "a", "date": "today"}
    event = _run_dir(tmp_path / "event", summary)
    step = _run_dir(tmp_path / "step", {**summary, "sim_wall_s": 9.0, "job": "b", "date": "tomorrow"})
    assert loops_agree.differences(event, step) == []  # NaN equals NaN; wall times, job and date are the run's


def test_a_changed_byte_a_missing_file_and_a_changed_value_are_named(tmp_path):
    summary = {"num_steps": 10, "num_preemptions": 3}
    event = _run_dir(tmp_path / "event", summary)
    step = _run_dir(tmp_path / "step", {**summary, "num_preemptions": 4, "extra": 1})
    (step / "steps.csv").write_bytes(b"steps.csv\n1,2.6\n")  # same size, one byte off
    (step / "refusals.parquet").unlink()
    assert loops_agree.differences(event, step) == [
        "steps.csv",
        "refusals.parquet (missing)",
        "summary.json: extra",
        "summary.json: num_preemptions",
    ]


def test_an_unknown_scenario_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        loops_agree.parse_args(["--scenarios", "arxiv-poisson3-100k,nope"])
    assert exit_info.value.code == 2 and "unknown nope" in capsys.readouterr().err


def test_quick_mode_finds_both_loops_alike(tmp_path):
    names = ["arxiv-poisson3-10k", "storm-128-128-t0-5k"]
    report = loops_agree.main(["--quick", "--scenarios", ",".join(names), "--out", str(tmp_path)])
    assert report["identical"] and list(report["scenarios"]) == names
    storm = report["scenarios"]["storm-128-128-t0-5k"]
    assert storm["preemptions"] > 0 and storm["requests"] == 500  # the storm preempts: both loops saw it
    arxiv = report["scenarios"]["arxiv-poisson3-10k"]
    assert arxiv["steps"] > arxiv["rows"] > arxiv["requests"]  # quiet runs merged into rows
    assert "| arxiv-poisson3-10k" in (tmp_path / "loops_agree.md").read_text()
    assert json.loads((tmp_path / "loops_agree.json").read_text())["identical"] is True


def test_an_output_folder_it_cannot_write_is_one_line_and_status_2(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    script = Path(loops_agree.__file__)
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--scenarios", "512-128-t0-2k", "--out", str(blocker / "out")],
        capture_output=True,
        text=True,
        cwd=script.parent,
        check=False,
    )
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("loops_agree: error:") and "Traceback" not in done.stderr


def test_the_runs_own_keys_are_what_kvbench_compare_holds_as_machine_noise():
    # wall-clock times and rates follow kvbench compare's default tolerances, so a new one is left
    # out without this script knowing its name; every simulated number is compared
    for key in (
        "sim_wall_s",
        "loop_wall_s",
        "simulated_requests_per_wall_s",
        "some_new_wall_s",
        "kvbench_commit",
        "job",
        "date",
    ):
        assert loops_agree.run_own(key), key
    for key in ("num_steps", "tpot_p50_s", "num_preemptions", "kv_budget_bytes", "allocator"):
        assert not loops_agree.run_own(key), key
