"""scale.py's smoke test: its --quick mode on three scenarios writes the goals table, the floor and
the profiles (kvbench only, small N: about 15 s), and the pieces it builds on behave."""

from __future__ import annotations

import json

import numpy as np
import scale
from side_by_side import AZURE_CONV, MAX_TOKENS, azure_rows, azure_scenario


def test_advancing_the_steps_counts_every_step_and_event():
    assert scale.advance_steps([1, 3, 2], [0.5, 0.25, 0.25]) == (1.0, 6, 3)


def test_the_azure_trace_is_tiled_with_its_own_gaps(tmp_path):
    arrival, prompt, output = azure_rows(AZURE_CONV)
    rows = len(arrival)
    scenario = azure_scenario("azure", AZURE_CONV, rows + 10, tmp_path)
    table = np.genfromtxt(tmp_path / "azure_vidur.csv", delimiter=",", names=True)
    assert len(table) == rows + 10 and scenario.vidur_env["N"] == str(rows + 10)
    gaps = np.diff(table["arrival_s"])
    assert np.allclose(gaps[: rows - 1], np.diff(arrival)) and np.allclose(gaps[rows:], np.diff(arrival)[:9])
    assert np.isclose(gaps[rows - 1], arrival[-1] / (rows - 1))  # the copies join one mean gap apart
    assert (table["prompt_tokens"] + table["decode_tokens"]).max() <= MAX_TOKENS
    assert np.array_equal(table["decode_tokens"][:rows], output)


def test_quick_mode_writes_the_goals_table(tmp_path):
    scenarios = "poisson100k,storm,storm16x"
    report = scale.main(
        ["--quick", "--scenarios", scenarios, "--no-million", "--profiler", "cprofile", "--out", str(tmp_path)]
    )
    written = json.loads((tmp_path / "scale.json").read_text())
    assert list(written["scenarios"]) == scenarios.split(",") == list(report["floors"])
    goals = {(g["goal"].split(" ")[0], g["where"]) for g in written["goals"]}
    assert ("peak", "poisson100k") in goals and ("16x", "storm16x") in goals and ("1-request", "run_1_request") in goals
    assert all(g["verdict"] in ("pass", "fail", "not measured") for g in written["goals"])
    assert all(f["events"] > 0 and f["floor_s"] > 0 for f in written["floors"].values())
    assert written["scenarios"]["storm16x"]["median"]["kvbench_preemptions"] > 0
    assert set(written["profiles"]) == {"poisson100k", "storm16x"}
    assert all(p["top"] for p in written["profiles"].values())
    assert "## Goals" in (tmp_path / "scale.md").read_text()
    assert "== storm16x" in (tmp_path / "scale_profiles.txt").read_text()
