"""Arrival processes and declared-S_max mixes shared by every workload source."""

import numpy as np
import pytest

from kvbench.errors import ConfigError
from kvbench.workload.arrivals import (
    ARRIVAL_KINDS,
    CLOSED_LOOP,
    SmaxClass,
    arrival_times_s,
    draw_s_max,
    validate_arrivals,
    validate_s_max_mix,
)

EXERCISE2_MIX = [SmaxClass(512, 0.70), SmaxClass(4096, 0.25), SmaxClass(32768, 0.05)]


def test_all_at_once_is_zeros_and_draws_nothing():
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    times_s = arrival_times_s("all_at_once", 5, None, rng)
    assert times_s.dtype == np.float64
    assert times_s.tolist() == [0.0] * 5
    assert rng.bit_generator.state == before


def test_poisson_is_the_cumulative_sum_of_exponential_gaps_from_the_first_gap():
    times_s = arrival_times_s("poisson", 4, 2.0, np.random.default_rng(7))
    gaps_s = np.random.default_rng(7).exponential(scale=0.5, size=4)
    np.testing.assert_array_equal(times_s, np.cumsum(gaps_s))
    assert times_s[0] > 0  # the first request waits one gap, it does not arrive at t = 0
    assert np.all(np.diff(times_s) >= 0)


def test_poisson_rate_is_close_to_the_requested_rate():
    times_s = arrival_times_s("poisson", 100_000, 20.0, np.random.default_rng(1))
    # 100,000 exponential gaps: the mean rate is within 1 % with overwhelming probability.
    assert len(times_s) / times_s[-1] == pytest.approx(20.0, rel=0.01)


def test_poisson_is_reproducible_for_a_seed():
    a = arrival_times_s("poisson", 100, 5.0, np.random.default_rng(3))
    b = arrival_times_s("poisson", 100, 5.0, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("kind", "rate"), [("poisson", None), ("poisson", 0.0), ("bursty", 1.0)])
def test_arrival_times_reject_what_validation_would_have_caught(kind, rate):
    with pytest.raises(ValueError):
        arrival_times_s(kind, 3, rate, np.random.default_rng(0))


def test_one_class_mix_draws_nothing():
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    s_max = draw_s_max([SmaxClass(2048, 1.0)], 3, rng)
    assert s_max.dtype == np.int64 and s_max.tolist() == [2048, 2048, 2048]
    assert rng.bit_generator.state == before


def test_mix_draws_each_class_in_its_proportion():
    s_max = draw_s_max(EXERCISE2_MIX, 100_000, np.random.default_rng(0))
    assert s_max.dtype == np.int64
    assert set(np.unique(s_max).tolist()) == {512, 4096, 32768}
    for cls in EXERCISE2_MIX:
        assert np.mean(s_max == cls.s_max_tokens) == pytest.approx(cls.fraction, abs=0.01)


def test_validate_arrivals_messages_name_key_value_and_what_is_allowed():
    validate_arrivals("all_at_once", None, "workload")
    validate_arrivals("all_at_once", -3.0, "workload")  # the rate is ignored without poisson
    validate_arrivals("poisson", 1.5, "workload")
    with pytest.raises(ConfigError) as exc:
        validate_arrivals("poisson", -1.0, "workload")
    assert str(exc.value) == (
        "workload.rate_per_s=-1.0 is invalid: use a positive request rate (requests/s) for poisson arrivals"
    )
    with pytest.raises(ConfigError, match=r"^workload.rate_per_s=None is invalid"):
        validate_arrivals("poisson", None, "workload")
    with pytest.raises(ConfigError, match=r"^workload.arrival='gamma' is invalid: choose one of all_at_once, poisson$"):
        validate_arrivals("gamma", 1.0, "workload")


def test_closed_loop_is_accepted_only_where_a_source_offers_it_and_needs_a_concurrency():
    kinds = (*ARRIVAL_KINDS, CLOSED_LOOP)
    validate_arrivals("closed_loop", None, "workload", kinds, max_concurrency=1)
    validate_arrivals("poisson", 2.0, "workload", kinds, max_concurrency=0)  # ignored without closed_loop
    with pytest.raises(ConfigError, match=r"^workload.arrival='closed_loop' is invalid: choose one of all_at_once, po"):
        validate_arrivals("closed_loop", None, "workload", max_concurrency=4)
    for value in (None, 0, -2):
        with pytest.raises(ConfigError) as exc:
            validate_arrivals("closed_loop", None, "workload", kinds, max_concurrency=value)
        assert str(exc.value) == (
            f"workload.max_concurrency={value!r} is invalid: use an integer >= 1 (requests in flight) for "
            "closed_loop arrivals"
        )


def test_closed_loop_times_are_zeros_and_draw_nothing():
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    assert arrival_times_s("closed_loop", 3, None, rng).tolist() == [0.0] * 3
    assert rng.bit_generator.state == before


def test_validate_mix_accepts_decimal_fractions_that_do_not_sum_exactly_in_floats():
    validate_s_max_mix(EXERCISE2_MIX, "workload.s_max_mix")


@pytest.mark.parametrize(
    ("mix", "message"),
    [
        ([], r"^workload.s_max_mix=\[\] is invalid: give at least one"),
        ([SmaxClass(512, 0.5), SmaxClass(4096, 0.4)], r"^workload.s_max_mix fractions sum to 0.9, not 1"),
        ([SmaxClass(512, 1.5), SmaxClass(4096, -0.5)], r"^workload.s_max_mix\[1\].fraction=-0.5 is invalid"),
        ([SmaxClass(1, 1.0)], r"^workload.s_max_mix\[0\].s_max_tokens=1 is invalid: use an integer >= 2$"),
    ],
)
def test_validate_mix_rejects_bad_classes_in_one_line(mix, message):
    with pytest.raises(ConfigError, match=message) as exc:
        validate_s_max_mix(mix, "workload.s_max_mix")
    assert "\n" not in str(exc.value)
