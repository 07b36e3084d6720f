"""The host swap pool: fixed capacity, one holding per swapped-out request, a peak."""

import pytest

from kvbench.memory.host_pool import HostSwapPool


def test_reserve_until_full_then_release():
    pool = HostSwapPool(100)
    assert pool.reserve(1, 60) and pool.reserve(2, 40)
    assert not pool.reserve(3, 1) and pool.used_bytes == 100  # a refusal changes nothing
    assert pool.release(1) == 60 and pool.used_bytes == 40
    assert pool.reserve(3, 50) and pool.peak_bytes == 100
    with pytest.raises(KeyError):
        pool.release(1)
    with pytest.raises(ValueError):
        pool.reserve(2, 1)
