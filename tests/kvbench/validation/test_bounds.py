"""kvbench.validation.bounds: a row's lock-step and steady-state step prices, and where a TPOT lies."""

from __future__ import annotations

import pandas as pd
import pytest
from silicon_rows import DENSE_ROW

from kvbench.api import ConfigError, build
from kvbench.validation import bounds, silicon

ROW = DENSE_ROW


@pytest.fixture(scope="module")
def cost():
    return build(list(silicon.replay(pd.Series(ROW), "profiled").overrides)).cost


def test_the_steady_state_step_adds_the_prompts_arriving_meanwhile(cost):
    row = pd.Series(ROW)
    b = bounds.step_bounds(row, cost, 8192)
    assert b.prompt_tokens_per_step == round(16 * 2048 / 127)  # 258
    # the lock-step bound is the decode pass alone, at the batch's mean context
    assert b.decode_ms == pytest.approx(cost.step_times_s([], 16, 16 * (2048 + 64))[1] * 1e3, rel=1e-12)
    chunk_s, decode_s = cost.step_times_s([(258, 1024)], 16, 16 * (2048 + 64))
    assert b.mixed_ms == pytest.approx((sum(chunk_s) + decode_s) * 1e3, rel=1e-12)
    assert b.mixed_ms > b.decode_ms


def test_the_prompt_share_is_capped_by_the_step_budget(cost):
    row = pd.Series({**ROW, "isl": 8000, "osl": 2, "batch_size": 64.0})
    assert bounds.step_bounds(row, cost, 8192).prompt_tokens_per_step == 8192 - 64


def test_a_tpot_is_placed_below_between_or_above():
    b = bounds.StepBounds(decode_ms=5.0, mixed_ms=9.0, prompt_tokens_per_step=100)
    assert bounds.classify(4.99, b) == bounds.BELOW
    assert bounds.classify(5.0, b) == bounds.BETWEEN
    assert bounds.classify(9.0, b) == bounds.BETWEEN
    assert bounds.classify(9.01, b) == bounds.ABOVE


def test_a_disaggregated_row_is_refused(cost):
    with pytest.raises(ConfigError, match="aggregated rows"):
        bounds.step_bounds(pd.Series({**ROW, "mode": "disagg"}), cost, 8192)
