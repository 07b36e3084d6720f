"""The host tier's LRU of block keys: order, capacity and counters, exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbench.core.kv import Transfer
from kvbench.errors import ConfigError
from kvbench.memory.host_cache import HostBlockCache, HostReload, validate_host_tier


def test_offloads_evict_the_least_recently_evicted_key_first():
    host = HostBlockCache(3)
    assert [host.offload((k, 16)) for k in range(3)] == [None, None, None]
    assert host.keys() == [(0, 16), (1, 16), (2, 16)]
    assert host.offload((3, 16)) == (0, 16)  # full: the oldest goes
    assert host.keys() == [(1, 16), (2, 16), (3, 16)]
    host.reload((2, 16))  # a reload takes the key back to the GPU (exclusive tiers)
    assert (2, 16) not in host and len(host) == 2
    assert host.offload((4, 16)) is None  # a slot was free again
    assert host.offload((5, 16)) == (1, 16)
    assert host.keys() == [(3, 16), (4, 16), (5, 16)]
    assert (host.num_offloaded_blocks, host.num_reloaded_blocks, host.num_evicted_blocks) == (6, 1, 2)
    assert host.peak_blocks == 3


def test_a_key_computed_again_on_the_gpu_is_discarded_without_a_copy():
    host = HostBlockCache(2)
    host.offload((7, 8))
    assert host.discard((7, 8)) and not host.discard((7, 8))
    assert (host.num_discarded_blocks, host.num_reloaded_blocks, len(host)) == (1, 0, 0)
    with pytest.raises(KeyError):
        host.reload((7, 8))


def test_no_slot_keeps_nothing():
    host = HostBlockCache(0)
    assert host.offload((1, 16)) is None
    assert len(host) == 0 and host.num_offloaded_blocks == 0
    with pytest.raises(ValueError):
        HostBlockCache(-1)


@given(st.integers(0, 6), st.lists(st.tuples(st.sampled_from(["offload", "reload", "discard"]), st.integers(0, 9))))
def test_never_more_keys_than_slots_and_lru_order(capacity, operations):
    host = HostBlockCache(capacity)
    model: list[tuple[int, int]] = []  # least recent first
    for op, k in operations:
        key = (k, 16)
        if op == "offload":
            evicted = host.offload(key)
            if capacity:
                if key in model:
                    model.remove(key)
                    expected = None
                else:
                    expected = model.pop(0) if len(model) >= capacity else None
                model.append(key)
                assert evicted == expected
        elif op == "reload" and key in model:
            host.reload(key)
            model.remove(key)
        elif op == "discard":
            assert host.discard(key) == (key in model)
            if key in model:
                model.remove(key)
        assert len(host) <= capacity and host.keys() == model
    assert host.peak_blocks <= capacity


def test_a_reload_knows_which_positions_it_served():
    reload = HostReload(Transfer(3 * 128, 1), (1, 2, 4), 8)
    assert reload.num_tokens == 24
    assert reload.tokens_past(0) == 24
    assert reload.tokens_past(12) == 4 + 8 + 8  # block 1 covers 8..16: 4 positions past 12
    assert reload.tokens_past(40) == 0


@pytest.mark.parametrize(
    "size, mode, caching, words",
    [
        (-1, "overlapped", True, "host_cache_bytes"),
        (1e9, "overlapped", False, "prefix_caching=true"),
        (1e9, "sometimes", True, "host_reload"),
        (True, "overlapped", True, "host_cache_bytes"),
    ],
)
def test_bad_options_are_one_line(size, mode, caching, words):
    with pytest.raises(ConfigError, match=words) as error:
        validate_host_tier(size, mode, caching)
    assert "\n" not in str(error.value)


def test_good_options_pass():
    validate_host_tier(0, "overlapped", False)
    validate_host_tier(62.5e9, "blocking", True)
