"""Tolerance specs, the rules that pick one per metric, and the shipped defaults."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvbench.compare.tolerance import (
    CLOSE_REL,
    Tolerance,
    default_rules,
    parse_option,
    parse_spec,
    tolerance_for,
)
from kvbench.errors import ConfigError


def test_exact_means_equal_with_nan_equal_to_nan_and_no_float_slack():
    exact = parse_spec("exact")
    assert exact.accepts(3, 3) and exact.accepts(math.nan, math.nan) and exact.accepts(2**62 + 1, 2**62 + 1)
    assert not exact.accepts(0.1 + 0.2, 0.3)  # no rounding allowance: the simulator is deterministic
    assert not exact.accepts(2**62, 2**62 + 1)  # ints compared as ints, not as float64
    assert not exact.accepts(1.0, math.nan)


def test_close_keeps_counts_exact_and_lets_floats_differ_by_summation_noise_only():
    close = parse_spec("close")
    assert close == Tolerance("close", CLOSE_REL) and str(close) == "close"
    # two orders of one float sum: the last bits differ, the number does not
    terms = np.random.default_rng(0).random(100_000)
    pairwise, sequential = float(terms.sum()), float(np.cumsum(terms)[-1])
    assert pairwise != sequential and close.accepts(pairwise, sequential)
    assert close.accepts(0.8912405705277272, 0.8912405705277271)  # seen between two CPUs
    assert not close.accepts(1.0, 1.0 + 1e-8) and not close.accepts(0.0, 1e-300)
    # a count moved by one is a change however large the count; a bool flipping too
    assert not close.accepts(62_500_000_000, 62_500_000_001) and not close.accepts(np.int64(7), np.int64(8))
    assert not close.accepts(True, False) and close.accepts(np.int64(7), 7)
    assert close.accepts(math.nan, math.nan) and not close.accepts(1.0, math.nan)
    # a float column holding a whole number (a count that may be NaN) still moves by a whole unit
    assert not close.accepts(184.0, 185.0)
    looser = parse_spec("close:1e-6")
    assert looser.accepts(1.0, 1.0 + 1e-7) and not looser.accepts(10, 11) and str(looser) == "close 1e-06"


@pytest.mark.parametrize(
    "spec, base, head, ok",
    [
        ("rel:0.01", 100.0, 101.0, True),
        ("rel:0.01", 100.0, 101.5, False),
        ("rel:0.01", -100.0, -99.0, True),
        ("rel:0.01", 0.0, 1e-9, False),  # nothing is within a fraction of zero but zero
        ("abs:0.5", 0.0, 0.5, True),
        ("abs:0.5", 10, 9.4, False),
        ("ratio:2", 1.0, 1.9, True),
        ("ratio:2", 1.0, 0.6, True),
        ("ratio:2", 1.0, 0.4, False),
        ("ratio:2:lower", 1.0, 0.01, True),  # a duration falling: better
        ("ratio:2:lower", 1.0, 2.5, False),
        ("ratio:2:higher", 1.0, 100.0, True),  # a rate rising: better
        ("ratio:2:higher", 1.0, 0.4, False),
        ("ratio:2:lower", 0.0, 0.0, True),
        ("ratio:2:lower", 0.0, 1.0, False),  # from zero no ratio holds; only the good direction passes
        ("ignore", 1.0, 1e9, True),
        ("rel:0.5", 1.0, math.nan, False),
    ],
)
def test_specs_accept_what_they_say(spec, base, head, ok):
    assert parse_spec(spec).accepts(base, head) is ok


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("rel", "write rel:<amount>"),
        ("rel:-1", "'-1' is not a finite number >= 0"),
        ("abs:inf", "'inf' is not a finite number"),
        ("ratio:0.9", ">= 1"),
        ("ratio:2:sideways", "ratio:<factor>[:lower|:higher]"),
        ("exact:1", "exact takes no amount"),
        ("clos", "unknown kind 'clos'"),
        ("close:1:2", "write close or close:<fraction>"),
        ("close:-1", "'-1' is not a finite number >= 0"),
    ],
)
def test_bad_specs_say_what_is_wrong_and_the_grammar(spec, fragment):
    with pytest.raises(ConfigError) as error:
        parse_spec(spec)
    assert fragment in str(error.value) and "specs: exact, close[:<fraction>], rel:" in str(error.value)


def test_the_last_matching_rule_wins():
    rules = [parse_option("*=exact"), parse_option("ttft_*=rel:0.1"), parse_option("ttft_p99_s=abs:2")]
    assert tolerance_for("ttft_p50_s", rules) == Tolerance("rel", 0.1)
    assert tolerance_for("ttft_p99_s", rules) == Tolerance("abs", 2.0)
    assert tolerance_for("peak_concurrency", rules) == Tolerance("exact")
    assert tolerance_for("anything", []) == Tolerance("exact")


def test_shipped_defaults_keep_simulated_metrics_close_and_never_gate_timings():
    rules = default_rules()
    assert tolerance_for("ttft_p50_s", rules) == Tolerance("close", CLOSE_REL)
    assert tolerance_for("peak_concurrency", rules) == Tolerance("close", CLOSE_REL)
    for timing in ("sim_wall_s", "loop_wall_s", "simulated_requests_per_wall_s"):
        assert tolerance_for(timing, rules) == Tolerance("ignore")
    assert tolerance_for("kvbench_commit", rules).kind == "ignore"
