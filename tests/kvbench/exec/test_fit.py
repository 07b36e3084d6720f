"""kvbench calibrate: the least-squares fit recovers the efficiencies a synthetic real run was made with."""

from __future__ import annotations

import json

import pytest

from kvbench.errors import ConfigError
from kvbench.exec import fit as fitmod
from kvbench.output.results import write_run

ARGS = ["wandb.mode=disabled", "progress=false", "workload.num_requests=40", "output.steps=true", "kernel=triton"]


def synthetic_real_run(tmp_path, name, block_size_tokens, decode_eff, prefill_eff, overhead_s):
    """A sim run's folder whose steps table gains the measured times a GPU with these efficiencies
    would give: weights at full bandwidth, KV at decode_eff, prefill at prefill_eff, overhead per step."""
    from kvbench.api import run

    result = run([*ARGS, f"allocator.block_size_tokens={block_size_tokens}"])
    steps, hw = result.steps.copy(), result.config["hardware"]
    bw = hw["hbm_bandwidth_bytes_per_s"]
    n = steps["num_steps"].astype(float)
    decoding = (steps["num_decode_seqs"] > 0).astype(float)
    steps["measured_s"] = (
        decoding * n * result.summary["weight_bytes"] / bw
        + steps["kv_read_bytes"] / (bw * decode_eff)
        + steps["prefill_s"] * hw["prefill_flops_efficiency"] / prefill_eff
        + steps["swap_s"] + steps["copy_s"] + n * overhead_s
    )
    result.steps = steps
    folder = tmp_path / name
    write_run(result, folder, figures=False)
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return [synthetic_real_run(tmp, "b16", 16, 0.62, 0.41, 35e-6), synthetic_real_run(tmp, "b32", 32, 0.77, 0.41, 35e-6)]


def test_the_fit_recovers_known_efficiencies_and_overhead(runs):
    result = fitmod.fit([fitmod.load_run(f) for f in runs])
    assert result.hardware == "h100-sxm"
    assert result.decode_efficiency[("triton", "16")] == pytest.approx(0.62, abs=1e-6)
    assert result.decode_efficiency[("triton", "32")] == pytest.approx(0.77, abs=1e-6)
    assert result.prefill_flops_efficiency == pytest.approx(0.41, abs=1e-6)
    assert result.step_overhead_s == pytest.approx(35e-6, abs=1e-9)
    assert result.relative_error_p90 < 1e-9


def test_calibrate_writes_files_the_simulator_reads(runs, tmp_path, capsys):
    from kvbench.exec.calibration import load_calibration

    out = tmp_path / "cal" / "h100-sxm"
    fitmod.main([str(runs[0]), str(runs[1]), "--out", str(out)])
    assert "decode efficiency 0.6200" in capsys.readouterr().out
    doc = json.loads((out / "triton.json").read_text())
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
        fitmod.main([str(folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "no measured step times" in err
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_steps_table_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fitmod.main([str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no steps table" in err and "output.steps=true" in err


def test_an_efficiency_above_one_is_refused_before_writing(runs, tmp_path):
    fast = fitmod.fit([fitmod.load_run(runs[0])])
    fast = fitmod.Fit(fast.hardware, {("triton", "16"): 1.3}, 0.4, 0.0, 1, 0.0, 0.0)
    with pytest.raises(ConfigError, match=r"efficiency\['16'\]=1.3 is invalid"):
        fitmod.write_fit(fast, tmp_path / "h100-sxm", "kvbench calibrate x")
    assert not (tmp_path / "h100-sxm" / "triton.json").exists()
