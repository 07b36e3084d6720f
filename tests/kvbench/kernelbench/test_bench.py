"""The kernel benchmark without a GPU: its refusal, its dry run end to end, and its calibration maths."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from hang import HANG_S

from kvbench.kernelbench.report import COLUMNS, efficiency_table, write_calibrations


def bench(tmp_path, *overrides: str, interpret: bool = False) -> subprocess.CompletedProcess:
    """``kvbench bench-kernels`` as a user runs it (Triton's interpreter must be chosen at startup)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "kvbench.commands.bench_kernels", f"hydra.run.dir={tmp_path / 'run'}", *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: the CPU refusal is unreachable")
def test_without_a_gpu_it_refuses_in_one_line(tmp_path):
    result = bench(tmp_path)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors == [errors[-1]] and "needs a CUDA GPU" in errors[-1] and "dry_run=true" in errors[-1], result.stderr
    assert not (tmp_path / "run").exists(), "refused before Hydra makes a run folder"
    # a typo is said first: it is the first thing to fix, GPU or not
    typo = bench(tmp_path, "block_size=[8]")
    assert typo.returncode == 2 and "block_size=[8] is not a config key" in typo.stderr, typo.stderr
    assert not (tmp_path / "run").exists()


def test_dry_run_writes_csv_plots_and_calibrations(tmp_path):
    result = bench(tmp_path, "dry_run=true", "hardware=h100-sxm", interpret=True)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    df = pd.read_csv(run / "results.csv")
    assert list(df.columns) == COLUMNS
    by_kernel = df.groupby("kernel")["status"].agg(lambda s: sorted(set(x.split(":")[0] for x in s)))
    assert by_kernel["triton"] == ["ok"] and by_kernel["torch"] == ["ok"] and by_kernel["sdpa"] == ["ok"]
    # FlashInfer has no CPU backend: recorded as skipped with the reason, never silently passed
    skipped = df[df["kernel"] == "flashinfer"]["status"]
    assert skipped.str.contains("skipped: kernel=flashinfer needs an NVIDIA GPU").all()
    ok = df[df["status"] == "ok"]
    assert (ok["time_median_s"] > 0).all() and (ok["bytes_read"] > 0).all()
    assert ok[ok["kernel"] != "sdpa"]["output_ok"].astype(bool).all()
    assert set(df["layout"]) == {"paged", "contiguous"} and set(df["block_size_tokens"]) >= {8, 16}
    assert (run / "bandwidth_triton.png").stat().st_size > 0 and (run / "bandwidth_torch.png").is_file()
    calibration = json.loads((run / "calibrations" / "h100-sxm" / "triton.json").read_text())
    assert set(calibration["efficiency"]) == {"8", "16", "contiguous"}
    assert calibration["hardware"] == "h100-sxm" and calibration["dry_run"] is True
    assert not (run / "calibrations" / "h100-sxm" / "flashinfer.json").exists()


def rows(kernel, layout, block_size, batch, context, bytes_read, time_s, status="ok", output_ok=True):
    return dict(
        kernel=kernel,
        layout=layout,
        block_size_tokens=block_size,
        batch=batch,
        context_tokens=context,
        bytes_read=bytes_read,
        time_median_s=time_s,
        status=status,
        output_ok=output_ok,
    )


def test_efficiency_is_total_bytes_over_total_time_on_points_common_to_all_block_sizes():
    df = pd.DataFrame(
        [
            rows("triton", "paged", 8, 1, 512, 100, 1.0),
            rows("triton", "paged", 8, 16, 512, 300, 1.0),
            rows("triton", "paged", 16, 1, 512, 200, 1.0),
            rows("triton", "paged", 16, 16, 512, 600, 1.0),
            rows("triton", "paged", 16, 64, 512, 9999, 1.0),  # measured at 16 only: left out
            rows("triton", "paged", 8, 64, 512, 1, 1.0, status="skipped: time budget"),
            rows("triton", "contiguous", 512, 1, 512, 500, 2.0),
            rows("triton", "contiguous", 512, 16, 512, 500, 1.0, output_ok=False),  # wrong output: left out
            rows("sdpa", "contiguous", 512, 1, 512, 90, 1.0),
        ]
    )
    table = efficiency_table(df, "triton", spec_bytes_per_s=100.0)
    assert table == {"8": 2.0, "16": 4.0, "contiguous": 2.5}


def test_calibration_file_is_what_the_simulator_reads(tmp_path, monkeypatch):
    import kvbench.specs.calibration as calibration

    df = pd.DataFrame([rows("triton", "paged", 8, 1, 512, 50, 1.0), rows("triton", "paged", 32, 1, 512, 80, 1.0)])
    (path,) = write_calibrations(df, tmp_path, "h200", 100.0, meta={"measured_on": "test"})
    assert path == tmp_path / "h200" / "triton.json"
    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)
    assert calibration.load_decode_efficiency("h200", "triton", 8).efficiency == 0.5
    # 16 lies halfway between 8 and 32 in log2: linear interpolation there
    assert calibration.load_decode_efficiency("h200", "triton", 16).efficiency == pytest.approx(0.65)


def test_an_efficiency_above_the_spec_bandwidth_writes_no_calibration(tmp_path, capsys):
    # 120 bytes per second against a spec of 100: the hardware config is not this GPU's
    df = pd.DataFrame([rows("triton", "paged", 8, 1, 512, 120, 1.0), rows("torch", "paged", 8, 1, 512, 50, 1.0)])
    written = write_calibrations(df, tmp_path, "h100-sxm", 100.0, meta={"measured_on": "test"})
    assert written == [tmp_path / "h100-sxm" / "torch.json"]
    assert "triton read faster than hardware=h100-sxm's spec bandwidth" in capsys.readouterr().err
