"""peak_memory.py: two versions of kvbench measured in turns, the medians and ratios right, a clear
line where they cannot be compared."""

from __future__ import annotations

import os
import stat

import peak_memory
import pytest


def _runs(base_peaks, head_peaks, work=("10", "5", "1.5")):
    return {
        side: [{"peak_rss_bytes": peak, "wall_s": 2.0, "work": list(work)} for peak in peaks]
        for side, peaks in (("base", base_peaks), ("head", head_peaks))
    }


def test_the_ratio_is_the_median_of_the_pairs():
    runs = _runs([200e6, 210e6, 190e6], [180e6, 210e6, 171e6])
    stats = peak_memory.summarize(runs)
    assert stats["base"]["peak_rss_mb"] == 200.0 and stats["head"]["peak_rss_mb"] == 180.0
    assert stats["peak_ratio"] == pytest.approx(0.9)  # pairs: 0.9, 1.0, 0.9
    meta = {
        "date": "d",
        "command": "c",
        "machine": "m",
        "scenario": "azure-conv-1x-100k, 100,000 requests",
        "num_requests": 100_000,
        "pairs": 3,
        "base": "b",
        "head": "h",
    }
    text = peak_memory.report(meta, runs, stats)
    assert "| base | 200.0 | 190.7 | 2.00 | 200.0, 210.0, 190.0 |" in text
    assert "peak RSS **0.9000**" in text and "at most 200 MB" in text


def test_different_work_is_not_compared(monkeypatch, tmp_path):
    work = {"base": ["10", "5", "1.5"], "head": ["11", "5", "1.5"]}
    monkeypatch.setattr(peak_memory, "compile_tree", lambda tree: None)
    monkeypatch.setattr(
        peak_memory,
        "run_once",
        lambda tree, overrides, run_dir: {"peak_rss_bytes": 1, "wall_s": 1.0, "work": work[tree.name]},
    )
    with pytest.raises(peak_memory.NotComparable, match="simulate different work"):
        peak_memory.compare(tmp_path / "base", tmp_path / "head", [], 1, tmp_path)


def test_bad_arguments_get_one_line_and_exit_2(capsys):
    assert peak_memory.main(["--head", "HEAD"]) == 2
    assert capsys.readouterr().err.strip() == "peak memory: error: give --base with --head"
    assert peak_memory.main(["--pairs", "0"]) == 2
    assert capsys.readouterr().err.strip() == "peak memory: error: --pairs and --requests must be at least 1"
    assert peak_memory.main(["--base", "no-such-commit", "--requests", "5"]) == 2
    assert capsys.readouterr().err.startswith("peak memory: error: ")


def test_one_version_against_itself_measures_the_same_work(tmp_path, capsys):
    assert (
        peak_memory.main(
            ["--base", "HEAD", "--head", "HEAD", "--requests", "200", "--pairs", "1", "--out", str(tmp_path)]
        )
        == 0
    )
    text = (tmp_path / "peak_memory.md").read_text()
    assert text == capsys.readouterr().out and "azure-conv-1x-100k, 200 requests" in text and "at most" not in text


def test_an_out_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    measured = []
    monkeypatch.setattr(peak_memory, "export_pair", lambda base, head, dest: (dest, "b", dest, "h"))
    monkeypatch.setattr(peak_memory, "compare", lambda *args, **kwargs: measured.append(1) or _runs([200e6], [190e6]))
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = ["--base", "HEAD", "--head", "HEAD", "--requests", "5", "--pairs", "1", "--out", str(blocker / "out")]
    with pytest.raises(SystemExit) as stopped:
        peak_memory.main(argv)
    assert stopped.value.code == 2 and not measured, "refused before any measurement"
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("peak memory: error: --out=") and "not a folder" in err


def test_a_report_name_that_is_a_fifo_is_refused_and_left(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(peak_memory, "export_pair", lambda base, head, dest: (dest, "b", dest, "h"))
    monkeypatch.setattr(peak_memory, "compare", lambda *args, **kwargs: _runs([200e6], [190e6]))
    os.mkfifo(tmp_path / "peak_memory.md")
    argv = ["--base", "HEAD", "--head", "HEAD", "--requests", "5", "--pairs", "1", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as stopped:
        peak_memory.main(argv)
    assert stopped.value.code == 2 and "peak_memory.md is a FIFO" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(tmp_path / "peak_memory.md").st_mode)
