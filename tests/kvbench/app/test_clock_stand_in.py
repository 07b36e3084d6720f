"""A model the roofline has no terms for (routed experts, MLA, linear state) is priced from measured
tables even under a kernel that was never measured, and says whose tables stand in."""

from __future__ import annotations

import pytest

from kvbench.api import run
from kvbench.errors import ConfigError

SMALL = ["workload.num_requests=6", "progress=false", "output.write=false", "wandb.mode=disabled"]


@pytest.mark.parametrize("model", ["deepseek-v3", "gpt-oss-120b"])
def test_a_moe_model_on_a_measured_gpu_runs_on_the_profiled_clock(model):
    summary = run([f"model={model}", "hardware=h200-sxm", "kernel=triton", *SMALL]).summary
    assert summary["clock"] == "profiled"
    assert "kernel=vllm_fa3's tables (stand-in)" in summary["calibration"]


def test_the_stand_in_prices_like_the_measured_kernel_it_names():
    stand_in = run(["model=deepseek-v3", "hardware=h200-sxm", "kernel=torch", *SMALL]).summary
    named = run(["model=deepseek-v3", "hardware=h200-sxm", "kernel=vllm_fa3", *SMALL]).summary
    assert stand_in["tpot_mean_s"] == pytest.approx(named["tpot_mean_s"], rel=1e-9)
    assert stand_in["ttft_mean_s"] == pytest.approx(named["ttft_mean_s"], rel=1e-9)


def test_a_dense_model_keeps_the_roofline_under_an_unmeasured_kernel():
    # (kvbench's triton and flashinfer are priced by the transfer on H100/H200: test_transfer.py)
    summary = run(["model=llama3.1-8b", "hardware=h200-sxm", "kernel=torch", *SMALL]).summary
    assert summary["clock"] == "roofline"


def test_a_gpu_without_tables_keeps_the_roofline():
    summary = run(["model=gpt-oss-20b", "hardware=a100-40gb", "kernel=triton", *SMALL]).summary
    assert summary["clock"] == "roofline"


def test_a_gpu_whose_tables_price_none_of_it_is_one_line():
    # H200's tables never measured NVFP4 experts: no stand-in prices the run, and it is refused
    # (falling back to the roofline would print numbers without the terms the model needs)
    with pytest.raises(ConfigError) as err:
        run(["model=deepseek-v3", "model.moe_dtype=nvfp4", "hardware=h200-sxm", "kernel=triton", *SMALL])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("model=deepseek-v3 needs measured tables on hardware=h200-sxm")
    assert "kernel=vllm_fa3:" in message and "moe_dtype=nvfp4" in message
