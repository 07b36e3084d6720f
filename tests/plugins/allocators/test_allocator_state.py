"""Per-request state (linear-attention layers) in every allocator that holds it: the conformance
suite on state-holding configurations (the ledger's state part is one state per live sequence, a
fan-out reserves one per branch, a swap moves it, freeing everything gives back the empty cache),
and the exact bytes each allocator sets aside for a state."""

from __future__ import annotations

import pytest
from kvbench_plugins.allocators.hybrid_paged import HybridPagedAllocator
from kvbench_plugins.allocators.naive import NaiveAllocator, NaiveConfig
from kvbench_plugins.allocators.paged import PagedConfig
from kvbench_plugins.allocators.per_request import PerRequestAllocator, PerRequestConfig

from kvbench.errors import ConfigError
from kvbench.memory.allocator import SeqShape
from kvbench.specs.kv_groups import FULL, STATE, WINDOW, KVGroup
from kvbench.testing.allocators import AllocatorConformance, check_invariants, check_ledger

#: a state as large as this many tokens' KV, plus a few bytes (so it never fills its last unit)
STATE_TOKENS = (1, 23, 130)


def state_bytes(kv_bytes_per_token: int, tokens: int) -> int:
    return tokens * kv_bytes_per_token + 3


class TestNaiveWithStateConformance(AllocatorConformance):
    @pytest.fixture(params=[(256, t) for t in STATE_TOKENS], ids=lambda p: f"smax{p[0]}-state{p[1]}")
    def allocator_factory(self, request):
        s_max, tokens = request.param
        return lambda budget_bytes, kv: NaiveAllocator(
            NaiveConfig(s_max),
            budget_bytes=budget_bytes,
            kv_bytes_per_token=kv,
            state_bytes_per_request=state_bytes(kv, tokens),
        )


class TestPerRequestWithStateConformance(AllocatorConformance):
    @pytest.fixture(
        params=[("first_fit", "oracle", 16, 23), ("best_fit", "pow2", 1, 130), ("buddy", "pow2", 16, 23)],
        ids=lambda p: "-".join(map(str, p)),
    )
    def allocator_factory(self, request):
        placement, reserve, granule, tokens = request.param
        config = PerRequestConfig(reserve=reserve, placement=placement, granule_tokens=granule)
        return lambda budget_bytes, kv: PerRequestAllocator(
            config, budget_bytes=budget_bytes, kv_bytes_per_token=kv, state_bytes_per_request=state_bytes(kv, tokens)
        )


#: Qwen3.5-like (three state groups per full one), and a window model with a state group
STATE_LAYOUTS = {
    "full_and_three_states": lambda state: (KVGroup(FULL, 1), *[KVGroup(STATE, 1, state_bytes=state)] * 3),
    "full_window_state": lambda state: (KVGroup(FULL, 1), KVGroup(WINDOW, 1, 24), KVGroup(STATE, 1, state_bytes=state)),
}


class TestHybridWithStateConformance(AllocatorConformance):
    max_examples = 40

    @pytest.fixture(
        params=[(name, size, t) for name in STATE_LAYOUTS for size in (8, 16) for t in (1, 23)],
        ids=lambda p: "-".join(map(str, p)),
    )
    def allocator_factory(self, request):
        name, size, tokens = request.param

        def make(budget_bytes, kv):
            groups = STATE_LAYOUTS[name](state_bytes(kv, tokens))
            num_token_groups = sum(g.kind != STATE for g in groups)
            return HybridPagedAllocator(
                PagedConfig(size), budget_bytes=budget_bytes, kv_bytes_per_token=num_token_groups * kv, kv_groups=groups
            )

        return make


def test_naive_slot_holds_s_max_tokens_and_the_state():
    alloc = NaiveAllocator(NaiveConfig(100), budget_bytes=1000 * 10, kv_bytes_per_token=10, state_bytes_per_request=95)
    assert alloc.state_slots == 10  # 95 bytes in 10-byte slots
    assert alloc.slot_bytes == 110 * 10 and alloc.num_slots == 9
    assert alloc.allocate(1, SeqShape(5, 100, 50)) == 0
    led = check_ledger(alloc)
    assert (led.token_bytes, led.state_bytes) == (50, 95)
    assert led.reserved_future_bytes == 45 * 10
    assert led.internal_bytes == 50 * 10 + 5  # the slot's tail past the final length, and the state's rounding
    alloc.free(1)
    assert check_ledger(alloc).state_bytes == 0


def test_a_state_that_does_not_fit_refuses_the_request_all_or_nothing():
    # room for 3 ranges of 16 KV granules without state, 2 with a state of 8 granules each
    alloc = PerRequestAllocator(
        PerRequestConfig(reserve="oracle", granule_tokens=1),
        budget_bytes=50,
        kv_bytes_per_token=1,
        state_bytes_per_request=8,
    )
    shape = SeqShape(10, 16, 15)
    assert alloc.allocate(1, shape) == 0 and alloc.allocate(2, shape) == 0
    before = alloc.ledger()
    assert alloc.allocate(3, shape) is None
    assert alloc.ledger() == before and before.state_bytes == 16
    assert not alloc.can_allocate(shape)


def test_a_fan_out_reserves_a_state_per_branch_and_a_fork_copies_it():
    alloc = PerRequestAllocator(
        PerRequestConfig(reserve="oracle", granule_tokens=1),
        budget_bytes=1000,
        kv_bytes_per_token=2,
        state_bytes_per_request=41,
    )
    assert alloc.allocate(1, SeqShape(10, 30, 20, num_branches=3)) == 0
    led = check_ledger(alloc)
    assert led.state_bytes == 41 and led.reserved_future_bytes >= 2 * 41  # two spares reserved
    alloc.fork(1, 2)
    [copy] = alloc.drain_copies()
    assert copy.num_bytes == 10 * 2 + 41  # the prompt's KV and the state
    assert check_ledger(alloc).state_bytes == 2 * 41
    check_invariants(alloc, {1: 10, 2: 10}, {1: 20, 2: 20}, tables_cover_allocation=False)
    alloc.free(1)  # the family's last spare goes with it
    assert check_ledger(alloc).state_bytes == 41 and alloc.state_held_bytes() == 21 * 2


def test_hybrid_states_take_whole_blocks_per_state_group():
    # blocks of 8 tokens x 10 bytes: a 95-byte state takes 2 blocks, three state groups 6 per sequence
    groups = (KVGroup(FULL, 1), *[KVGroup(STATE, 1, state_bytes=95)] * 3)
    alloc = HybridPagedAllocator(PagedConfig(8), budget_bytes=8 * 10 * 40, kv_bytes_per_token=10, kv_groups=groups)
    assert alloc.state_bytes_per_request == 3 * 95 and alloc.states.blocks_per_state == 3 * 2
    assert alloc.allocate(1, SeqShape(9, 40, 30)) == 0
    led = check_ledger(alloc)
    assert led.state_bytes == 285
    assert dict(led.group_bytes) == {"full_group_bytes": 2 * 80, "state_group_bytes": 6 * 80}
    swapped = alloc.swap_out([1])
    assert swapped.num_bytes == 2 * 80 + 285 and check_ledger(alloc).allocated_bytes == 0
    assert alloc.swap_in([1]) == swapped
    assert alloc.ledger() == led


def test_hybrid_refuses_a_prefix_cache_for_a_model_with_state():
    groups = (KVGroup(FULL, 1), KVGroup(STATE, 1, state_bytes=10))
    with pytest.raises(ConfigError, match="prefix_caching"):
        HybridPagedAllocator(
            PagedConfig(8, prefix_caching=True), budget_bytes=10_000, kv_bytes_per_token=1, kv_groups=groups
        )
