"""Calibration files: the simulator's decode efficiency is measured, interpolated, or 1.0 and says so."""

from __future__ import annotations

import json

import pytest

import kvbench.exec.calibration as calibration
from kvbench.exec.calibration import load_decode_efficiency


@pytest.fixture
def calibrated(tmp_path, monkeypatch):
    (tmp_path / "h100-sxm").mkdir()
    table = {"contiguous": 0.9, "8": 0.5, "32": 0.7, "128": 0.8}
    (tmp_path / "h100-sxm" / "triton.json").write_text(json.dumps({"efficiency": table}))
    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)
    calibration._read.cache_clear()
    yield
    calibration._read.cache_clear()


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
