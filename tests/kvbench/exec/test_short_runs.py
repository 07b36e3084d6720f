"""A short run of decode steps is priced in plain floats (kvbench/exec/sim.py): the same bits as
the numpy path, step by step, for every length up to the threshold and on calibrated clocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.core.step import StepPlan
from kvbench.exec import sim
from kvbench.exec.costmodel import CostModel
from kvbench.specs.hardware import HardwareSpec
from kvbench.specs.model import ModelSpec

MODEL = ModelSpec(
    "llama2-7b", num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128, dtype_bytes=2, num_params=6_738_415_616
)
COST = CostModel(MODEL, HardwareSpec(kv_budget_bytes=62.5e9))


@settings(max_examples=200, deadline=None)
@given(
    first=st.integers(0, 10**7),
    num_decodes=st.integers(1, 1024),
    num_steps=st.integers(1, sim.SHORT_RUN_STEPS),
)
def test_plain_floats_are_the_numpy_bits(first, num_decodes, num_steps):
    cost = COST
    listed = cost.decode_times_list_s(first, num_decodes, num_steps)
    assert listed == cost.decode_times_s(first, num_decodes, num_steps).tolist()
    assert listed[0] == cost.decode_time_s(first)  # and what one step priced alone gives


@pytest.mark.parametrize("first", [2**34 - 200, 2**34, 2**40 + 12_345])  # 2^34 tokens: 2^53 bytes
def test_plain_floats_near_and_past_2_to_the_53_are_the_numpy_bits(first):
    """Up to 2^53 bytes the progression is carried in floats, past it in integers (a float would round them)."""
    for num_steps in (2, sim.SHORT_RUN_STEPS):
        listed = COST.decode_times_list_s(first, 3, num_steps)
        assert listed == COST.decode_times_s(first, 3, num_steps).tolist()
        assert listed[-1] == COST.decode_time_s(first + 3 * (num_steps - 1))


class _Seq:
    num_computed_tokens = 0


@pytest.mark.parametrize("overhead_s", [0.0, 3.7e-4])
@pytest.mark.parametrize("num_steps", [2, 7, sim.SHORT_RUN_STEPS])
def test_a_short_run_prices_as_the_numpy_path(monkeypatch, num_steps, overhead_s):
    cost = CostModel(MODEL, HardwareSpec(kv_budget_bytes=62.5e9), step_overhead_s=overhead_s)
    plan = StepPlan(0, 12.345678)
    plan.decodes = [_Seq()] * 37
    plan.kv_read_tokens = 37 * 1_000
    plan.num_steps = num_steps
    short = sim.SimExecutor(cost).execute(plan)
    monkeypatch.setattr(sim, "SHORT_RUN_STEPS", 1)  # every run through numpy
    long = sim.SimExecutor(cost).execute(plan)
    assert isinstance(short.durations_s, tuple) and isinstance(long.durations_s, np.ndarray)
    assert list(short.durations_s) == long.durations_s.tolist()
    assert list(short.clock_s) == long.clock_s.tolist()
    assert (short.end_s, short.decode_s) == (long.end_s, long.decode_s)
