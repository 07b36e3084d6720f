"""The synthetic workload source: its config, its presets, and the workloads it generates."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvbench_plugins.workloads import synthetic
from kvbench_plugins.workloads.synthetic import SyntheticConfig, SyntheticWorkload
from omegaconf import OmegaConf

from kvbench.app.config import plugin_config, to_dataclass
from kvbench.errors import ConfigError
from kvbench.workload.arrivals import SmaxClass
from kvbench.workload.source import Workload, WorkloadSource

CONF_DIR = Path(__file__).resolve().parents[3] / "conf" / "workload"
EXERCISE2_MIX = [
    {"s_max_tokens": 512, "fraction": 0.70},
    {"s_max_tokens": 4096, "fraction": 0.25},
    {"s_max_tokens": 32768, "fraction": 0.05},
]


def make(**options) -> SyntheticWorkload:
    """The source built the way the CLI builds it: options merged into the typed config."""
    return SyntheticWorkload(to_dataclass(SyntheticConfig, options, "workload"))


def generate(seed: int = 0, **options) -> Workload:
    return make(**options).generate(np.random.default_rng(seed))


def assert_well_formed(w: Workload) -> None:
    assert w.arrival_s.dtype == np.float64
    for column in (w.prompt_tokens, w.output_tokens, w.s_max_tokens):
        assert column.dtype == np.int64
    assert np.all(np.diff(w.arrival_s) >= 0)
    assert np.all(w.prompt_tokens >= 1) and np.all(w.output_tokens >= 1)
    assert np.all(w.prompt_tokens + w.output_tokens <= w.s_max_tokens)


# -- registration -------------------------------------------------------------------------------


def test_registers_one_workload_source_named_synthetic():
    classes = synthetic.kvbench_register_workloads()
    assert classes == [SyntheticWorkload]
    assert issubclass(SyntheticWorkload, WorkloadSource)
    assert SyntheticWorkload.name == "synthetic" and SyntheticWorkload.Config is SyntheticConfig


# -- defaults and fixed lengths -----------------------------------------------------------------


def test_defaults_are_1000_requests_of_512_plus_128_tokens_at_t0_declaring_4096():
    w = generate()
    assert_well_formed(w)
    assert w.num_requests == 1000
    assert set(w.prompt_tokens.tolist()) == {512}
    assert set(w.output_tokens.tolist()) == {128}
    assert set(w.s_max_tokens.tolist()) == {4096}
    assert set(w.arrival_s.tolist()) == {0.0}


def test_fixed_lengths_with_a_mix_keep_their_lengths_and_draw_classes():
    w = generate(num_requests=2000, prompt_tokens=256, output_tokens=128, s_max_mix=EXERCISE2_MIX)
    assert_well_formed(w)
    assert set(w.prompt_tokens.tolist()) == {256}
    assert np.mean(w.s_max_tokens == 512) == pytest.approx(0.70, abs=0.04)


def test_poisson_arrivals_are_sorted_and_near_the_rate():
    w = generate(num_requests=20_000, arrival="poisson", rate_per_s=20.0)
    assert_well_formed(w)
    assert w.arrival_s[0] > 0
    assert w.num_requests / w.arrival_s[-1] == pytest.approx(20.0, rel=0.03)


# -- lognormal lengths --------------------------------------------------------------------------


def test_lognormal_lengths_have_the_configured_medians():
    # S_max large enough that clipping never touches the medians.
    w = generate(num_requests=50_000, lengths="lognormal", prompt_tokens=300, output_tokens=60, s_max_tokens=10**6)
    assert_well_formed(w)
    assert np.median(w.prompt_tokens) == pytest.approx(300, rel=0.03)
    assert np.median(w.output_tokens) == pytest.approx(60, rel=0.03)


def test_same_seed_same_workload_other_seed_other_workload():
    options = dict(lengths="lognormal", arrival="poisson", rate_per_s=5.0, s_max_mix=EXERCISE2_MIX, num_requests=300)
    a, b, c = generate(1, **options), generate(1, **options), generate(2, **options)
    for column in ("arrival_s", "prompt_tokens", "output_tokens", "s_max_tokens"):
        np.testing.assert_array_equal(getattr(a, column), getattr(b, column))
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)


def test_drawn_lengths_are_clipped_into_each_requests_declared_class():
    w = generate(num_requests=5000, lengths="lognormal", prompt_tokens=256, output_tokens=128, s_max_mix=EXERCISE2_MIX)
    assert_well_formed(w)
    small = w.s_max_tokens == 512
    assert np.all(w.prompt_tokens[small] <= 511)
    # A declared S_max is a promise: many small-class requests are truncated to exactly 512.
    filled = np.mean(w.prompt_tokens[small] + w.output_tokens[small] == 512)
    assert 0.3 < filled < 0.6


def test_min_and_max_clip_drawn_lengths():
    w = generate(
        num_requests=5000,
        lengths="lognormal",
        prompt_tokens=100,
        output_tokens=100,
        min_tokens=10,
        max_prompt_tokens=150,
        max_output_tokens=120,
    )
    assert_well_formed(w)
    assert w.prompt_tokens.min() == 10 and w.prompt_tokens.max() == 150
    assert w.output_tokens.min() == 10 and w.output_tokens.max() == 120


# -- presets ------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["synthetic", "lecture_chat", "lognormal", "exercise2_mix", "closed_loop"])
def test_every_preset_loads_and_generates_a_well_formed_workload(preset):
    node = OmegaConf.load(CONF_DIR / f"{preset}.yaml")
    assert node.name == "synthetic"
    config = plugin_config(SyntheticWorkload, node, "workload")
    w = SyntheticWorkload(config).generate(np.random.default_rng(0))
    assert_well_formed(w)
    assert w.num_requests == config.num_requests


def test_every_preset_option_has_a_comment():
    for path in CONF_DIR.glob("*.yaml"):
        for line in path.read_text().splitlines():
            if line and not line.startswith((" ", "#", "name:")) and ":" in line:
                assert "#" in line or line.rstrip().endswith(":"), f"{path.name}: {line!r} has no comment"


def test_lecture_chat_is_the_lectures_640_token_sequences():
    config = plugin_config(SyntheticWorkload, OmegaConf.load(CONF_DIR / "lecture_chat.yaml"), "workload")
    w = SyntheticWorkload(config).generate(np.random.default_rng(0))
    assert set((w.prompt_tokens + w.output_tokens).tolist()) == {640}
    assert set(w.s_max_tokens.tolist()) == {4096}


def test_closed_loop_sends_16_of_64_at_once_and_carries_the_concurrency():
    config = plugin_config(SyntheticWorkload, OmegaConf.load(CONF_DIR / "closed_loop.yaml"), "workload")
    w = SyntheticWorkload(config).generate(np.random.default_rng(0))
    assert w.num_requests == 64 and w.max_concurrency == 16
    assert set(w.prompt_tokens.tolist()) == set(w.output_tokens.tolist()) == {1024}
    assert set(w.s_max_tokens.tolist()) == {2048}


def test_closed_loop_arrivals_are_only_the_earliest_times_and_draw_nothing():
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    w = make(arrival="closed_loop", max_concurrency=4, num_requests=10).generate(rng)
    assert w.arrival_s.tolist() == [0.0] * 10 and w.max_concurrency == 4
    assert rng.bit_generator.state == before
    # ignored by the open-loop kinds, as the rate is: an open loop carries no concurrency
    assert generate(max_concurrency=4).max_concurrency is None
    assert generate(arrival="poisson", rate_per_s=5.0, max_concurrency=0).max_concurrency is None


def test_exercise2_mix_declares_the_lectures_classes():
    config = plugin_config(SyntheticWorkload, OmegaConf.load(CONF_DIR / "exercise2_mix.yaml"), "workload")
    assert config.s_max_mix == [SmaxClass(512, 0.70), SmaxClass(4096, 0.25), SmaxClass(32768, 0.05)]
    assert config.arrival == "poisson" and config.rate_per_s > 0


# -- validation ---------------------------------------------------------------------------------


def test_a_fixed_prompt_longer_than_s_max_is_rejected_in_one_line():
    with pytest.raises(ConfigError) as exc:
        make(prompt_tokens=5000)
    message = str(exc.value)
    assert message.startswith("workload.prompt_tokens=5000 is longer than workload.s_max_tokens=4096: ")
    assert "\n" not in message


INVALID_OPTIONS = [
    ({"prompt_tokens": 4000, "output_tokens": 200}, r"^workload.prompt_tokens \+ workload.output_tokens = 4200 is"),
    (
        {"prompt_tokens": 600, "s_max_mix": EXERCISE2_MIX},
        r"^workload.prompt_tokens=600 is longer than the smallest class of workload.s_max_mix \(512\)",
    ),
    ({"s_max_mix": EXERCISE2_MIX}, r"^workload.prompt_tokens \+ workload.output_tokens = 640 is longer than"),
    ({"arrival": "poisson"}, r"^workload.rate_per_s=None is invalid: use a positive request rate"),
    (
        {"arrival": "poisson", "rate_per_s": -1.0},
        r"^workload.rate_per_s=-1.0 is invalid: use a positive request rate \(requests/s\) for poisson arrivals$",
    ),
    ({"lengths": "zipf"}, r"^workload.lengths='zipf' is invalid: choose one of fixed, lognormal$"),
    ({"arrival": "gamma"}, r"^workload.arrival='gamma' is invalid: choose one of all_at_once, poisson, closed_loop$"),
    (
        {"arrival": "closed_loop"},
        r"^workload.max_concurrency=None is invalid: use an integer >= 1 \(requests in flight\) for closed_loop",
    ),
    ({"arrival": "closed_loop", "max_concurrency": 0}, r"^workload.max_concurrency=0 is invalid"),
    ({"num_requests": 0}, r"^workload.num_requests=0 is invalid"),
    ({"prompt_sigma": -0.5}, r"^workload.prompt_sigma=-0.5 is invalid"),
    ({"max_output_tokens": 0}, r"^workload.max_output_tokens=0 is invalid"),
    ({"lengths": "lognormal", "min_tokens": 300, "s_max_tokens": 512}, r"^workload.min_tokens=300 does not fit"),
    ({"lengths": "lognormal", "prompt_tokens": 8000}, r"^workload.prompt_tokens=8000 \(the median prompt\)"),
    ({"s_max_mix": [{"s_max_tokens": 4096, "fraction": 0.5}]}, r"^workload.s_max_mix fractions sum to 0.5"),
    ({"s_max_mix": [{"s_max_tokens": 4096, "fractoin": 1.0}]}, r"fractoin"),
    ({"promt_tokens": 10}, r"^workload.promt_tokens"),
]


@pytest.mark.parametrize(("options", "message"), INVALID_OPTIONS)
def test_invalid_options_fail_with_one_line_naming_the_key(options, message):
    with pytest.raises(ConfigError, match=message) as exc:
        make(**options)
    assert "\n" not in str(exc.value)


# -- properties ---------------------------------------------------------------------------------

TINY_AND_LARGE_MIX = [{"s_max_tokens": 64, "fraction": 0.5}, {"s_max_tokens": 2048, "fraction": 0.5}]
mixes = st.sampled_from([None, EXERCISE2_MIX, TINY_AND_LARGE_MIX])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    num_requests=st.integers(1, 200),
    prompt_median=st.integers(1, 60),
    output_median=st.integers(1, 600),
    sigma=st.floats(0.0, 3.0),
    poisson=st.booleans(),
    mix=mixes,
)
def test_any_valid_lognormal_config_yields_requests_that_keep_their_promise(
    seed, num_requests, prompt_median, output_median, sigma, poisson, mix
):
    options = dict(
        num_requests=num_requests,
        lengths="lognormal",
        prompt_tokens=prompt_median,
        output_tokens=output_median,
        prompt_sigma=sigma,
        output_sigma=sigma,
        s_max_mix=mix,
    )
    if poisson:
        options.update(arrival="poisson", rate_per_s=3.0)
    w = generate(seed, **options)
    assert_well_formed(w)
    assert w.num_requests == num_requests
    declared = {c["s_max_tokens"] for c in mix} if mix else {4096}
    assert set(w.s_max_tokens.tolist()) <= declared


def test_poisson_arrivals_must_stay_where_the_float64_clock_resolves_a_step():
    make(arrival="poisson", rate_per_s=1e-6, num_requests=1000)  # 1e9 s: the longest allowed
    with pytest.raises(
        ConfigError, match=r"workload.rate_per_s=1e-300 is invalid: 10 requests would arrive over ~1e\+301 s"
    ):
        make(arrival="poisson", rate_per_s=1e-300, num_requests=10)


@pytest.mark.parametrize("key", ["prompt_sigma", "beam_fork_probability", "rate_per_s"])
def test_non_finite_options_are_refused(key):
    with pytest.raises(ConfigError, match=rf"workload.{key}=inf is invalid: use a finite number"):
        make(arrival="poisson", **{"rate_per_s": 1.0, key: float("inf")})


# -- shared prefixes ------------------------------------------------------------------------------


def test_no_shared_prefix_gives_no_hashes():
    w = generate(num_requests=3)
    assert w.prefix_hashes is None and w.hash_block_tokens == 0


def test_granules_inside_the_shared_prefix_are_common_and_the_rest_unique():
    # 20 prompt tokens, a 10-token prefix, granule 4: granules 0 and 1 (tokens 0..7) are shared;
    # granule 2 (8..11) holds 2 tokens of the request's own, so it is unique, as are 3 and 4
    w = generate(num_requests=3, prompt_tokens=20, output_tokens=4, shared_prefix_tokens=10, hash_block_tokens=4)
    assert w.hash_block_tokens == 4
    assert w.prefix_hashes == [(0, 1, 3, 4, 5), (0, 1, 6, 7, 8), (0, 1, 9, 10, 11)]


def test_a_prompt_shorter_than_the_prefix_is_shared_whole():
    # the drawn prompts are at most 9 tokens, all inside the 12-token prefix: every granule shared,
    # a last partial one included
    w = generate(
        num_requests=50,
        lengths="lognormal",
        prompt_tokens=5,
        prompt_sigma=0.5,
        max_prompt_tokens=9,
        shared_prefix_tokens=12,
        hash_block_tokens=4,
    )
    for prompt, hashes in zip(w.prompt_tokens.tolist(), w.prefix_hashes):
        assert hashes == tuple(range(-(-prompt // 4)))


def test_a_prefix_shorter_than_one_granule_shares_nothing():
    w = generate(num_requests=2, prompt_tokens=16, output_tokens=4, shared_prefix_tokens=7, hash_block_tokens=8)
    assert w.prefix_hashes == [(1, 2), (3, 4)]  # id 0 would be the (absent) shared granule


def test_shared_prefix_draws_nothing_and_keeps_the_rest_of_the_workload():
    plain = generate(seed=5, num_requests=200, lengths="lognormal", arrival="poisson", rate_per_s=4.0)
    shared = generate(
        seed=5, num_requests=200, lengths="lognormal", arrival="poisson", rate_per_s=4.0, shared_prefix_tokens=64
    )
    for column in ("arrival_s", "prompt_tokens", "output_tokens", "s_max_tokens"):
        assert np.array_equal(getattr(plain, column), getattr(shared, column))
    ids = [i for hashes in shared.prefix_hashes for i in hashes[8:]]  # beyond the 64 shared tokens
    assert len(ids) == len(set(ids)) and min(ids) >= 8


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"shared_prefix_tokens": -1}, "workload.shared_prefix_tokens"),
        ({"hash_block_tokens": 0}, "workload.hash_block_tokens"),
    ],
)
def test_bad_shared_prefix_options(options, key):
    with pytest.raises(ConfigError, match=key):
        make(**options)


def test_a_closed_loops_first_wave_is_spread_over_its_window_and_the_rest_wait_for_finishes():
    config = SyntheticConfig(num_requests=10, arrival="closed_loop", max_concurrency=4, first_wave_window_s=0.2)
    arrival_s = SyntheticWorkload(config).generate(np.random.default_rng(0)).arrival_s
    assert arrival_s.tolist() == pytest.approx([0.0, 0.05, 0.1, 0.15] + [0.0] * 6)
    at_once = SyntheticConfig(num_requests=10, arrival="closed_loop", max_concurrency=4)
    assert (SyntheticWorkload(at_once).generate(np.random.default_rng(0)).arrival_s == 0).all()


@pytest.mark.parametrize("window_s", [-0.1, float("nan"), float("inf")])
def test_a_bad_first_wave_window_is_one_line(window_s):
    with pytest.raises(ConfigError, match="workload.first_wave_window_s") as info:
        SyntheticConfig(arrival="closed_loop", max_concurrency=4, first_wave_window_s=window_s).validate()
    assert "\n" not in str(info.value)
