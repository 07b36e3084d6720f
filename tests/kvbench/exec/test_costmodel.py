"""The cost model reproduces the lecture's step times."""

from __future__ import annotations

import pytest

from kvbench.exec.costmodel import CostModel
from kvbench.specs.hardware import HardwareSpec
from kvbench.specs.model import ModelSpec

LLAMA2_7B = ModelSpec("llama2-7b", num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128, dtype_bytes=2, num_params=6_738_415_616)
H100 = HardwareSpec(kv_budget_bytes=62.5e9)


def test_recompute_of_a_4k_prompt_takes_129_ms():
    assert CostModel(LLAMA2_7B, H100).prefill_time_s(4096) == pytest.approx(0.129, abs=1e-3)


def test_decode_step_at_199_sequences_of_640_tokens():
    # lecture 10.6: 13.5 GB of weights + 199 x 0.328 GB of KV = 78.8 GB -> 23.5 ms
    cost = CostModel(LLAMA2_7B, H100)
    kv_tokens = 199 * 640 * 0.328e9 / (640 * 524_288)  # the lecture's 0.328 GB per sequence
    assert cost.decode_time_s(int(kv_tokens)) == pytest.approx(0.0235, abs=2e-4)


def test_efficiency_scales_decode_only():
    full, half = CostModel(LLAMA2_7B, H100, 1.0), CostModel(LLAMA2_7B, H100, 0.5)
    assert half.decode_time_s(10_000) == pytest.approx(2 * full.decode_time_s(10_000))
    assert half.prefill_time_s(512) == full.prefill_time_s(512)


def test_step_time_adds_prefill_and_one_decode_pass():
    cost = CostModel(LLAMA2_7B, H100)
    assert cost.step_time_s(0.1, 0, 0) == 0.1
    assert cost.step_time_s(0.1, 3, 1000) == pytest.approx(0.1 + cost.decode_time_s(1000))
