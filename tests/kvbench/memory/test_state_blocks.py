"""StateBlocks: a state per sequence in whole blocks of the pool, spares for a fan-out's branches,
nothing leaked or freed twice across admission, fork, swap and free."""

from __future__ import annotations

import pytest

from kvbench.core.ledger import MemoryLedger
from kvbench.memory.block_pool import BlockPool
from kvbench.memory.state_blocks import StateBlocks, with_states
from kvbench.specs.kv_groups import STATE, KVGroup


def make(num_blocks=20, block_bytes=100, state_bytes=(150, 150)):
    pool = BlockPool(num_blocks, block_bytes)
    return pool, StateBlocks(pool, [KVGroup(STATE, 1, state_bytes=s) for s in state_bytes])


def test_each_state_group_takes_whole_blocks():
    pool, states = make()
    assert states.state_bytes == 300 and states.blocks_per_state == 4
    states.admit(1, num_branches=3)
    assert pool.num_free() == 20 - 12 and states.num_blocks_held == 12
    assert states.ledger_parts() == {
        "state_bytes": 300,
        "reserved_future_bytes": 600,
        "internal_bytes": 1_200 - 900,
        "state_group_bytes": 1_200,
    }


def test_a_fork_takes_a_spare_and_a_free_gives_everything_back():
    pool, states = make()
    states.admit(1, num_branches=2)
    src, dst = states.fork(1, 2)
    assert src != dst and states.ledger_parts()["state_bytes"] == 600
    with pytest.raises(RuntimeError):
        states.fork(1, 3)  # the family reserved one branch only
    states.release(1)
    states.release(2)
    assert pool.num_free() == 20 and states.num_blocks_held == 0
    with pytest.raises(KeyError):
        states.release(2)  # freed twice: a bug


def test_a_swapped_family_takes_its_states_and_spares_back():
    pool, states = make()
    states.admit(1, num_branches=3)
    states.fork(1, 2)
    assert states.swap_out([1, 2]) == 600
    assert pool.num_free() == 20 and states.swapped_blocks([1, 2]) == 12
    assert states.swap_in([1, 2]) == 600
    assert states.ledger_parts()["reserved_future_bytes"] == 300 and pool.num_free() == 8


def test_the_states_add_to_the_kv_ledger():
    _, states = make()
    states.admit(1, 1)
    led = with_states(
        MemoryLedger(2_000, 100, 0, 0, 0, 1_900 - 400, 0, (("full_group_bytes", 100),)), states.ledger_parts()
    )
    assert led.total_bytes == 2_000 and led.state_bytes == 300 and led.internal_bytes == 100
    assert dict(led.group_bytes) == {"full_group_bytes": 100, "state_group_bytes": 400}


def test_a_branch_freed_while_its_family_lives_is_forked_again_from_its_spare():
    # a fan-out's branches preempted alone (recompute) are forked again from the first sequence:
    # their states wait in the family's spares, so the fork needs no memory (found by the
    # scheduling conformance suite: prefill_first, length_aware, three branches)
    pool, states = make()
    states.admit(3, num_branches=3)
    states.fork(3, 4)
    states.fork(3, 5)
    free_before = pool.num_free()
    states.release(4)
    states.release(5)
    assert pool.num_free() == free_before and states.num_blocks_held == 12  # two spares again
    states.fork(3, 4)
    states.fork(3, 5)
    states.release(3)  # the first sequence goes last but one: its family's spares with it
    states.release(4)
    states.release(5)
    assert pool.num_free() == 20 and states.num_blocks_held == 0


def test_a_swapped_family_takes_back_exactly_what_it_held():
    pool, states = make()
    states.admit(1, num_branches=2)
    states.fork(1, 2)
    states.swap_out([2, 1])  # a branch before its first sequence: nothing becomes a spare
    assert pool.num_free() == 20
    states.swap_in([1, 2])
    assert states.num_blocks_held == 8
    states.release(1)
    states.release(2)
    assert pool.num_free() == 20
