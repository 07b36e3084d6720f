"""tokens_scaling.py's smoke test: a small run of every regime writes the table, the JSON and the
figure, and what it reports is consistent (counts exact; no wall-clock bound)."""

from __future__ import annotations

import json

import pytest
import tokens_scaling


def test_a_small_run_reports_every_regime(tmp_path):
    assert tokens_scaling.main(["--requests", "130", "--pairs", "2", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "tokens_scaling.json").read_text())
    assert list(report["regimes"]) == list(tokens_scaling.REGIMES)
    for name, regime in report["regimes"].items():
        one, sixteen = (regime["sides"][str(n)] for n in tokens_scaling.OUTPUT_TOKENS)
        assert sixteen["steps"] > one["steps"] and sixteen["events"] >= one["events"] > 0
        assert regime["event_ratio"] == sixteen["events"] / one["events"]
        assert regime["loop_ratio"] > 0 and one["us_per_event"] > 0
        # 128 running x 2,560 tokens exceed the lecture's 118,784 slots (not 4x that); 128 x 256 the
        # storm's 16,000 already at 1x
        assert (one["preemptions"] > 0) == ("storm" in name)
        assert (sixteen["preemptions"] > 0) == ("preempts" in name or "storm" in name)
    assert "| cost ratio |" in (tmp_path / "tokens_scaling.md").read_text()
    assert (tmp_path / "tokens_scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_are_one_line(capsys):
    assert tokens_scaling.main(["--pairs", "0"]) == 2
    assert capsys.readouterr().err == "error: --requests and --pairs must be at least 1\n"


def test_an_interrupt_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(tokens_scaling, "measure_regime", interrupted)
    assert tokens_scaling.main(["--out", str(tmp_path)]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "tokens scaling: interrupted, nothing written"
    assert not any(tmp_path.iterdir())


def test_runs_that_differ_from_pair_to_pair_are_refused_in_one_line(monkeypatch, capsys):
    runs = iter(range(100))

    def drifting(overrides):  # a different step count each time
        return {"loop_s": 1.0, "steps": next(runs), "events": 1, "preemptions": 0}

    monkeypatch.setattr(tokens_scaling, "measure", drifting)
    assert tokens_scaling.main(["--pairs", "2"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: 128 output tokens: the same config simulated different runs")


def test_an_out_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        tokens_scaling, "measure", lambda overrides: {"loop_s": 1.0, "steps": 2, "events": 1, "preemptions": 0}
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as stopped:
        tokens_scaling.main(["--pairs", "1", "--out", str(blocker / "out")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("tokens_scaling: error: --out=") and "not a folder" in err
