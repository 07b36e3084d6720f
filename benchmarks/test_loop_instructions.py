"""loop_instructions.py: valgrind's count read right, a clear line where it cannot count.

The count itself takes minutes under valgrind, so it is run by hand
(``benchmarks/results/loop_instructions-2026-12-03.md``), not here."""

from __future__ import annotations

import loop_instructions
import pytest


def test_the_total_is_read_from_cachegrinds_summary():
    stderr = "==123== \n==123== I refs:      6,374,700,436\n"
    assert int(loop_instructions.I_REFS.search(stderr).group(1).replace(",", "")) == 6_374_700_436


def test_the_report_gives_each_config_its_ratio():
    rows = [{"config": "arrivals", "base": 200, "head": 150, "steps": 7376, "rows": 328}]
    text = loop_instructions.report(rows, "a", "b")
    assert "| arrivals | 7,376 | 328 | 200 | 150 | 0.7500 |" in text


def test_without_valgrind_it_says_so_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert loop_instructions.main([]) == 2
    assert capsys.readouterr().err.strip() == (
        "loop instructions: error: valgrind is not installed (apt install valgrind)"
    )


def test_an_unknown_config_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        loop_instructions.main(["--config", "nope"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_different_work_is_not_compared(monkeypatch, tmp_path):
    work = {"base": [10, 2, 1], "head": [11, 2, 1]}
    monkeypatch.setattr(loop_instructions, "compile_tree", lambda tree: None)
    monkeypatch.setattr(loop_instructions, "loop_instructions", lambda tree, overrides: (100, work[tree.name]))
    with pytest.raises(loop_instructions.NotComparable, match="simulate different work"):
        loop_instructions.compare(tmp_path / "base", tmp_path / "head", ["arrivals"])


def test_a_head_without_a_base_is_refused(capsys):
    assert loop_instructions.main(["--head", "HEAD"]) == 2
    assert capsys.readouterr().err.strip() == "loop instructions: error: give --base with --head"


def test_a_streamed_count_reports_the_loop_and_the_loop_with_its_commit(monkeypatch, tmp_path):
    counts = {"base": (400, 100, [10, 4, 2]), "head": (300, 180, [10, 4, 2])}
    monkeypatch.setattr(loop_instructions, "compile_tree", lambda tree: None)
    monkeypatch.setattr(loop_instructions, "streamed_instructions", lambda tree, overrides: counts[tree.name])
    rows = loop_instructions.compare(tmp_path / "base", tmp_path / "head", ["chat"], streamed=True)
    assert rows == [
        {"config": "chat", "base": 400, "head": 300, "steps": 10, "rows": 4, "base_commit": 100, "head_commit": 180}
    ]
    text = loop_instructions.report(rows, "a", "b")
    assert "| chat | 10 | 4 | 400 | 300 | 0.7500 | 500 | 480 | 0.9600 |" in text
