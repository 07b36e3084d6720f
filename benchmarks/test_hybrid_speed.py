"""hybrid_speed.py: a small run of both models, paired, writes its report with the ratio per engine
step (about 10 s), and refuses an unknown model."""

from __future__ import annotations

import json

import hybrid_speed
import pytest


def test_a_small_run_compares_the_window_model_with_its_twin_per_engine_step(tmp_path):
    report = hybrid_speed.main(["--requests", "300", "--repeat", "1", "--out", str(tmp_path)])
    pair = report["pairs"]["gemma3-12b"]
    window, twin = pair["sides"]["window"], pair["sides"]["twin"]
    assert window["requests"] == twin["requests"] == 300
    assert window["steps"] >= window["events"] > 0 and twin["steps"] >= twin["events"] > 0
    assert pair["per_step_ratio"] == pytest.approx(window["us_per_step"] / twin["us_per_step"])
    assert "model.hf_config.sliding_window=null" in pair["overrides"]["twin"]
    text = (tmp_path / "hybrid_speed.md").read_text()
    assert "| Gemma-3-12B (5:1, window 1,024) |" in text and "full attention, the twin" in text
    assert json.loads((tmp_path / "hybrid_speed.json").read_text())["requests"] == 300


def test_an_unknown_model_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        hybrid_speed.parse_args(["--models", "gemma3-12b,nope"])
    assert exit_info.value.code == 2 and "unknown nope" in capsys.readouterr().err
