"""HardwareSpec: the lecture's H100 constants and the KV budget."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kvbench.app.config import to_dataclass
from kvbench.errors import ConfigError
from kvbench.specs.hardware import HardwareSpec

CONF = Path(__file__).resolve().parents[3] / "conf" / "hardware"


def hw(name: str) -> HardwareSpec:
    return to_dataclass(HardwareSpec, OmegaConf.load(CONF / f"{name}.yaml"), "hardware")


def test_h100_has_the_lecture_constants():
    h = hw("h100-sxm")
    assert h.hbm_bandwidth_bytes_per_s == 3.35e12
    assert h.achieved_prefill_flops_per_s == pytest.approx(494.5e12)
    assert h.host_link_bytes_per_s == 64e9
    assert h.kv_budget(13_476_831_232) == 62_500_000_000


def test_a100_has_the_vllm_papers_budget_in_gib():
    budget = hw("a100-40gb").kv_budget(25_705_712_640)  # OPT-13B's weights in fp16
    assert budget == 12 * 2**30
    assert budget // 819_200 == 15_728  # token slots of 800 KiB: the paper's "15.7K"


def test_weights_and_an_explicit_budget_must_fit_in_memory_together():
    h100 = hw("h100-sxm")  # 62.5 GB of KV on an 80 GB card
    with pytest.raises(
        ConfigError,
        match=r"hardware.kv_budget_bytes=6.25e\+10 plus 138.0 GB of weights exceed hardware.hbm_bytes=8e\+10",
    ):
        h100.kv_budget(137_953_296_384)  # a 70B model in fp16


def test_budget_derived_from_memory_fraction():
    h = hw("h200")
    assert h.kv_budget(13_476_831_232) == int(141e9 * 0.9) - 13_476_831_232


def test_bad_hardware_values():
    with pytest.raises(ConfigError, match=r"hardware.prefill_flops_efficiency=1.5 is invalid"):
        to_dataclass(HardwareSpec, {"prefill_flops_efficiency": 1.5}, "hardware")
    with pytest.raises(ConfigError, match="leaves no KV budget"):
        HardwareSpec(hbm_bytes=10e9, kv_budget_bytes=None).kv_budget(13e9)
    with pytest.raises(ConfigError, match="hardware.*hbm_gb"):
        to_dataclass(HardwareSpec, {"hbm_gb": 80}, "hardware")


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("hbm_bandwidth_bytes_per_s", float("inf"), "finite"),  # divided by zero before
        ("kv_budget_bytes", float("inf"), "finite"),
        ("memory_fraction", float("nan"), "finite"),
        ("hbm_bandwidth_bytes_per_s", 0.5, r"rate >= 1 per second"),
        ("host_link_bytes_per_s", 1e-300, r"rate >= 1 per second"),
        ("host_transfer_overhead_s", 2.0, r"seconds in \[0, 1\]"),
        ("hbm_bytes", 2.0**63, r"fewer than 2\*\*63 bytes"),
        ("host_swap_bytes", -1, ">= 0"),
    ],
)
def test_hardware_numbers_have_ranges(key, value, match):
    with pytest.raises(ConfigError, match=rf"hardware.{key}=.* is invalid: .*{match}"):
        to_dataclass(HardwareSpec, {key: value}, "hardware")


def test_achieved_prefill_rate_is_at_least_one_flop_per_second():
    with pytest.raises(ConfigError, match="prefill_flops_efficiency must be >= 1 FLOP/s"):
        to_dataclass(HardwareSpec, {"dense_flops_per_s": 1.0, "prefill_flops_efficiency": 0.5}, "hardware")


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".hidden", "-x", "a b", "", "x" * 65, "a..b"])
def test_hardware_name_is_a_path_component(name):
    with pytest.raises(ConfigError, match=r"hardware.name=.* is invalid: use 1 to 64 letters"):
        to_dataclass(HardwareSpec, {"name": name}, "hardware")


@pytest.mark.parametrize("name", ["h100-sxm", "a100-40gb", "H200_v1.2", "x" * 64])
def test_ordinary_hardware_names_pass(name):
    assert to_dataclass(HardwareSpec, {"name": name}, "hardware").name == name
