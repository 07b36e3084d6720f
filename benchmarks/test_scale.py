"""scale.py's smoke test: its --quick mode on four scenarios writes the goals table, the floor and
the profiles (kvbench only, small N: about 30 s), and the pieces it builds on behave."""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest
import scale
from side_by_side import (
    AZURE_CONV,
    MAX_TOKENS,
    azure_rows,
    azure_scenario,
    chat_poisson_scenario,
    run_kvbench,
    run_vidur,
    same_requests,
)

from kvbench.api import run


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


def test_the_azure_trace_at_a_higher_rate_divides_every_arrival(tmp_path):
    azure_scenario("own", AZURE_CONV, 300, tmp_path)
    scenario = azure_scenario("scaled", AZURE_CONV, 300, tmp_path, rate_scale=1.5)
    own = np.genfromtxt(tmp_path / "own_vidur.csv", delimiter=",", names=True)
    scaled = np.genfromtxt(tmp_path / "scaled_vidur.csv", delimiter=",", names=True)
    assert np.array_equal(own["prompt_tokens"], scaled["prompt_tokens"])
    assert np.array_equal(own["decode_tokens"], scaled["decode_tokens"])
    assert np.allclose(scaled["arrival_s"] * 1.5, own["arrival_s"], rtol=1e-12, atol=0)
    assert "1.5x its rate" in scenario.description
    with pytest.raises(ValueError, match="rate_scale"):
        azure_scenario("none", AZURE_CONV, 10, tmp_path, rate_scale=0)


def test_the_chat_scenario_is_the_requests_kvbench_s_own_chat_workload_serves(tmp_path):
    """Replayed, the chat list is what ``workload=lognormal`` at Poisson arrivals serves itself."""
    scenario = chat_poisson_scenario("chat", 60, tmp_path, 12.0)
    replayed = run([*scenario.kvbench_overrides, "progress=false"]).requests
    own = run([*scenario.kvbench_overrides[:-2], *CHAT_WORKLOAD, "progress=false"]).requests
    columns = ["arrival_s", "prompt_tokens", "output_tokens", "finish_s"]
    assert len(replayed) == 60 and replayed[columns].equals(own[columns])
    table = np.genfromtxt(tmp_path / "chat_vidur.csv", delimiter=",", names=True)
    assert (table["prompt_tokens"] + table["decode_tokens"]).max() <= MAX_TOKENS
    assert scenario.vidur_env["N"] == "60" and "Poisson 12/s" in scenario.description


#: chat_poisson_scenario's workload, as a user would ask kvbench for it (60 requests at 12/s)
CHAT_WORKLOAD = ["workload=lognormal", "workload.num_requests=60", "workload.arrival=poisson", "workload.rate_per_s=12"]


def test_every_scenario_is_named_by_its_lengths_arrivals_and_requests():
    for spec in scale.SPECS + (scale.MILLION_SPEC,):
        count = spec.full // 1000
        assert re.search(rf"-{count // 1000}m$|-{count}k(-vllm|-orca)?$", spec.name), spec.name
        assert "poisson" in spec.name or "-1x-" in spec.name or "t0" in spec.name or "x-" in spec.name, spec.name
    assert f"chat-poisson{scale.CHAT_RATE_PER_S:g}-100k" in scale.NAMES
    assert f"azure-conv-{scale.AZURE_RATE_SCALE:g}x-100k" in scale.NAMES
    assert set(scale.ARRIVAL_HEAVY) | set(scale.AT_T0) | set(scale.AT_100K) <= set(scale.NAMES)
    assert {name for pair in scale.SIXTEEN_X.values() for name in pair} <= set(scale.NAMES)


def test_a_vidur_run_s_whole_loop_adds_its_request_making(tmp_path, monkeypatch):
    """A stand-in Vidur: its ``Simulator._init_event_queue`` is timed in its own process through
    ``vidur_timing`` (on the runner's PYTHONPATH); a runner whose Python ignores the path reports none."""
    package = tmp_path / "fake" / "vidur"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "simulator.py").write_text(
        "class Simulator:\n"
        "    def __init__(self):\n"
        "        self._event_queue = []\n"
        "        self._init_event_queue()\n"
        "    def _init_event_queue(self):\n"
        "        self._event_queue.extend(range(3))\n"
    )
    report = {
        "wall_s_event_loop": 2.5,
        "wall_s_process": 3.0,
        "peak_rss_mb": 100.0,
        "batches": 7,
        "requests": 3,
        "sim_seconds": 1.0,
        "tpot_ms_p50": 10.0,
    }
    child = f"import json, vidur.simulator as v; v.Simulator(); print(json.dumps({report!r}))"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    scenario = scale.SPECS[0].build(5, tmp_path)
    for flags, timed in (("", True), ("-E ", False)):  # -E: PYTHONPATH ignored
        runner = tmp_path / "runner.sh"
        runner.write_text(f'cd {tmp_path / "fake"} && exec "{sys.executable}" {flags}-c "{child}"\n')
        vidur = run_vidur(str(runner), scenario)
        assert vidur["event_loop_s"] == 2.5 and vidur["steps"] == 7
        if timed:
            assert vidur["request_making_s"] >= 0 and vidur["loop_s"] == 2.5 + vidur["request_making_s"]
        else:
            assert vidur["request_making_s"] is None and vidur["loop_s"] == 2.5
    assert os.environ["PYTHONPATH"] == str(tmp_path / "fake")  # the runner's path is its own


def test_a_kvbench_run_reports_its_whole_loop_and_its_events(tmp_path):
    scenario = scale.SPECS[0].build(40, tmp_path)
    row = run_kvbench(scenario, tmp_path / "run")
    steps = np.genfromtxt(tmp_path / "run" / "steps.csv", delimiter=",", names=True)
    assert row["events"] == len(steps) and row["steps"] == int(steps["num_steps"].sum()) > row["events"]
    assert row["loop_s"] >= row["engine_loop_s"] > 0  # the whole loop holds the engine's part
    assert same_requests(tmp_path / "run" / "requests.csv", str(tmp_path / f"{scenario.name}_vidur.csv"))


def test_quick_mode_writes_the_goals_table(tmp_path):
    chat, storm, storm16x = f"{scale.CHAT}-10k", "storm-128-128-t0-5k", "storm-128-2048-t0-5k"
    scenarios = ["arxiv-poisson3-100k", chat, storm, storm16x]
    report = scale.main(
        [
            "--quick",
            "--scenarios",
            ",".join(scenarios),
            "--no-million",
            "--profiler",
            "cprofile",
            "--out",
            str(tmp_path),
        ]
    )
    written = json.loads((tmp_path / "scale.json").read_text())
    assert list(written["scenarios"]) == scenarios == list(report["floors"])
    goals = {(g["goal"].split(" ")[0], g["where"]) for g in written["goals"]}
    assert ("peak", "arxiv-poisson3-100k") in goals and ("1-request", "run_1_request") in goals
    assert ("16x", storm16x) in goals and ("whole", chat) in goals
    assert all(g["verdict"] in ("pass", "fail", "not measured") for g in written["goals"])
    assert all(f["events"] > 0 and f["floor_s"] > 0 for f in written["floors"].values())
    assert written["scenarios"][storm16x]["median"]["kvbench_preemptions"] > 0
    # steps per event: the engine's steps over its loop's events, both exact counts from the step table
    for name, summary in written["scenarios"].items():
        median, floor = summary["median"], written["floors"][name]
        assert median["kvbench_events"] == floor["events"] and median["kvbench_steps"] == floor["steps"]
        assert summary["steps_per_event"] == floor["steps"] / floor["events"]
        assert all(r["kvbench"]["loop_s"] >= r["kvbench"]["engine_loop_s"] for r in summary["runs"])
    chat_goal = next(g for g in written["goals"] if g["where"] == chat)
    assert chat_goal["goal"].startswith("whole loop >= 30x") and chat_goal["verdict"] == "not measured"
    assert chat_goal["measured"] == f"- ({written['scenarios'][chat]['steps_per_event']:.1f} steps/event)"
    # the 16x goal's bound: the step table's own growth, an exact count of events
    floors, sixteen_x = written["floors"], written["sixteen_x"][storm16x]
    assert sixteen_x["events"] == floors[storm16x]["events"] / floors[storm]["events"] > 1
    assert sixteen_x["floor"] == floors[storm16x]["floor_s"] / floors[storm]["floor_s"]
    sixteen = next(g for g in written["goals"] if g["where"] == storm16x and g["goal"].startswith("16x"))
    assert f"events {sixteen_x['events']:.1f}x" in sixteen["measured"]
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
    assert set(written["profiles"]) == {"arxiv-poisson3-100k", storm16x}
    assert all(p["top"] for p in written["profiles"].values())
    text = (tmp_path / "scale.md").read_text()
    assert "## Goals" in text and "## The whole loop and its parts" in text and "load average" in text
    assert f"== {storm16x}" in (tmp_path / "scale_profiles.txt").read_text()


def test_the_goals_carry_the_floors_that_bound_them():
    """With Vidur's times, each process goal names its bound (Vidur's process over the Hydra app
    writing a table), the 16x goal the events' own growth, the 1-request goal the outputs' floor."""
    scenario = lambda loop, process, vidur_s: {  # noqa: E731
        "loop_speedup": loop,
        "process_speedup": process,
        "median": {"vidur_process_s": vidur_s},
    }
    report = {
        "scenarios": {"512-128-t0-2k": scenario(32.0, 5.9, 3.5), "512-2048-t0-2k": scenario(15.0, 10.5, 18.0)},
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
    assert measured["whole", "512-128-t0-2k"]["measured"] == "5.9x (bound 8.8x)"
    assert measured["whole", "512-128-t0-2k"]["verdict"] == "fail"
    assert measured["whole", "512-2048-t0-2k"]["measured"] == "10.5x (bound 45.0x)"
    assert measured["16x", "lecture"]["measured"] == "36.7x (Vidur 17.3x; events 29.7x, the floor loop over them 41.0x)"
    one = measured["1-request", "run_1_request"]["measured"]
    assert one.endswith("; the Hydra app writing a table and a figure 2.60x, kvbench 1.40x that")
    report["goals"] = scale.goals(report)
    report.update(measured_at="now", command="c", machine="m", repeat=1, large_repeat=1, vidur=True)
    report.update(scenarios={}, vidur_errors={}, floors={}, profiles={})  # (the goals table alone)
    text = scale.markdown(report)
    assert "Hydra app writing a one-row table with kvbench's libraries (0.40 s" in text
    assert "| the same with `output.tables=true output.figure=true` (and draws a figure) | 0.80 | 50 |" in text
