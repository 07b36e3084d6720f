"""`kvbench slo-search`: bisection over simulated runs for the largest rate or batch cap meeting SLOs."""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest
from kvbench_cli import kvbench, main_status

from kvbench.api import run
from kvbench.commands import slo_search as search_command
from kvbench.slo import search
from kvbench.slo.search import bisect, expected_runs, is_monotone

SMALL = ["workload.num_requests=200", "wandb.mode=disabled", "progress=false"]
#: the vLLM paper's ShareGPT setting (OPT-13B on an A100-40GB, Poisson arrivals)
SHAREGPT = ["workload=sharegpt_like", "model=opt-13b", "hardware=a100-40gb", *SMALL]
SLOS = ["slo.ttft_s=2", "slo.tpot_s=0.05"]


def run_main(monkeypatch, *args: str) -> int:
    """``kvbench slo-search <args>`` in this process; the exit status (0 when main returns)."""
    return main_status(monkeypatch, "slo-search", search_command.main, *args)


def attainment(overrides: list[str]) -> float:
    return run(overrides).summary["slo_attainment"]


# --- the bisection itself, on known thresholds ---------------------------------------------------


def test_rate_bisection_brackets_a_threshold_within_the_relative_tolerance():
    calls = []

    def passes(rate):
        calls.append(rate)
        return rate <= 3.3

    found = bisect(passes, 0.1, 64.0, integer=False, rel_tol=0.05, max_runs=20)
    assert found.status == "bracketed" and found.converged
    assert found.low <= 3.3 < found.high and found.high / found.low <= 1.05
    # geometric halving: both ends, then one probe per halving of log(high / low)
    assert len(calls) == len(found.probes) == expected_runs(0.1, 64.0, False, 0.05)
    assert calls[2] == pytest.approx(math.sqrt(0.1 * 64.0))


def test_integer_bisection_ends_on_neighbours():
    found = bisect(lambda n: n <= 37, 1, 1024, integer=True, rel_tol=0.05, max_runs=20)
    assert (found.status, found.low, found.high) == ("bracketed", 37, 38)
    assert all(float(v).is_integer() for v in found.probes)
    assert len(found.probes) == expected_runs(1, 1024, True, 0.05) == 12


def test_out_of_bracket_ranges_and_the_run_limit():
    assert bisect(lambda x: True, 1, 8, integer=False, rel_tol=0.05, max_runs=20).status == "high_passes"
    low_fails = bisect(lambda x: False, 1, 8, integer=False, rel_tol=0.05, max_runs=20)
    assert low_fails.status == "low_fails" and len(low_fails.probes) == 2
    capped = bisect(lambda x: x <= 3.3, 0.1, 64.0, integer=False, rel_tol=0.001, max_runs=5)
    assert len(capped.probes) == 5 and not capped.converged and capped.low <= 3.3 < capped.high


def test_a_pass_above_a_fail_is_not_monotone():
    assert is_monotone({1.0: True, 2.0: True, 4.0: False})
    assert not is_monotone({1.0: True, 2.0: False, 4.0: True})


# --- the command, on simulated runs ---------------------------------------------------------------


def test_rate_search_answer_passes_and_the_next_step_fails(tmp_path, monkeypatch, capsys):
    assert run_main(monkeypatch, "--over", "rate", *SHAREGPT, *SLOS, "--out", str(tmp_path)) == 0
    out = capsys.readouterr().out
    document = json.loads((tmp_path / "search.json").read_text())
    low, high = document["bracket"]
    assert document["status"] == "bracketed" and document["answer"] == low and document["monotone"]
    assert high / low <= 1.05  # the relative tolerance
    # re-run both ends of the bracket: the answer meets the target, the next probe above does not
    assert attainment([*SHAREGPT, *SLOS, f"workload.rate_per_s={low!r}"]) >= 0.9
    assert attainment([*SHAREGPT, *SLOS, f"workload.rate_per_s={high!r}"]) < 0.9
    curve = pd.read_parquet(tmp_path / "curve.parquet")
    assert len(curve) == document["num_runs"] == sum(line.startswith("probe ") for line in out.splitlines())
    assert curve["value"].is_monotonic_increasing and curve["value"].is_unique
    assert curve.equals(pd.read_csv(tmp_path / "curve.csv"))
    assert (curve["passed"] == (curve["slo_attainment"] >= 0.9)).all()
    assert (curve["goodput_requests_per_s"] <= curve["throughput_requests_per_s"] + 1e-12).all()
    assert (tmp_path / "curve.png").stat().st_size > 0
    assert set(json.loads((tmp_path / "COMPLETE").read_text())["files"]) == {
        "curve.parquet",
        "curve.csv",
        "curve.png",
        "search.json",
    }
    assert document["slo"] == {"ttft_s": 2.0, "tpot_s": 0.05} and document["overrides"] == [*SHAREGPT, *SLOS]
    line = re.search(
        r"largest rate meeting ttft<=2 s, tpot<=50 ms for 90 % of requests: ([\d.]+) req/s "
        r"\(bracket ([\d.]+)\.\.([\d.]+)\)",
        " ".join(out.split()),
    )
    assert line, out
    printed = [float(x) for x in line.groups()]
    assert printed == pytest.approx([low, low, high], rel=0.005)  # 3 significant digits


def test_batch_cap_search_ends_on_neighbouring_integers(tmp_path, monkeypatch, capsys):
    # lecture_chat: 640-token requests all at t = 0; a larger cap makes every decode step slower
    common = ["workload=lecture_chat", *SMALL, "slo.tpot_s=0.02"]
    assert run_main(monkeypatch, "--over", "max_num_seqs", *common, "--out", str(tmp_path)) == 0
    document = json.loads((tmp_path / "search.json").read_text())
    low, high = document["bracket"]
    assert isinstance(low, int) and high == low + 1 and document["midpoint"] == "arithmetic (integer)"
    assert attainment([*common, f"scheduler.max_num_seqs={low}"]) >= 0.9
    assert attainment([*common, f"scheduler.max_num_seqs={high}"]) < 0.9
    # mixed steps (prefills stall decodes) keep the simulated cap below the decode-only 159
    assert low < 159
    assert f"largest max_num_seqs meeting tpot<=20 ms for 90 % of requests: {low} (bracket {low}..{high})" in " ".join(
        capsys.readouterr().out.split()
    )


@pytest.mark.parametrize(
    "low, high, status, hint",
    [("0.5", "1", "high_passes", "try a larger --high"), ("20", "40", "low_fails", "try a smaller --low")],
)
def test_a_range_that_does_not_bracket_is_reported_and_still_written(
    tmp_path, monkeypatch, capsys, low, high, status, hint
):
    args = ["--over", "rate", *SHAREGPT, *SLOS, "--low", low, "--high", high, "--out", str(tmp_path)]
    assert run_main(monkeypatch, *args) == 1
    assert hint in " ".join(capsys.readouterr().out.split())
    document = json.loads((tmp_path / "search.json").read_text())
    assert document["status"] == status and document["answer"] is None
    assert list(pd.read_csv(tmp_path / "curve.csv")["value"]) == [float(low), float(high)]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--over", "rate", *SHAREGPT], "no SLO given"),
        (["--over", "rate", "workload=lecture_chat", *SLOS], "workload.arrival=all_at_once"),
        (["--over", "rate", *SHAREGPT, *SLOS, "--low", "4", "--high", "2"], "--high=2.0 is invalid"),
        (["--over", "rate", *SHAREGPT, *SLOS, "--low", "-1"], "--low=-1.0 is invalid"),
        (["--over", "rate", *SHAREGPT, *SLOS, "--attainment", "0"], "--attainment=0.0"),
        (["--over", "rate", *SHAREGPT, *SLOS, "--attainment", "1.2"], "--attainment=1.2"),
        (["--over", "max_num_seqs", *SLOS, "--high", "10.5"], "whole number"),
        (["--over", "rate", *SHAREGPT, *SLOS, "workload.rate_per_s=3"], "drop it"),
        (["--over", "rate", *SHAREGPT, *SLOS, "--rel-tol", "0"], "--rel-tol=0.0"),
        (["--over", "rate", *SHAREGPT, *SLOS, "--bogus", "1"], "unknown option --bogus"),
        (["--over", "speed", *SLOS], "invalid choice: 'speed'"),
        ([*SLOS], "--over"),
        (["--over", "rate", *SHAREGPT, "slo.ttft=2"], "slo.ttft=2 is not a config key"),
        (["--over", "rate", *SHAREGPT, "slo.ttft=2"], "did you mean `slo.ttft_s`?"),
        # SLOs are slo.* keys in seconds here as in slo-batch: a flag in ms is refused with that spelling
        (["--over", "rate", *SHAREGPT, "--tpot-ms", "50"], "write slo.tpot_s=0.05 for --tpot-ms 50"),
        (["--over", "rate", *SHAREGPT, "slo.ttft_s=-2"], "slo.ttft_s=-2.0 is invalid"),
        (["--over", "rate", *SHAREGPT, *SLOS, "model=gpt5"], "model='gpt5'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, fragment):
    assert run_main(monkeypatch, *args, "--out", str(tmp_path)) == 2
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) == 1, captured.err
    assert captured.err.startswith("kvbench: error:") and fragment in captured.err, captured.err
    assert "probe 1" not in captured.out  # rejected before any run
    assert not (tmp_path / "COMPLETE").exists()


def test_bad_input_from_the_command_line_has_no_traceback(tmp_path):
    proc = kvbench("slo-search", "--over", "rate", *SHAREGPT, *SLOS, "--low", "3", "--high", "3", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().splitlines() == [
        "kvbench: error: --high=3.0 is invalid: use a finite number above --low=3"
    ]


# --- attainment that rises with the knob, bounds, signals ----------------------------------------


def test_a_rising_attainment_is_bisected_for_the_smallest_passing_value():
    found = bisect(lambda n: n >= 24, 1, 256, integer=True, rel_tol=0.05, max_runs=20)
    assert (found.status, found.low, found.high, found.converged) == ("rising", 23, 24, True)
    rate = bisect(lambda r: r >= 3.3, 0.1, 64.0, integer=False, rel_tol=0.05, max_runs=20)
    assert rate.status == "rising" and rate.low < 3.3 <= rate.high and rate.high / rate.low <= 1.05


class _Result:
    def __init__(self, attainment: float) -> None:
        self.summary = {column: 1.0 for column in search.PROBE_COLUMNS} | {"slo_attainment": attainment}


def test_a_cap_whose_attainment_rises_says_so_instead_of_low_fails(tmp_path, monkeypatch, capsys):
    # a TTFT SLO over max_num_seqs: a larger cap shortens the queue, so every cap from 24 up passes
    import kvbench.api

    def fake_run(overrides):
        cap = int(next(o for o in overrides if o.startswith("scheduler.max_num_seqs=")).split("=")[1])
        return _Result(1.0 if cap >= 24 else 0.5)

    monkeypatch.setattr(kvbench.api, "run", fake_run)
    args = [
        "--over",
        "max_num_seqs",
        "workload=lecture_chat",
        *SMALL,
        "slo.ttft_s=2",
        "--high",
        "256",
        "--out",
        str(tmp_path),
    ]
    assert run_main(monkeypatch, *args) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "attainment rises with max_num_seqs here" in out
        and "the smallest max_num_seqs meeting it is 24 (bracket 23..24)" in out
    )
    assert "misses ttft<=2 s for 90 % of requests: the range does not bracket" not in out  # the old, wrong headline
    document = json.loads((tmp_path / "search.json").read_text())
    assert (document["status"], document["smallest_passing"], document["bracket"], document["answer"]) == (
        "rising",
        24,
        [23, 24],
        None,
    )


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--rel-tol", "inf"], "--rel-tol=inf is invalid"),
        (["--rel-tol", "nan"], "--rel-tol=nan is invalid"),
        (["--rel-tol", "1e-20"], "--rel-tol=1e-20 is invalid: use a fraction from 1e-06 to 1"),
        (["--max-runs", "1000000"], "--max-runs=1000000 is invalid"),
        (["--low", "1e-300"], "--high=64.0 is invalid: use a range of at most 1e+12"),
    ],
)
def test_numeric_options_are_bounded(tmp_path, monkeypatch, capsys, extra, fragment):
    assert run_main(monkeypatch, "--over", "rate", *SHAREGPT, *SLOS, *extra, "--out", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_sigterm_during_a_probe_is_one_line_and_143(tmp_path, monkeypatch, capsys):
    import os
    import signal

    import kvbench.api

    monkeypatch.setattr(kvbench.api, "run", lambda overrides: os.kill(os.getpid(), signal.SIGTERM))
    assert run_main(monkeypatch, "--over", "rate", *SHAREGPT, *SLOS, "--out", str(tmp_path)) == 143
    err = capsys.readouterr().err
    assert err == "kvbench: interrupted by SIGTERM; nothing written is marked complete\n"
    assert not (tmp_path / "COMPLETE").exists()
