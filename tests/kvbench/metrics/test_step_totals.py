"""The step table's summary added up a batch of rows at a time: exactly the whole table's, bit for
bit, however the rows are split (a run that streams its table to its files relies on it)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvbench.metrics.recorder import STEP_COLUMNS
from kvbench.metrics.step_totals import ExactSum, StepTotals

# finite doubles whose running sums cannot overflow (fsum raises on an intermediate overflow)
FLOATS = st.floats(min_value=-1e300, max_value=1e300, allow_nan=False, allow_infinity=False)


def split(values: list, cuts: list[int]) -> list[list]:
    """``values`` in consecutive pieces at the (sorted, de-duplicated) ``cuts``."""
    bounds = [0, *sorted({c % (len(values) + 1) for c in cuts}), len(values)]
    return [values[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=300, deadline=None)
@given(st.lists(FLOATS, max_size=60), st.lists(st.integers(min_value=0, max_value=60), max_size=8))
@example([1e300, 1.0, -1e300, 5e-324], [1, 2, 3])  # the small values survive the large ones cancelling
@example([0.1] * 10, [3, 7])  # a sum that is not a double: its rounding error is carried
@example([-0.0], [])
def test_an_exact_sum_in_batches_is_fsum_of_every_value(values, cuts):
    total = ExactSum()
    for piece in split(values, cuts):
        total.add(np.array(piece, dtype=np.float64))
    assert math.copysign(1, total.value()) == math.copysign(1, math.fsum(values)) or not values
    assert total.value() == math.fsum(values)


def test_an_exact_sum_of_nothing_is_zero():
    assert ExactSum().value() == 0.0


def test_an_exact_sum_carries_what_rounding_drops():
    """0.1 ten times: a naive running sum gives 0.9999999999999999, fsum 1.0."""
    total = ExactSum()
    for _ in range(10):
        total.add(np.array([0.1]))
    assert total.value() == 1.0 == math.fsum([0.1] * 10)


def random_steps(rng: np.random.Generator, num_rows: int) -> pd.DataFrame:
    """A step table of the recorder's columns and types, with values a run could hold."""
    table = {}
    for name in STEP_COLUMNS:
        if name == "saturated":
            table[name] = rng.random(num_rows) < 0.4
        elif name == "num_running":
            table[name] = rng.integers(0, 6, num_rows)
        elif name == "num_steps":
            table[name] = rng.integers(1, 50, num_rows)
        elif name in ("start_s", "duration_s", "prefill_s", "decode_s", "swap_s", "copy_s", "recompute_s"):
            table[name] = rng.exponential(0.02, num_rows)
        elif name.endswith("_bytes") and name not in ("copy_bytes",) and not name.endswith("_max"):
            table[name] = rng.integers(0, 1 << 30, num_rows).astype(np.float64) / rng.integers(1, 7, num_rows)
        else:
            table[name] = rng.integers(0, 1 << 30, num_rows)
    return pd.DataFrame(table)


def summary_of(batches: list[pd.DataFrame]) -> dict:
    totals = StepTotals(budget_bytes=(1 << 30) * 3, kv_bytes_per_token=4096)
    for batch in batches:
        totals.add({name: batch[name].to_numpy() for name in batch.columns})
    return totals.summary()


def assert_same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        if isinstance(a[key], float) and math.isnan(a[key]):
            assert isinstance(b[key], float) and math.isnan(b[key]), key
        else:
            assert a[key] == b[key] and type(a[key]) is type(b[key]), key


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=300),
    st.lists(st.integers(min_value=0, max_value=300), max_size=6),
)
def test_a_summary_added_in_batches_is_the_whole_tables_to_the_last_bit(seed, num_rows, cuts):
    steps = random_steps(np.random.default_rng(seed), num_rows)
    bounds = [0, *sorted({c % (num_rows + 1) for c in cuts}), num_rows]
    batches = [steps.iloc[a:b] for a, b in zip(bounds, bounds[1:])]
    assert_same(summary_of(batches), summary_of([steps]))


def test_the_sums_are_fsums_of_the_columns():
    """An independent check of what is added up: each total is math.fsum over its column, each
    mean the fsum of value x time over the fsum of time, over the saturated steps where it says so."""
    steps = random_steps(np.random.default_rng(7), 500)
    out = summary_of([steps.iloc[:123], steps.iloc[123:]])
    d, sat = steps["duration_s"].to_numpy(), steps["saturated"].to_numpy()
    running = steps["num_running"].to_numpy(dtype=np.float64)
    assert out["saturated_s"] == math.fsum(d[sat]) and out["decode_s"] == math.fsum(steps["decode_s"])
    assert out["mean_concurrency"] == math.fsum(running * d) / math.fsum(d)
    assert out["mean_concurrency_saturated"] == math.fsum((running * d)[sat]) / math.fsum(d[sat])
    assert out["breakdown_period"] == "saturated"
    share = steps["internal_bytes"].to_numpy() / ((1 << 30) * 3)
    assert out["frac_internal"] == math.fsum((share * d)[sat]) / math.fsum(d[sat])
    assert out["num_steps"] == int(steps["num_steps"].sum())
    assert out["peak_concurrency"] == int(running.max())
    assert out["min_concurrency_saturated"] == int(running[sat].min())
    assert out["peak_allocated_bytes"] == int(steps["allocated_bytes_max"].max())


def test_an_empty_table_gives_zero_counts_and_nan_means():
    out = summary_of([random_steps(np.random.default_rng(0), 0)])
    assert out["num_steps"] == 0 and out["peak_concurrency"] == 0 and out["peak_allocated_bytes"] == 0
    assert math.isnan(out["mean_concurrency"]) and math.isnan(out["min_concurrency_saturated"])
    assert out["breakdown_period"] == "all"


@pytest.mark.parametrize("num_rows", [1, 40])
def test_a_run_that_never_saturates_averages_its_breakdown_over_every_step(num_rows):
    steps = random_steps(np.random.default_rng(3), num_rows)
    steps["saturated"] = False
    out = summary_of([steps])
    d = steps["duration_s"].to_numpy()
    assert out["breakdown_period"] == "all" and out["saturated_s"] == 0.0
    share = steps["token_bytes"].to_numpy() / ((1 << 30) * 3)
    assert out["frac_token"] == math.fsum(share * d) / math.fsum(d)
    assert math.isnan(out["utilization_saturated"])
