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
    # the 16x goal's bound: the step table's own growth, an exact count of events
    floors, storm16x = written["floors"], written["sixteen_x"]["storm16x"]
    assert storm16x["events"] == floors["storm16x"]["events"] / floors["storm"]["events"] > 1
    assert storm16x["floor"] == floors["storm16x"]["floor_s"] / floors["storm"]["floor_s"]
    sixteen = next(g for g in written["goals"] if g["where"] == "storm16x" and g["goal"].startswith("16x"))
    assert f"events {storm16x['events']:.1f}x" in sixteen["measured"]
    # the 1-request goal's bound: the Hydra app writing a table and a figure, paired round by round
    hydra = written["hydra"]
    assert hydra["outputs_floor_ratio"] > 0 and hydra["ratio_own_floor"] > 0
    assert hydra["hydra_app_outputs"]["wall_s"] > 0
    # the process goal's bound: a run writes its tables, so it cannot beat the app writing one
    floor_s = hydra["hydra_app_tables"]["wall_s"]
    for goal in (g for g in written["goals"] if g["goal"].startswith("whole process")):
        vidur_s = written["scenarios"][goal["where"]]["median"]["vidur_process_s"]
        assert ("bound" in goal["measured"]) == bool(vidur_s)  # --quick runs no Vidur: no bound
        if vidur_s:
            assert f"(bound {vidur_s / floor_s:.1f}x)" in goal["measured"]
    assert set(written["profiles"]) == {"poisson100k", "storm16x"}
    assert all(p["top"] for p in written["profiles"].values())
    assert "## Goals" in (tmp_path / "scale.md").read_text()
    assert "== storm16x" in (tmp_path / "scale_profiles.txt").read_text()


def test_the_goals_carry_the_floors_that_bound_them():
    """With Vidur's times, each process goal names its bound (Vidur's process over the Hydra app
    writing a table), the 16x goal the events' own growth, the 1-request goal the outputs' floor."""
    scenario = lambda loop, process, vidur_s: {  # noqa: E731
        "loop_speedup": loop,
        "process_speedup": process,
        "median": {"vidur_process_s": vidur_s},
    }
    report = {
        "scenarios": {"tokens1x": scenario(32.0, 5.9, 3.5), "tokens16x": scenario(15.0, 10.5, 18.0)},
        "sixteen_x": {
            "lecture": {"kvbench": 36.7, "vidur": 17.3, "events": 7898 / 266, "floor": 41.0},
        },
        "hydra": {
            "ratio": 3.4,
            "ratio_no_output": 1.7,
            "outputs_floor_ratio": 2.6,
            "ratio_own_floor": 1.4,
            **{
                name: {"wall_s": wall_s, "walls_s": [wall_s], "peak_rss_mb": 50.0}
                for name, wall_s in (("hydra_app", 0.3), ("hydra_app_tables", 0.4), ("hydra_app_outputs", 0.8))
            },
            "kvbench_1_request": {"wall_s": 1.1, "walls_s": [1.1], "peak_rss_mb": 120.0},
        },
    }
    measured = {(g["goal"].split(" ")[0], g["where"]): g for g in scale.goals(report)}
    assert measured["whole", "tokens1x"]["measured"] == "5.9x (bound 8.8x)"
    assert measured["whole", "tokens1x"]["verdict"] == "fail"
    assert measured["whole", "tokens16x"]["measured"] == "10.5x (bound 45.0x)"
    assert measured["16x", "lecture"]["measured"] == "36.7x (Vidur 17.3x; events 29.7x, the floor loop over them 41.0x)"
    one = measured["1-request", "run_1_request"]["measured"]
    assert one.endswith("; the Hydra app writing a table and a figure 2.60x, kvbench 1.40x that")
    report["goals"] = scale.goals(report)
    report.update(measured_at="now", command="c", machine="m", repeat=1, large_repeat=1, vidur=True)
    report.update(scenarios={}, vidur_errors={}, floors={}, profiles={})  # (the goals table alone)
    text = scale.markdown(report)
    assert "Hydra app writing a one-row table with kvbench's libraries (0.40 s" in text
    assert "| the same with `output.tables=true output.figure=true` (and draws a figure) | 0.80 | 50 |" in text
