"""NaiveAllocator: reserve-to-S_max slots (lecture section 10.2)."""

from __future__ import annotations

import pytest
from kvbench_plugins.allocators.naive import NaiveAllocator, NaiveConfig

from kvbench.app.config import plugin_config
from kvbench.errors import ConfigError
from kvbench.memory.allocator import Refusal, SeqShape
from kvbench.testing.allocators import AllocatorConformance

LLAMA2_7B_KV_BYTES_PER_TOKEN = 524_288
H100_KV_BUDGET_BYTES = 62_500_000_000


def make(s_max_tokens: int = 64, budget_tokens: int = 256) -> NaiveAllocator:
    return NaiveAllocator(NaiveConfig(s_max_tokens), budget_bytes=budget_tokens, kv_bytes_per_token=1)


def lecture_allocator(s_max_tokens: int) -> NaiveAllocator:
    return NaiveAllocator(
        NaiveConfig(s_max_tokens), budget_bytes=H100_KV_BUDGET_BYTES, kv_bytes_per_token=LLAMA2_7B_KV_BYTES_PER_TOKEN
    )


@pytest.mark.parametrize(("s_max_tokens", "num_slots"), [(4096, 29), (32768, 3)])
def test_lecture_slot_counts(s_max_tokens, num_slots):
    alloc = lecture_allocator(s_max_tokens)
    assert alloc.num_slots == num_slots
    slot_bytes = s_max_tokens * LLAMA2_7B_KV_BYTES_PER_TOKEN
    led = alloc.ledger()
    assert led.free_bytes == num_slots * slot_bytes
    assert led.external_bytes == H100_KV_BUDGET_BYTES - num_slots * slot_bytes  # free but unusable


def test_lecture_640_token_chats_waste_84_percent_internally():
    alloc = lecture_allocator(4096)
    shape = SeqShape(640, 4096, 640)
    seq_id = 0
    while alloc.allocate(seq_id, shape) is not None:
        seq_id += 1
    assert seq_id == 29
    led = alloc.ledger()
    assert led.internal_bytes == 29 * (4096 - 640) * LLAMA2_7B_KV_BYTES_PER_TOKEN
    assert round(led.internal_bytes / led.budget_bytes, 2) == 0.84
    assert round(led.token_bytes / led.budget_bytes, 3) == 0.156


def test_one_slot_per_sequence_with_a_one_entry_block_table():
    alloc = make()
    assert alloc.block_size_tokens == 64
    assert alloc.allocate(7, SeqShape(10, 64, 30)) == 0
    assert alloc.block_table(7) == [0]
    led = alloc.ledger()
    assert (led.token_bytes, led.reserved_future_bytes, led.internal_bytes, led.free_bytes) == (10, 20, 34, 192)
    assert alloc.append(7)
    assert alloc.ledger().reserved_future_bytes == 19


def test_refuses_when_all_slots_are_taken_and_admits_after_a_free():
    alloc = make()
    for seq_id in range(4):
        assert alloc.allocate(seq_id, SeqShape(1, 64, 1)) == 0
    assert alloc.allocate(4, SeqShape(1, 64, 1)) is None
    assert alloc.refusal_reason(SeqShape(1, 64, 1)) is Refusal.NO_MEMORY  # uniform slots never fragment
    alloc.free(2)
    assert alloc.allocate(4, SeqShape(1, 64, 1)) == 0
    assert alloc.block_table(4) == [2]


def test_a_sequence_cannot_outgrow_its_slot():
    alloc = make()
    assert alloc.max_sequence_tokens(SeqShape(1, 10_000, 5000)) == 64
    assert alloc.allocate(1, SeqShape(65, 100, 80)) is None
    assert alloc.allocate(1, SeqShape(63, 64, 63)) == 0
    assert alloc.append(1)
    led = alloc.ledger()
    assert not alloc.append(1)
    assert alloc.ledger() == led and alloc.num_tokens(1) == 64


def test_watermark_is_ignored_because_the_whole_future_is_reserved():
    alloc = make()
    assert alloc.allocate(1, SeqShape(10, 64, 30), keep_free_bytes=10**9) == 0
    caps = NaiveAllocator.capabilities
    assert caps.reserves_future and caps.contiguous_layout and not caps.shares_blocks


def test_a_fan_out_reserves_a_slot_per_branch_and_fork_copies_into_it():
    alloc = make(budget_tokens=128)
    assert alloc.allocate(1, SeqShape(10, 64, 30, num_branches=3)) is None  # 3 slots do not fit 2
    assert alloc.allocate(1, SeqShape(10, 64, 30, num_branches=2)) == 0
    assert alloc.ledger().free_bytes == 0  # the branch's slot is reserved at admission
    assert alloc.ledger().reserved_future_bytes == 20 + 30
    alloc.fork(1, 2, child_final_kv_tokens=40)
    assert alloc.block_table(2) == [1] and alloc.num_tokens(2) == 10
    [copy] = alloc.drain_copies()
    assert (copy.src_block_id, copy.dst_block_id, copy.num_bytes) == (0, 1, 10)  # the parent's tokens
    assert alloc.ledger().token_bytes == 20  # copied, not shared
    assert alloc.ledger().reserved_future_bytes == 20 + 30
    with pytest.raises(RuntimeError, match="reserved no branch"):
        alloc.fork(1, 3)


def test_budget_below_one_slot_holds_nothing():
    alloc = make(budget_tokens=63)
    assert alloc.num_slots == 0 and alloc.max_sequence_tokens(SeqShape(1, 2, 1)) == 0
    assert alloc.ledger().external_bytes == 63


@pytest.mark.parametrize("bad", [0, -1])
def test_invalid_s_max_names_the_key(bad):
    with pytest.raises(ConfigError, match=r"allocator\.s_max_tokens=.* is invalid"):
        NaiveConfig(bad).validate()
    with pytest.raises(ConfigError, match="s_max_tokens"):
        plugin_config(NaiveAllocator, {"name": "naive", "s_max_tokens": bad}, "allocator")


class TestNaiveConformance(AllocatorConformance):
    @pytest.fixture(params=[64, 256], ids=lambda s: f"smax{s}")
    def allocator_factory(self, request):
        return lambda budget_bytes, kv_bytes_per_token: NaiveAllocator(
            NaiveConfig(request.param), budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token
        )


def test_a_huge_budget_of_tiny_slots_costs_memory_for_slots_used():
    import tracemalloc

    tracemalloc.start()
    alloc = make(s_max_tokens=64, budget_tokens=64 * 10**12)  # 10^12 slots
    assert alloc.allocate(1, SeqShape(10, 20, 64)) == 0
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak_bytes < 1_000_000 and alloc.ledger().free_bytes == (10**12 - 1) * 64
