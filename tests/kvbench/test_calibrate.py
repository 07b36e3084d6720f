"""kvbench calibrate: the least-squares fit recovers the efficiencies a synthetic real run was made with."""

from __future__ import annotations

import json

import pytest
from real_runs import ARGS, synthetic_real_run
from special_files import BASIC, assert_unchanged, make, words

from kvbench import calibrate as fitmod
from kvbench.commands import calibrate as command
from kvbench.errors import ConfigError
from kvbench.output.results import write_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return [
        synthetic_real_run(tmp, "b16", 16, 0.62, 0.41, 35e-6),
        synthetic_real_run(tmp, "b32", 32, 0.77, 0.41, 35e-6),
    ]


def test_the_fit_recovers_known_efficiencies_and_overhead(runs):
    result = fitmod.fit([fitmod.load_run(f) for f in runs])
    assert result.hardware == "h100-sxm"
    assert result.decode_efficiency[("triton", "16")] == pytest.approx(0.62, abs=1e-6)
    assert result.decode_efficiency[("triton", "32")] == pytest.approx(0.77, abs=1e-6)
    assert result.prefill_flops_efficiency == pytest.approx(0.41, abs=1e-6)
    assert result.step_overhead_s == pytest.approx(35e-6, abs=1e-9)
    assert result.relative_error_p90 < 1e-9


def test_calibrate_writes_files_the_simulator_reads(runs, tmp_path, capsys):
    from kvbench.specs.calibration import load_calibration

    command.main([str(runs[0]), str(runs[1]), "--out", str(tmp_path / "cal")])
    printed = capsys.readouterr().out
    assert "decode efficiency 0.6200" in printed and f"calibration_dir={tmp_path / 'cal'}" in printed
    doc = json.loads((tmp_path / "cal" / "h100-sxm" / "triton.json").read_text())
    assert set(doc["provenance"]) >= {"command", "commit", "date"}
    assert doc["provenance"]["command"].startswith("kvbench calibrate ")
    cal = load_calibration("h100-sxm", "triton", 32, calibration_dir=tmp_path / "cal")
    assert cal.decode.efficiency == pytest.approx(0.77, abs=1e-6)
    assert cal.prefill_flops_efficiency == pytest.approx(0.41, abs=1e-6)
    assert cal.step_overhead_s == pytest.approx(35e-6, abs=1e-9)


def test_a_folder_without_measured_times_is_one_line(tmp_path, capsys):
    from kvbench.api import run

    folder = tmp_path / "sim"
    write_run(run(ARGS), folder, figures=False)
    with pytest.raises(ConfigError, match=r"has no measured step times .*calibrate from a mode=real run"):
        fitmod.load_run(folder)
    with pytest.raises(SystemExit) as exit_info:
        command.main([str(folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "no measured step times" in err
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_steps_table_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        command.main([str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no steps table" in err and "output.steps=true" in err


def test_an_efficiency_above_one_is_refused_before_writing(runs, tmp_path):
    fast = fitmod.fit([fitmod.load_run(runs[0])])
    fast = fitmod.Fit(fast.hardware, {("triton", "16"): 1.3}, 0.4, 0.0, 1, 0.0, 0.0)
    with pytest.raises(ConfigError, match=r"efficiency\['16'\]=1.3 is invalid"):
        fitmod.write_fit(fast, tmp_path, "kvbench calibrate x")
    assert not (tmp_path / "h100-sxm" / "triton.json").exists()


# --- a results folder read back is untrusted input ---------------------------------------------


def revouch(folder) -> None:
    from kvbench.io.atomic import COMPLETE, mark_complete

    mark_complete(folder, list(json.loads((folder / COMPLETE).read_text())["files"]))


def test_an_incomplete_or_altered_run_is_not_calibrated_from(runs, tmp_path, capsys):
    import shutil

    folder = shutil.copytree(runs[0], tmp_path / "cut")
    (folder / "steps.parquet").write_bytes((folder / "steps.parquet").read_bytes()[:-10])
    with pytest.raises(SystemExit):
        command.main([str(folder), "--out", str(tmp_path / "out")])
    assert "is not a complete run: steps.parquet is" in capsys.readouterr().err
    (folder / "COMPLETE").unlink()
    with pytest.raises(SystemExit):
        command.main([str(folder), "--out", str(tmp_path / "out")])
    assert "is not a complete run: no COMPLETE marker" in capsys.readouterr().err


def _files_under(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


@pytest.mark.parametrize(
    "field, value",
    [
        ("kernel", "../../../victim"),
        ("kernel", "/tmp/victim"),
        ("hardware", "../../elsewhere"),
        ("hardware", "a/b"),
        ("kernel", ""),
        ("kernel", 7),
    ],
)
def test_a_crafted_summary_cannot_make_calibrate_write_outside_out(runs, tmp_path, capsys, field, value):
    import shutil

    folder = shutil.copytree(runs[0], tmp_path / "crafted")
    summary = json.loads((folder / "summary.json").read_text())
    summary[field] = value
    (folder / "summary.json").write_text(json.dumps(summary))
    revouch(folder)  # a crafted folder can carry a marker that matches it
    before = _files_under(tmp_path)
    with pytest.raises(SystemExit) as stop:
        command.main([str(folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert f"summary.json: {field}={value!r} is invalid" in err
    assert _files_under(tmp_path) == before  # nothing created, replaced or merged into, anywhere


def test_a_link_inside_out_that_leads_out_is_refused(runs, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "h100-sxm").symlink_to(outside)
    with pytest.raises(SystemExit):
        command.main([str(runs[0]), "--out", str(tmp_path / "out")])
    assert "resolves outside --out" in capsys.readouterr().err
    assert not list(outside.iterdir())


def test_calibrate_writes_into_the_results_area_by_default_never_into_the_package(runs, tmp_path, monkeypatch, capsys):
    from kvbench.specs.calibration import CALIBRATION_DIR

    package_before = _files_under(CALIBRATION_DIR) if CALIBRATION_DIR.is_dir() else set()
    monkeypatch.chdir(tmp_path)
    command.main([str(runs[0])])
    assert (tmp_path / "results" / "calibrations" / "h100-sxm" / "triton.json").is_file()
    assert "calibration_dir=results/calibrations" in capsys.readouterr().out
    assert (_files_under(CALIBRATION_DIR) if CALIBRATION_DIR.is_dir() else set()) == package_before


@pytest.mark.parametrize(
    "damage", ["truncated steps", "empty steps", "inf in steps", "summary not json", "deep config"]
)
def test_a_damaged_run_folder_is_one_line(runs, tmp_path, capsys, damage):
    import shutil

    import pandas as pd

    folder = shutil.copytree(runs[0], tmp_path / "damaged")
    steps = folder / "steps.parquet"
    if damage == "truncated steps":
        steps.write_bytes(steps.read_bytes()[:100])
    elif damage == "empty steps":
        steps.write_bytes(b"")
    elif damage == "inf in steps":
        frame = pd.read_parquet(steps)
        frame.loc[frame.index[0], "kv_read_bytes"] = float("inf")
        frame.to_parquet(steps)
    elif damage == "summary not json":
        (folder / "summary.json").write_bytes(b"\xff\xfe{")
    else:
        (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    revouch(folder)  # damaged, yet vouched for: each reader must still say so in one line
    with pytest.raises(SystemExit) as stop:
        command.main([str(folder), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert stop.value.code == 2 and captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, fragment",
    [([], "the following arguments are required: runs"), (["x", "--bogus"], "unrecognized arguments: --bogus")],
)
def test_calibrate_usage_errors_are_one_line(capsys, args, fragment):
    with pytest.raises(SystemExit) as stop:
        command.main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and fragment in err and "usage:" not in err


def test_sigterm_during_calibrate_is_one_line_and_143(runs, tmp_path, monkeypatch, capsys):
    import os
    import signal

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(command, "fit", killed)
    with pytest.raises(SystemExit) as stop:
        command.main([str(runs[0]), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert (
        stop.value.code == 143 and err.startswith("kvbench calibrate: interrupted by SIGTERM") and err.count("\n") == 1
    )
    assert not (tmp_path / "out").exists()


# --- only a GPU's timings calibrate the simulator of that GPU ----------------------------------


def _resummarized(folder, tmp_path, name, **changes):
    """A copy of a run folder whose summary.json has ``changes`` (None: the key removed), vouched for."""
    import shutil

    copy = shutil.copytree(folder, tmp_path / name)
    summary = json.loads((copy / "summary.json").read_text())
    for key, value in changes.items():
        if value is None:
            summary.pop(key, None)
        else:
            summary[key] = value
    (copy / "summary.json").write_text(json.dumps(summary))
    revouch(copy)
    return copy


def _refused(capsys, tmp_path, *folders) -> str:
    """Run ``kvbench calibrate`` on ``folders``; check exit 2, one line, and no --out folder; the line."""
    with pytest.raises(SystemExit) as stop:
        command.main([*map(str, folders), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert stop.value.code == 2 and captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    assert captured.out == "" and not (tmp_path / "out").exists()
    return captured.err


def test_a_run_measured_on_a_cpu_is_refused_in_words(runs, tmp_path, capsys):
    cpu = _resummarized(runs[0], tmp_path, "cpu", measured_on="cpu: AMD EPYC 7763 64-Core Processor")
    err = _refused(capsys, tmp_path, cpu, runs[1])
    assert f"{cpu} was measured on a CPU (AMD EPYC 7763 64-Core Processor)" in err
    assert "while its config prices hardware=h100-sxm" in err and "price every simulated step" in err
    assert "calibrate from mode=real runs on the GPU hardware=h100-sxm describes" in err
    assert "sim runs need no calibration" in err


def test_a_run_that_does_not_say_where_it_was_measured_is_refused(runs, tmp_path, capsys):
    old = _resummarized(runs[0], tmp_path, "old", measured_on=None)
    err = _refused(capsys, tmp_path, old)
    assert f"{old} does not record where its steps were measured" in err and "re-run it with this kvbench" in err
    crafted = _resummarized(runs[0], tmp_path, "crafted", measured_on=["cuda"])
    assert "measured_on=['cuda'] is invalid" in _refused(capsys, tmp_path, crafted)


def test_the_file_says_which_gpu_measured_it(runs, tmp_path, capsys):
    from real_runs import MEASURED_ON

    command.main([str(runs[0]), "--out", str(tmp_path / "cal")])
    assert f"measured on {MEASURED_ON}" in capsys.readouterr().out
    doc = json.loads((tmp_path / "cal" / "h100-sxm" / "triton.json").read_text())
    assert doc["provenance"]["measured_on"] == MEASURED_ON


def test_times_that_do_not_grow_with_kv_reads_are_refused_in_words(tmp_path, capsys):
    # reading more KV makes a step faster: no efficiency explains that
    backwards = synthetic_real_run(tmp_path, "backwards", 16, -5.0, 0.41, 1e-3)
    err = _refused(capsys, tmp_path, backwards)
    assert "the measured step times do not grow with the KV bytes the steps read" in err
    assert "no decode efficiency to fit" in err and "1/efficiency=-" in err


@pytest.mark.parametrize(
    "decode_eff, prefill_eff, overhead_s, fragment",
    [
        (1e-5, 0.41, 35e-6, "read KV at under 0.1% of h100-sxm's HBM bandwidth"),
        (3.0, 0.41, 35e-6, "read KV faster than hardware=h100-sxm's hbm_bandwidth_bytes_per_s allows"),
        (0.62, 1e-5, 35e-6, "prefill_flops_efficiency=1e-05 is invalid"),
        (0.62, 0.41, -1e-6, "step_overhead_s=-1e-06 is invalid: the fit gives each step a fixed cost of less than"),
    ],
)
def test_a_fit_no_calibration_file_may_hold_is_refused_before_any_folder(
    tmp_path, capsys, decode_eff, prefill_eff, overhead_s, fragment
):
    folder = synthetic_real_run(tmp_path, "odd", 16, decode_eff, prefill_eff, overhead_s)
    assert fragment in _refused(capsys, tmp_path, folder)


def test_out_inside_the_installed_package_is_refused(runs, tmp_path, capsys):
    from kvbench.specs.calibration import CALIBRATION_DIR

    def files():
        return _files_under(CALIBRATION_DIR) if CALIBRATION_DIR.is_dir() else set()

    before = files()
    for out in (CALIBRATION_DIR, CALIBRATION_DIR.parent / "elsewhere"):
        with pytest.raises(SystemExit) as stop:
            command.main([str(runs[0]), "--out", str(out)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and "is inside the installed kvbench package" in err
    assert files() == before and not (CALIBRATION_DIR.parent / "elsewhere").exists()


@pytest.mark.parametrize("kind", BASIC)
def test_a_calibration_file_that_is_not_a_regular_file_is_never_replaced(runs, tmp_path, capsys, kind):
    target = tmp_path / "cal" / "h100-sxm" / "triton.json"
    before = make(target, kind)
    with pytest.raises(SystemExit) as stopped:
        command.main([str(runs[0]), "--out", str(tmp_path / "cal")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words(kind) in err, err
    assert_unchanged(target, before)


def test_an_out_that_is_a_fifo_is_refused(runs, tmp_path, capsys):
    before = make(tmp_path / "cal", "FIFO")
    with pytest.raises(SystemExit):
        command.main([str(runs[0]), "--out", str(tmp_path / "cal")])
    assert "is a FIFO, not a folder" in capsys.readouterr().err
    assert_unchanged(tmp_path / "cal", before)
