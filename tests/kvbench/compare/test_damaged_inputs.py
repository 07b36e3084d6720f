"""`kvbench compare` on damaged artifacts: exit 2 and one line for anything unusable, 1 only when
a metric moved, 3 when kvbench itself fails, so that a CI gate can tell a regression from a
broken artifact from a bug."""

from __future__ import annotations

import json
import os
import signal

import pytest

from kvbench.commands import compare as cli
from kvbench.io.atomic import COMPLETE, mark_complete


def compare(*args) -> int:
    with pytest.raises(SystemExit) as stop:
        cli.main([str(a) for a in args])
    return stop.value.code


def one_line(capsys, prefix: str = "kvbench compare: error:") -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out, captured.err
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), captured.err
    return lines[0]


def revouch(job_dir) -> None:
    """Re-write COMPLETE for the files as they now are: a damaged file its marker vouches for."""
    mark_complete(job_dir, list(json.loads((job_dir / COMPLETE).read_text())["files"]))


def _truncate(job):
    path = job / "summary.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty_vouched(job):
    (job / "summary.parquet").write_bytes(b"")
    revouch(job)


def _garbage_vouched(job):
    (job / "summary.parquet").write_bytes(b"PAR1" + b"\0" * 64)
    revouch(job)


def _config_not_json(job):
    (job / "config.json").write_text('{"allocator": ')
    revouch(job)


def _config_deep(job):
    (job / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    revouch(job)


def _config_a_list(job):
    (job / "config.json").write_text("[1, 2]")
    revouch(job)


def _listed_file_missing(job):
    (job / "summary.csv").unlink()


def _unlisted_result_file(job):
    (job / "steps.parquet").write_bytes(b"left by another run")


def _marker_damaged(job):
    (job / COMPLETE).write_text('{"files": 3}')


def _writer_temporary(job):
    (job / ".tmp-summary.csv.123.abcd").write_text("half")


@pytest.mark.parametrize(
    "damage, fragment",
    [
        (_truncate, "summary.parquet is"),
        (_empty_vouched, "summary.parquet cannot be read"),
        (_garbage_vouched, "summary.parquet cannot be read"),
        (_config_not_json, "not valid JSON"),
        (_config_deep, "nested too deeply"),
        (_config_a_list, "holds a JSON list, not an object"),
        (_listed_file_missing, "summary.csv, listed in COMPLETE, is missing"),
        (_unlisted_result_file, "steps.parquet is there but not listed in COMPLETE"),
        (_marker_damaged, "COMPLETE marker is damaged"),
        (_writer_temporary, "temporary file .tmp-summary.csv"),
    ],
)
@pytest.mark.parametrize("side", ["base", "head"])
def test_a_damaged_job_is_unusable_exit_2_in_one_line(two_copies, tmp_path, capsys, damage, fragment, side):
    base, head = two_copies
    damage((base if side == "base" else head) / "1")
    assert compare(base, head, "--out", tmp_path / "cmp") == 2
    line = one_line(capsys)
    assert fragment in line and side in line, line
    assert not (tmp_path / "cmp").exists()


def test_a_damaged_single_run_folder_is_unusable_too(two_copies, tmp_path, capsys):
    base, head = two_copies
    _truncate(head / "0")
    assert compare(base / "0", head / "0", "--out", tmp_path / "cmp") == 2
    assert "damaged" in one_line(capsys)


def test_an_undecodable_tolerance_file_is_exit_2(two_copies, tmp_path, capsys):
    base, head = two_copies
    rules = tmp_path / "rules.yaml"
    rules.write_bytes(b"\xff\xfe\x00t\x00o")
    assert compare(base, head, "--tolerances", rules, "--out", tmp_path / "cmp") == 2
    assert "not UTF-8 text" in one_line(capsys)
    rules.write_text("[" * 100_000)
    assert compare(base, head, "--tolerances", rules, "--out", tmp_path / "cmp") == 2
    assert "--tolerances" in one_line(capsys)


def test_a_bom_in_a_tolerance_file_is_read_past(two_copies, tmp_path, capsys):
    base, head = two_copies
    rules = tmp_path / "rules.yaml"
    rules.write_text("\ufefftolerances:\n  ttft_p50_s: abs:1000\n", encoding="utf-8")
    assert compare(base, head, "--tolerances", rules, "--out", tmp_path / "cmp") == 0


def test_a_bug_in_kvbench_is_exit_3_not_a_moved_metric(two_copies, tmp_path, monkeypatch, capsys):
    base, head = two_copies

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "compare_jobs", broken)
    assert compare(base, head, "--out", tmp_path / "cmp") == 3
    err = capsys.readouterr().err
    assert err.startswith("kvbench compare: internal error (a bug in kvbench, please report it): RuntimeError: a bug")


def test_sigterm_is_one_line_and_143_with_nothing_marked_complete(two_copies, tmp_path, monkeypatch, capsys):
    base, head = two_copies

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(cli, "compare_jobs", killed)
    assert compare(base, head, "--out", tmp_path / "cmp") == 143
    assert one_line(capsys, "kvbench compare: interrupted by SIGTERM")
    assert not (tmp_path / "cmp" / COMPLETE).exists()
