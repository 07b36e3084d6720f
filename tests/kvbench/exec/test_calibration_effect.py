"""A calibration moves the simulated decode by exactly the measured factor, on the KV bytes only,
and makes the kernel axis of a sweep change the numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hang import HANG_S

from kvbench.exec.costmodel import CostModel
from kvbench.specs.calibration import load_calibration, load_decode_efficiency
from kvbench.specs.hardware import HardwareSpec
from kvbench.specs.model import ModelSpec

LLAMA2_7B = ModelSpec(
    "llama2-7b", num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128, dtype_bytes=2, num_params=6_738_415_616
)
H100 = HardwareSpec(kv_budget_bytes=62.5e9)


def write(folder, kernel, table, **extra):
    (folder / "h100-sxm").mkdir(parents=True, exist_ok=True)
    doc = {"efficiency": table, "provenance": {"command": "test", "commit": None, "date": "2025-01-01"}, **extra}
    (folder / "h100-sxm" / f"{kernel}.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("efficiency", [0.5, 0.73, 1.0])
def test_decode_time_is_weights_at_full_bandwidth_plus_kv_at_the_measured_fraction(efficiency):
    plain, calibrated = CostModel(LLAMA2_7B, H100), CostModel(LLAMA2_7B, H100, efficiency)
    bw, kv_tokens = 3.35e12, 64 * 4096
    kv_bytes = kv_tokens * LLAMA2_7B.kv_bytes_per_token
    assert calibrated.decode_time_s(kv_tokens) == pytest.approx(
        LLAMA2_7B.weight_bytes / bw + kv_bytes / (bw * efficiency), rel=1e-15
    )
    # against the uncalibrated model's own numbers: the KV part alone grows by 1/efficiency
    kv_part_s = plain.decode_time_s(kv_tokens) - plain.decode_time_s(0)
    assert calibrated.decode_time_s(kv_tokens) - calibrated.decode_time_s(0) == pytest.approx(
        kv_part_s / efficiency, rel=1e-12
    )
    assert calibrated.decode_time_s(0) == plain.decode_time_s(0) == calibrated.weights_time_s
    assert calibrated.decode_kv_time_s(kv_bytes) == pytest.approx(kv_part_s / efficiency, rel=1e-12)


def test_fitted_prefill_efficiency_and_overhead_are_carried_by_the_cost_model(tmp_path):
    write(tmp_path, "triton", {"16": 0.6}, prefill_flops_efficiency=0.25, step_overhead_s=5e-5)
    cal = load_calibration("h100-sxm", "triton", 16, calibration_dir=tmp_path)
    cost = CostModel(LLAMA2_7B, H100, cal.decode.efficiency, cal.prefill_flops_efficiency, cal.step_overhead_s)
    assert cost.prefill_time_s(512) == pytest.approx(2 * CostModel(LLAMA2_7B, H100).prefill_time_s(512), rel=1e-12)
    assert cost.step_overhead_total_s(3) == pytest.approx(1.5e-4)
    assert load_calibration("h100-sxm", "torch", 16, calibration_dir=tmp_path).step_overhead_s == 0.0


def test_a_run_steps_table_moves_by_exactly_the_measured_factor(tmp_path):
    """Decode-dominated run (short prompts, long outputs): every step's decode time in the calibrated
    run equals weights + (uncalibrated decode - weights) / efficiency, step by step."""
    from kvbench.api import run

    write(tmp_path, "triton", {"16": 0.6})
    args = [
        "wandb.mode=disabled",
        "progress=false",
        "workload.num_requests=16",
        "output.steps=true",
        f"calibration_dir={tmp_path}",
    ]
    plain, calibrated = run([*args, "kernel=torch"]), run([*args, "kernel=triton"])
    assert calibrated.summary["decode_efficiency"] == 0.6 and plain.summary["calibration"] == "uncalibrated"
    p, c = plain.steps, calibrated.steps
    if len(p) != len(c) or not (p["kv_read_bytes"].to_numpy() == c["kv_read_bytes"].to_numpy()).all():
        pytest.skip("the workload's arrivals made the two schedules differ")  # not expected for this workload
    weights_s = p["num_steps"] * plain.summary["weight_bytes"] / 3.35e12 * (p["num_decode_seqs"] > 0)
    expected = weights_s + (p["decode_s"] - weights_s) / 0.6
    assert c["decode_s"].to_numpy() == pytest.approx(expected.to_numpy(), rel=1e-9)
    assert (c["prefill_s"].to_numpy() == p["prefill_s"].to_numpy()).all()
    kv_part = (p["decode_s"] - weights_s).sum()
    assert c["duration_s"].sum() - p["duration_s"].sum() == pytest.approx(kv_part * (1 / 0.6 - 1), rel=1e-9)


def test_a_kernel_sweep_with_calibrations_gives_different_rows_and_no_warning(tmp_path):
    write(tmp_path, "triton", {"16": 0.55, "contiguous": 0.9})
    write(tmp_path, "flashinfer", {"16": 0.8, "contiguous": 0.92})
    assert load_decode_efficiency("h100-sxm", "flashinfer", 16, calibration_dir=tmp_path).efficiency == 0.8
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-c",
        "import sys; from kvbench.commands.main import main; sys.argv[0] = 'kvbench'; main()",
        "-m",
        "kernel=triton,flashinfer",
        f"calibration_dir={tmp_path}",
        "workload.num_requests=30",
        "wandb.mode=disabled",
        "progress=false",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "same simulated speed" not in done.stdout + done.stderr
    rows = {}
    for summary in sweep.glob("*/summary.json"):
        doc = json.loads(summary.read_text())
        rows[doc["kernel"]] = doc
    assert set(rows) == {"triton", "flashinfer"}
    assert rows["triton"]["decode_efficiency"] == 0.55 and rows["flashinfer"]["decode_efficiency"] == 0.8
    assert rows["triton"]["tpot_p50_s"] > rows["flashinfer"]["tpot_p50_s"]


def test_without_calibration_the_same_sweep_warns(tmp_path):
    import pandas as pd

    from kvbench.output.report import no_effect_warnings

    rows = pd.DataFrame(
        {"kernel": ["triton", "flashinfer"], "hardware": ["h100-sxm"] * 2, "calibration": ["uncalibrated"] * 2}
    )
    assert any("same simulated speed" in w for w in no_effect_warnings(rows))
