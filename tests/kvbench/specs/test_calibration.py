"""Calibration files: the simulator's decode efficiency is measured, interpolated, or 1.0 and says so."""

from __future__ import annotations

import json
import os

import pytest

import kvbench.specs.calibration as calibration
from kvbench.errors import ConfigError
from kvbench.specs.calibration import load_decode_efficiency


@pytest.fixture
def calibrated(tmp_path, monkeypatch):
    (tmp_path / "h100-sxm").mkdir()
    table = {"contiguous": 0.9, "8": 0.5, "32": 0.7, "128": 0.8}
    (tmp_path / "h100-sxm" / "triton.json").write_text(json.dumps({"efficiency": table}))
    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)


def test_no_file_means_uncalibrated_full_bandwidth(tmp_path, monkeypatch):
    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)
    eff = load_decode_efficiency("h100-sxm", "triton", 16)
    assert (eff.efficiency, eff.source, eff.calibrated) == (1.0, "uncalibrated", False)


def test_measured_block_size_is_read_exactly(calibrated):
    eff = load_decode_efficiency("h100-sxm", "triton", 32)
    assert eff.efficiency == 0.7 and eff.source == "h100-sxm/triton.json[32]"


def test_between_two_measurements_interpolates_in_log2_block_size(calibrated):
    eff = load_decode_efficiency("h100-sxm", "triton", 16)  # halfway between 8 and 32 in log2
    assert eff.efficiency == pytest.approx(0.6) and "interpolated 8..32" in eff.source


def test_outside_the_measured_range_uses_the_nearest_and_says_so(calibrated):
    assert load_decode_efficiency("h100-sxm", "triton", 256).efficiency == 0.8
    assert "nearest 128" in load_decode_efficiency("h100-sxm", "triton", 256).source


def test_contiguous_allocators_use_the_contiguous_measurement(calibrated):
    assert load_decode_efficiency("h100-sxm", "triton", 4096, contiguous=True).efficiency == 0.9


def test_a_calibrated_kernel_slows_the_simulated_decode(calibrated):
    from kvbench.api import run

    args = ["wandb.mode=disabled", "progress=false", "workload.num_requests=50", "allocator.block_size_tokens=32"]
    fast, slow = run([*args, "kernel=torch"]).summary, run([*args, "kernel=triton"]).summary
    assert fast["calibration"] == "uncalibrated" and slow["calibration"] == "h100-sxm/triton.json[32]"
    assert slow["decode_efficiency"] == 0.7
    assert slow["tpot_p50_s"] > fast["tpot_p50_s"]


def write(tmp_path, doc) -> None:
    (tmp_path / "h100-sxm").mkdir(exist_ok=True)
    text = doc if isinstance(doc, str) else json.dumps(doc)
    (tmp_path / "h100-sxm" / "triton.json").write_text(text)


@pytest.mark.parametrize(
    "doc, match",
    [
        ("{not json", r"triton.json: not valid JSON \(line 1, column 2"),
        ("[" * 100_000 + "]" * 100_000, r"triton.json: JSON nested too deeply"),
        ('\ufeff{"efficiency": {"16": 2}}', r"efficiency\['16'\]=2 is invalid"),  # a BOM is read past
        ("[0.5]", r"triton.json holds a JSON list, not an object"),
        ({"efficiency": [0.5]}, r"triton.json: efficiency=\[0.5\] is invalid"),
        ({"efficiency": {"16": 0}}, r"efficiency\['16'\]=0 is invalid: use a fraction in \[0.001, 1\]"),
        ({"efficiency": {"16": 1e-300}}, r"efficiency\['16'\]=1e-300 is invalid: .*below 0.001: a failed measurement"),
        (
            {"efficiency": {"16": 0.5}, "prefill_flops_efficiency": 1e-300},
            r"prefill_flops_efficiency=1e-300 is invalid",
        ),
        ({"efficiency": {"16": -0.5}}, r"efficiency\['16'\]=-0.5 is invalid"),
        ({"efficiency": {"16": "fast"}}, r"efficiency\['16'\]='fast' is invalid"),
        ({"efficiency": {"16": True}}, r"efficiency\['16'\]=True is invalid"),
        ('{"efficiency": {"16": NaN}}', r"efficiency\['16'\]=nan is invalid"),
        ('{"efficiency": {"16": Infinity}}', r"efficiency\['16'\]=inf is invalid"),
        ({"efficiency": {"16": 1.2}}, r"efficiency\['16'\]=1.2 is invalid: .*above 1: that bandwidth is too low"),
        ({"efficiency": {"contiguous": 0.9, "0": 0.5}}, r"efficiency entry '0' is invalid"),
        ({"efficiency": {"16.5": 0.5}}, r"efficiency entry '16.5' is invalid"),
    ],
)
def test_a_bad_calibration_file_is_one_line_naming_file_and_entry(tmp_path, monkeypatch, doc, match):
    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)
    write(tmp_path, doc)
    with pytest.raises(ConfigError, match=rf"calibration file .*h100-sxm.*{match}"):
        load_decode_efficiency("h100-sxm", "triton", 16)


def test_a_calibration_path_that_is_a_folder_is_one_line_not_uncalibrated(tmp_path, monkeypatch):
    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)
    (tmp_path / "h100-sxm" / "triton.json").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"calibration file .*triton.json is not a file \(a folder"):
        load_decode_efficiency("h100-sxm", "triton", 16)


def test_a_file_rewritten_on_disk_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)
    write(tmp_path, {"efficiency": {"16": 0.5}})
    assert load_decode_efficiency("h100-sxm", "triton", 16).efficiency == 0.5
    path = tmp_path / "h100-sxm" / "triton.json"
    mtime_ns = path.stat().st_mtime_ns
    write(tmp_path, {"efficiency": {"16": 0.25}})
    os.utime(path, ns=(mtime_ns + 10**9, mtime_ns + 10**9))  # a coarse clock must not hide the change
    assert load_decode_efficiency("h100-sxm", "triton", 16).efficiency == 0.25


def test_calibration_dir_points_kvbench_at_the_users_files(tmp_path):
    from kvbench.api import run

    write(tmp_path, {"efficiency": {"16": 0.5}})
    args = ["wandb.mode=disabled", "progress=false", "workload.num_requests=20", "kernel=triton"]
    summary = run([*args, f"calibration_dir={tmp_path}"]).summary
    assert summary["decode_efficiency"] == 0.5
    assert summary["calibration"] == f"{tmp_path / 'h100-sxm' / 'triton.json'}[16]"
    assert run([*args, f"calibration_dir={tmp_path}", "kernel=torch"]).summary["calibration"] == "uncalibrated"


def test_kernel_decode_efficiency_keeps_its_positional_signature(tmp_path, monkeypatch):
    from kvbench_plugins.kernels.triton_paged import TritonKernel

    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path / "kvbench-own")
    write(tmp_path, {"efficiency": {"16": 0.5}})
    kernel = TritonKernel()
    assert kernel.decode_efficiency("h100-sxm", 16, False) == calibration.UNCALIBRATED
    assert kernel.decode_efficiency("h100-sxm", 16, False, calibration_dir=tmp_path).efficiency == 0.5
