"""A simulated run dressed as a real one: its steps table gains the times a GPU with known
efficiencies would have measured, so that ``kvbench calibrate`` has a known answer to find."""

from __future__ import annotations

from kvbench.output.results import write_run

#: where the synthetic run says it was measured: the GPU its hardware config describes
MEASURED_ON = "cuda: NVIDIA H100 80GB HBM3"
ARGS = ["wandb.mode=disabled", "progress=false", "workload.num_requests=40", "output.steps=true", "kernel=triton"]


def synthetic_real_run(tmp_path, name, block_size_tokens, decode_eff, prefill_eff, overhead_s):
    """A sim run's folder whose steps table gains the measured times a GPU with these efficiencies
    would give: weights at full bandwidth, KV at decode_eff, prefill at prefill_eff, overhead per step."""
    import json

    from kvbench.api import run

    # the roofline at full bandwidth, as an uncalibrated triton ran before the transfer priced it on
    # H100 (kvbench.exec.transfer): a calibration file of efficiency 1 wins over the transfer
    roofline = tmp_path / "roofline_calibration"
    (roofline / "h100-sxm").mkdir(parents=True, exist_ok=True)
    (roofline / "h100-sxm" / "triton.json").write_text(json.dumps({"efficiency": {str(block_size_tokens): 1.0}}))
    result = run([*ARGS, f"allocator.block_size_tokens={block_size_tokens}", f"calibration_dir={roofline}"])
    steps, hw = result.steps.copy(), result.config["hardware"]
    bw = hw["hbm_bandwidth_bytes_per_s"]
    n = steps["num_steps"].astype(float)
    decoding = (steps["num_decode_seqs"] > 0).astype(float)
    steps["measured_s"] = (
        decoding * n * result.summary["weight_bytes"] / bw
        + steps["kv_read_bytes"] / (bw * decode_eff)
        + steps["prefill_s"] * hw["prefill_flops_efficiency"] / prefill_eff
        + steps["swap_s"]
        + steps["copy_s"]
        + n * overhead_s
    )
    result.steps = steps
    # as a real run on the GPU hardware=h100-sxm describes records it (kvbench/exec/real/device.py)
    result.summary["measured_on"] = MEASURED_ON
    folder = tmp_path / name
    write_run(result, folder, figures=False)
    return folder
