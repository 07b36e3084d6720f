"""`kvbench compare BASE HEAD` on real sweep folders: exit 0 / 1 / 2, matching, the table's width,
and the files it writes (only with --out)."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from kvbench_cli import kvbench

from kvbench.commands.compare import main
from kvbench.io.atomic import COMPLETE
from kvbench.output.results import write_failure


def compare(*args, out=None) -> int:
    """Run the command in-process; its exit status."""
    with pytest.raises(SystemExit) as stop:
        main([*map(str, args), "--out", str(out)] if out is not None else list(map(str, args)))
    return stop.value.code


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    errors = [line for line in captured.err.splitlines() if line.startswith("kvbench compare: error:")]
    assert len(errors) == 1, captured.err
    return errors[0]


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_two_copies_of_a_sweep_pass_and_write_the_comparison(two_copies, tmp_path, capsys):
    base, head = two_copies
    assert compare(base, head, out=tmp_path / "cmp") == 0
    assert last_line(capsys).startswith("kvbench compare: OK: 2 job(s) matched")
    frame = pd.read_parquet(tmp_path / "cmp" / "compare.parquet")
    assert set(frame["job"]) == {"allocator=naive", "allocator=paged"}
    # every numeric summary column of both jobs, every one the same (timings copied, not re-run)
    assert "peak_concurrency" in set(frame["metric"]) and (frame["verdict"] == "same").all()
    assert "model" not in set(frame["metric"])  # strings are labels, not metrics
    assert pd.read_csv(tmp_path / "cmp" / "compare.csv").shape == frame.shape
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 0 and (tmp_path / "cmp" / COMPLETE).is_file()


def test_one_metric_beyond_tolerance_exits_1_and_names_it(two_copies, tmp_path, capsys, edit_summary, summary_value):
    base, head = two_copies
    ttft_s = summary_value(base / "1", "ttft_p50_s")
    edit_summary(head / "1", ttft_p50_s=ttft_s * 1.004)
    assert compare(base, head, out=tmp_path / "cmp") == 1
    out = capsys.readouterr().out
    assert "ttft_p50_s" in out and "beyond" in out and "+0.40%" in out
    assert (
        out.strip()
        .splitlines()[-1]
        .startswith("kvbench compare: FAIL: 1 value(s) beyond tolerance (1 of 2 jobs): ttft_p50_s")
    )
    frame = pd.read_parquet(tmp_path / "cmp" / "compare.parquet")
    [failed] = frame[~frame["passed"]].to_dict("records")
    assert failed["job"] == "allocator=paged" and failed["metric"] == "ttft_p50_s" and failed["verdict"] == "beyond"
    assert failed["change_rel"] == pytest.approx(0.004)
    # the same edit, accepted by a looser tolerance for that metric: from the command line or a file
    assert compare(base, head, "--tol", "ttft_*=rel:0.01", out=tmp_path / "cmp2") == 0
    rules = tmp_path / "tolerances.yaml"
    rules.write_text("tolerances:\n  ttft_p50_s: abs:1000\n")
    assert compare(base, head, "--tolerances", rules, out=tmp_path / "cmp3") == 0
    # last match wins: a later --tol puts the metric back to exact
    assert compare(base, head, "--tol", "ttft_*=rel:0.01", "--tol", "ttft_p50_s=exact", out=tmp_path / "cmp4") == 1


def test_summation_noise_passes_and_a_change_too_small_to_print_still_fails(
    two_copies, tmp_path, capsys, edit_summary, summary_value
):
    base, head = two_copies
    duration_s = summary_value(base / "0", "duration_s")
    edit_summary(head / "0", duration_s=duration_s * (1 + 1e-12))  # another CPU's last bits
    assert compare(base, head, out=tmp_path / "noise") == 0
    frame = pd.read_parquet(tmp_path / "noise" / "compare.parquet").set_index(["job", "metric"])
    assert frame.loc[("allocator=naive", "duration_s"), "verdict"] == "within"
    capsys.readouterr()
    assert compare(base, head, "--tol", "duration_s=exact", out=tmp_path / "cmp") == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("duration (s)"))
    base_text, head_text = row.split()[2:4]
    assert base_text != head_text  # printed with enough digits to tell them apart
    assert float(base_text) == pytest.approx(duration_s, rel=1e-9) == float(head_text)


def test_a_rule_that_matches_no_metric_is_pointed_out(two_copies, tmp_path, capsys):
    base, head = two_copies
    assert compare(base, head, "--tol", "ttfx_*=rel:0.1", out=tmp_path / "cmp") == 0
    assert "kvbench compare: warning: --tol pattern 'ttfx_*' matches no metric" in capsys.readouterr().out


WALL_COLUMNS = ("sim_wall_s", "loop_wall_s", "simulated_requests_per_wall_s")


@pytest.mark.parametrize("factor", [10.0, 0.1, 3.0])
def test_identical_sweeps_pass_whatever_their_wall_clock_columns_say(
    two_copies, tmp_path, capsys, edit_summary, summary_value, factor
):
    """A resumed sweep on a busy CPU: every simulated number identical, the sub-second jobs'
    timings 10x slower (or faster). The gate reports the timings and passes."""
    base, head = two_copies
    for job in ("0", "1"):
        wall = {name: summary_value(base / job, name) for name in WALL_COLUMNS}
        assert 0 < wall["sim_wall_s"] < 1  # sub-second jobs, where noise is largest
        edit_summary(
            head / job,
            sim_wall_s=wall["sim_wall_s"] * factor,
            loop_wall_s=wall["loop_wall_s"] * factor,
            simulated_requests_per_wall_s=wall["simulated_requests_per_wall_s"] / factor,
        )
    capsys.readouterr()
    assert compare(base, head, out=tmp_path / "cmp") == 0
    frame = pd.read_parquet(tmp_path / "cmp" / "compare.parquet").set_index(["job", "metric"])
    for job in ("allocator=naive", "allocator=paged"):
        for name in WALL_COLUMNS:  # reported, with their change, not gated
            assert frame.loc[(job, name), "verdict"] == "ignored"
            assert frame.loc[(job, name), "change_rel"] != 0


def test_a_timing_gate_asked_for_catches_a_slowdown(two_copies, tmp_path, edit_summary, summary_value):
    base, head = two_copies
    wall_s = summary_value(base / "0", "loop_wall_s")
    edit_summary(head / "0", loop_wall_s=wall_s * 3)
    assert compare(base, head, "--tol", "loop_wall_s=ratio:2:lower", out=tmp_path / "c") == 1
    edit_summary(head / "0", loop_wall_s=wall_s / 10)
    assert compare(base, head, "--tol", "loop_wall_s=ratio:2:lower", out=tmp_path / "d") == 0


def test_jobs_match_by_config_not_by_number(two_copies, tmp_path, capsys, edit_summary):
    base, head = two_copies
    (head / "0").rename(head / "tmp")
    (head / "1").rename(head / "0")
    (head / "tmp").rename(head / "1")
    assert compare(base, head, out=tmp_path / "cmp") == 0
    capsys.readouterr()
    # and a change lands on the right job: head/0 now holds the paged run
    edit_summary(head / "0", peak_concurrency=1)
    assert compare(base, head, out=tmp_path / "cmp2") == 1
    frame = pd.read_parquet(tmp_path / "cmp2" / "compare.parquet")
    [failed] = frame[~frame["passed"]].to_dict("records")
    assert failed["job"] == "allocator=paged" and failed["head_job"].endswith("head/0")


def test_a_run_folder_compares_with_the_matching_job_of_a_sweep(two_copies, tmp_path, capsys):
    base, head = two_copies
    assert compare(base / "1", head / "1", out=tmp_path / "cmp") == 0
    # one run against a sweep of two: the other job has no partner
    assert compare(base / "1", head, out=tmp_path / "cmp2") == 2
    line = one_error_line(capsys)
    assert (
        "has no base job with its config" in line
        and "allocator=naive" in line
        and "allocator.name: paged -> naive" in line
    )


def test_an_incomplete_job_is_flagged_and_never_read(two_copies, tmp_path, capsys):
    base, head = two_copies
    (head / "1" / COMPLETE).unlink()
    assert compare(base, head, out=tmp_path / "cmp") == 2
    line = one_error_line(capsys)
    assert "head" in line and "incomplete" in line and "not compared" in line
    said = line.rsplit("/1 is ", 1)[1]  # (the test folder's own name holds the word too)
    assert said.count("incomplete") == 1 and "no COMPLETE marker" in said, line  # one cause, said once
    assert not (tmp_path / "cmp").exists()  # nothing written for unusable input


def test_a_failed_job_is_unusable(two_copies, tmp_path, capsys):
    base, head = two_copies
    write_failure(base / "0", "allocator=naive", "allocator.block_size_tokens=7 is invalid")
    assert compare(base, head, out=tmp_path / "cmp") == 2
    assert "is failed (allocator.block_size_tokens=7 is invalid)" in one_error_line(capsys)


@pytest.mark.parametrize("what", ["missing", "empty", "file"])
def test_a_folder_that_holds_no_result_is_unusable(two_copies, tmp_path, capsys, what):
    base, _ = two_copies
    head = tmp_path / "nothing"
    if what == "empty":
        head.mkdir()
    elif what == "file":
        head.write_text("x")
    assert compare(base, head, out=tmp_path / "cmp") == 2
    line = one_error_line(capsys)
    assert str(head) in line and (
        "does not exist" in line if what != "empty" else "not a kvbench result folder" in line
    )


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--tol", "ttft_*=rel:abc"], "'abc' is not a finite number"),
        (["--tol", "ttft_*=fuzzy:2"], "unknown kind 'fuzzy'"),
        (["--tol", "ttft_*"], "write --tol PATTERN=SPEC"),
        (["--tol", "sim_wall_s=ratio:0.5"], "'0.5' is not a finite number >= 1"),
        (["--tolerances", "nowhere.yaml"], "cannot be read"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(two_copies, tmp_path, capsys, args, fragment):
    base, head = two_copies
    assert compare(base, head, *args, out=tmp_path / "cmp") == 2
    assert fragment in one_error_line(capsys)


def test_the_comparison_is_never_written_into_a_compared_folder(two_copies, capsys):
    base, head = two_copies
    assert compare(base, head, out=head / "cmp") == 2
    assert "is inside HEAD" in one_error_line(capsys) and not (head / "cmp").exists()


def test_a_malformed_tolerance_file_is_one_line(two_copies, tmp_path, capsys):
    base, head = two_copies
    rules = tmp_path / "rules.yaml"
    for text, fragment in (
        ("tolerances: [exact]\n", "holds one mapping"),
        ("tolerances:\n  '*': rel: 0.1\n", "not valid YAML"),
        ("tolerances:\n  '*':\n    rel: 0.1\n", "not a spec string"),
    ):
        rules.write_text(text)
        assert compare(base, head, "--tolerances", rules, out=tmp_path / "cmp") == 2
        assert fragment in one_error_line(capsys)


def test_different_sweeps_match_nothing(two_copies, tmp_path, capsys):
    base, head = two_copies
    shutil.rmtree(head)
    proc = kvbench(
        "-m",
        "allocator=naive",
        "workload.num_requests=41",
        "wandb.mode=disabled",
        "progress=false",
        "output.steps=false",
        "output.figures=false",
        f"hydra.sweep.dir={head}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert compare(base, head, out=tmp_path / "cmp") == 2
    line = one_error_line(capsys)
    assert "no job matched" in line and "workload.num_requests: 40 -> 41" in line
    # the line names the key that kept the jobs apart, and the flag that would pair them anyway
    assert "the configs differ in workload.num_requests" in line
    assert line.endswith("or add --ignore-config workload.num_requests if that key cannot change a number")
    # a key declared irrelevant is left out of the matching
    assert compare(base / "0", head / "0", "--ignore-config", "workload", out=tmp_path / "cmp") == 1


def _files(folder) -> set:
    return {p.relative_to(folder) for p in folder.rglob("*")}


def test_the_kvbench_command_runs_compare_and_writes_nothing_by_default(two_copies, tmp_path, monkeypatch):
    base, head = two_copies
    before = _files(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    proc = kvbench("compare", str(base), str(head), "--all", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _files(tmp_path) == before  # printed and exited: no results/compare/<date>/<time> folder
    assert "peak concurrency (sequences)" in proc.stdout  # --all lists the metrics that are the same too
    assert "comparison:" not in proc.stdout
    assert max(len(line.rstrip()) for line in proc.stdout.splitlines()) <= 100


def test_a_failing_comparison_writes_nothing_either(two_copies, tmp_path, monkeypatch, capsys, edit_summary):
    base, head = two_copies
    edit_summary(head / "1", peak_concurrency=1)
    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path)
    assert compare(base, head) == 1
    assert _files(tmp_path) == before
    assert last_line(capsys).startswith("kvbench compare: FAIL")


def test_out_writes_the_three_files_and_marks_them_complete(two_copies, tmp_path, capsys):
    base, head = two_copies
    out = tmp_path / "new" / "cmp"  # created, parents included
    assert compare(base, head, out=out) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(["compare.parquet", "compare.csv", "compare.png", COMPLETE])
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"comparison: {out} (compare.parquet, compare.csv, compare.png)" in capsys.readouterr().out


def test_an_unwritable_out_folder_is_one_line_before_any_reading(two_copies, tmp_path, capsys):
    base, head = two_copies
    (tmp_path / "a_file").write_text("x")
    assert compare(base, head, out=tmp_path / "a_file" / "cmp") == 2
    assert "is a file, not a folder" in one_error_line(capsys)


@pytest.mark.parametrize("columns", [200, 100])
def test_the_table_is_laid_out_for_columns(
    two_copies, tmp_path, monkeypatch, capsys, edit_summary, summary_value, columns
):
    base, head = two_copies
    long_label = "allocator=paged " + " ".join(f"tag{i}=value{i}" for i in range(8))  # 119 characters
    utilization = summary_value(base / "1", "utilization_saturated")
    edit_summary(head / "1", peak_concurrency=1, utilization_saturated=utilization * 0.9)
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr("kvbench.compare.load._swept_label", lambda job_dir, keys: long_label)
    assert compare(base, head, "--all") == 1
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    table = lines[: lines.index(next(line for line in lines if line.startswith("kvbench compare: FAIL")))]
    assert max(map(len, table)) <= columns
    # short catalogue words, not keys; the job's label whole on one line where the width allows it
    assert any(line.strip().startswith("KV utilization when saturated") for line in table)
    assert (long_label in lines) == (columns == 200)
    # where it wraps, it wraps at spaces: never inside an override
    start = next(i for i, line in enumerate(lines) if line.startswith("allocator=paged"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("  "))
    assert " ".join(line.strip() for line in lines[start:end]) == long_label
    assert (end - start > 1) == (columns == 100)
