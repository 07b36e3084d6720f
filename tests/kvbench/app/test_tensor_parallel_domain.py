"""A tensor-parallel group spans at most one NVLink domain of the run's hardware
(``hardware.nvlink_domain_gpus``): an HGX node's 8 GPUs, a GB200/GB300 NVL72 rack's 72."""

from __future__ import annotations

import pytest

from kvbench.api import build
from kvbench.errors import ConfigError


def test_tp16_runs_inside_an_nvl72_domain_with_the_heads_split_and_kv_heads_replicated():
    s = build(["model=llama3.1-8b", "model.tp=16", "hardware=gb200"])  # 32 heads, 8 KV heads
    assert s.model.heads_per_gpu == 2 and s.model.kv_heads_per_gpu == 1


def test_tp_beyond_the_hardwares_nvlink_domain_is_one_line():
    with pytest.raises(ConfigError) as err:
        build(["model=llama3.1-8b", "model.tp=16", "hardware=h100-sxm"])
    message = str(err.value)
    assert "\n" not in message and "model.tp=16" in message and "hardware.nvlink_domain_gpus=8" in message
    with pytest.raises(ConfigError) as err:
        build(["model=llama3.1-8b", "model.tp=16", "hardware=gb200", "hardware.nvlink_domain_gpus=8"])
    assert "hardware.nvlink_domain_gpus=8" in str(err.value)
    with pytest.raises(ConfigError, match=r"model.tp=96 is invalid: use 1 to 72 GPUs"):
        build(["model=llama3.1-8b", "model.tp=96", "hardware=gb200"])
