"""The roofline decode of a model with sliding-window layers reads, per group, what it attends to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from kvbench.app.config import to_dataclass
from kvbench.exec.costmodel import CostModel
from kvbench.specs.hardware import HardwareSpec
from kvbench.specs.model import ModelConfig, model_spec

CONF = Path(__file__).resolve().parents[3] / "conf"


def cost(model: str, **hf) -> CostModel:
    node = OmegaConf.load(CONF / "model" / f"{model}.yaml")
    for key, value in hf.items():
        node.hf_config[key] = value
    hardware = to_dataclass(HardwareSpec, OmegaConf.load(CONF / "hardware" / "h100-sxm.yaml"), "hardware")
    return CostModel(model_spec(to_dataclass(ModelConfig, node, "model")), hardware)


def test_a_window_layer_reads_at_most_its_window():
    c = cost("mistral-7b-v0.1")
    kv = c.model.kv_bytes_per_token
    # a 100-token and a 5,000-token sequence: every layer reads 100 and 4,096 tokens
    (t,) = c.windowed_decode_times_s([100, 5000], 1)
    assert t == pytest.approx(c.weights_time_s + c.decode_kv_time_s((100 + 4096) * kv), rel=1e-12)
    # the full-attention twin reads all 5,100
    twin = cost("mistral-7b-v0.1", sliding_window=None)
    assert twin.window_groups == ()
    assert twin.decode_time_s(5100) == pytest.approx(c.weights_time_s + c.decode_kv_time_s(5100 * kv), rel=1e-12)


def test_gemma3_reads_the_whole_context_in_one_group_of_six():
    c = cost("gemma3-12b")
    group = c.model.kv_bytes_per_token // 6
    (t,) = c.windowed_decode_times_s([10_000], 1)
    assert t == pytest.approx(c.weights_time_s + c.decode_kv_time_s(10_000 * group + 5 * 1024 * group), rel=1e-12)


def test_a_run_of_steps_prices_each_step_as_it_alone_is_priced():
    c = cost("gemma3-12b", sliding_window=64)
    reads = [3, 60, 64, 500]
    run = c.windowed_decode_times_s(reads, 10)
    alone = np.array([c.windowed_decode_times_s([r + k for r in reads], 1)[0] for k in range(10)])
    assert np.array_equal(run, alone)  # to the last bit: both loops' clocks agree
    assert np.all(np.diff(run) > 0)  # the full group still reads one more token per step


@pytest.mark.parametrize("num_steps", [1, 7, 40])
def test_plain_floats_and_arrays_price_a_run_alike(num_steps):
    """Short runs and single steps are priced in plain floats, long runs in arrays: the same bits,
    and the tokens beyond each window are what summing max(0, read + k - W) over sequences gives."""
    c = cost("gemma3-12b", sliding_window=64)
    reads = [1, 30, 63, 64, 65, 200, 5]
    assert c.windowed_decode_times_list_s(reads, num_steps) == c.windowed_decode_times_s(reads, num_steps).tolist()
    run = c.windowed_decode_times_s(reads, num_steps)
    kv, (window, group_bytes) = c.model.kv_bytes_per_token, c._window_reads[0]  # five groups of one window
    beyond = [sum(max(0, r + k - window) for r in reads) for k in range(num_steps)]
    read_bytes = [kv * (sum(reads) + len(reads) * k) - group_bytes * b for k, b in enumerate(beyond)]
    assert run.tolist() == [
        b / (c.hardware.hbm_bandwidth_bytes_per_s * c.decode_efficiency) + c.weights_time_s for b in read_bytes
    ]
