"""PerRequestAllocator: contiguous request-sized ranges, holes, buddy blocks, observed fragmentation."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from kvbench_plugins.allocators.per_request import PerRequestAllocator, PerRequestConfig
from omegaconf import OmegaConf

from kvbench.app.config import plugin_config
from kvbench.errors import ConfigError
from kvbench.memory.allocator import Refusal, SeqShape
from kvbench.testing.allocators import AllocatorConformance

CONF_DIR = Path(__file__).resolve().parents[3] / "conf" / "allocator"


def make(budget_granules: int, placement: str = "first_fit", reserve: str = "oracle") -> PerRequestAllocator:
    """Granules of 16 tokens at 1 byte per token, so bytes == tokens."""
    return PerRequestAllocator(
        PerRequestConfig(reserve=reserve, placement=placement, granule_tokens=16),
        budget_bytes=budget_granules * 16,
        kv_bytes_per_token=1,
    )


def granules(n: int) -> SeqShape:
    """A request whose oracle reservation is exactly ``n`` granules (prompt + output == 16 n)."""
    return SeqShape(num_tokens=8, s_max_tokens=16 * n, final_kv_tokens=16 * n - 1)


@pytest.mark.parametrize("placement", ["first_fit", "best_fit"])
def test_refusal_with_enough_free_bytes_is_observed_as_fragmentation(placement):
    alloc = make(6, placement)
    for seq_id in (1, 2, 3):  # A, B, C: two granules each
        assert alloc.allocate(seq_id, granules(2)) == 0
    alloc.free(1)
    alloc.free(3)  # two holes of 2 granules, separated by B
    d = granules(3)
    assert alloc.unallocated_bytes() == 64 >= alloc.reservation_tokens(d) == 48
    assert alloc.largest_hole_bytes() == 32
    led = alloc.ledger(next_shape=d)
    assert alloc.allocate(4, d) is None
    assert alloc.refusal_reason(d) is Refusal.FRAGMENTED
    assert alloc.ledger(next_shape=d) == led  # a refusal changes nothing
    assert (led.external_bytes, led.free_bytes) == (64, 0)  # both holes are too small for D
    assert alloc.ledger().free_bytes == 64  # ... but free for whoever fits
    alloc.free(2)  # B's range merges with both holes
    assert alloc.largest_hole_bytes() == 96
    assert alloc.allocate(4, d) == 0 and alloc.block_table(4) == [0, 1, 2]


def test_refusal_for_lack_of_bytes_is_not_fragmentation():
    alloc = make(4)
    assert alloc.allocate(1, granules(3)) == 0
    assert alloc.allocate(2, granules(2)) is None
    assert alloc.refusal_reason(granules(2)) is Refusal.NO_MEMORY


def test_reserves_the_whole_future_so_the_watermark_does_not_apply():
    alloc = make(4)
    assert alloc.allocate(1, granules(2), keep_free_bytes=10**9) == 0
    caps = PerRequestAllocator.capabilities
    assert caps.reserves_future and caps.contiguous_layout and not caps.shares_blocks


@pytest.mark.parametrize(
    ("reserve", "placement", "tokens"),
    [
        ("declared", "first_fit", 1008),  # S_max 1000 rounded up to 63 granules
        ("pow2", "first_fit", 176),  # prompt 100 + output 50 -> 64: 164 tokens, 11 granules
        ("oracle", "first_fit", 160),  # 150 rounded up to 10 granules
        ("oracle", "buddy", 256),  # 10 granules -> a 16-granule buddy block
        ("declared", "buddy", 1024),
    ],
)
def test_reservation_policies(reserve, placement, tokens):
    alloc = make(128, placement, reserve)
    shape = SeqShape(num_tokens=100, s_max_tokens=1000, final_kv_tokens=149)
    assert alloc.reservation_tokens(shape) == tokens
    assert alloc.allocate(1, shape) == 0
    assert len(alloc.block_table(1)) * 16 == tokens
    # final_kv_tokens (149) will be filled; the rest, rounding and the slot of the last emitted
    # token (never fed back), is internal
    assert alloc.ledger().internal_bytes == tokens - 149


def test_pow2_rounds_the_output_only_and_keeps_an_exact_power_of_two():
    alloc = make(128, reserve="pow2")
    # the vLLM paper's Orca (Pow2): a true output of 25 tokens reserves 32, the prompt as it is
    assert alloc.reservation_tokens(SeqShape(7, 999, 7 + 25 - 1)) == 48  # 7 + 32 = 39 -> 3 granules
    assert alloc.reservation_tokens(SeqShape(16, 999, 16 + 64 - 1)) == 80  # 16 + 64, exactly 5 granules
    # a chunk or a recompute allocates more than the prompt; the reservation follows the prompt
    assert alloc.reservation_tokens(SeqShape(4, 999, 16 + 64 - 1, prompt_tokens=16)) == 80


def test_best_fit_takes_the_smallest_hole_first_fit_the_first():
    placed = {}
    for placement in ("first_fit", "best_fit"):
        alloc = make(10, placement)
        for seq_id, n in enumerate((3, 1, 2, 4)):
            assert alloc.allocate(seq_id, granules(n)) == 0
        alloc.free(0)  # hole of 3 at granule 0
        alloc.free(2)  # hole of 2 at granule 4
        assert alloc.allocate(9, granules(2)) == 0
        placed[placement] = alloc.block_table(9)
    assert placed == {"first_fit": [0, 1], "best_fit": [4, 5]}


def test_freeing_in_any_order_coalesces_back_to_one_hole():
    for order in itertools.permutations(range(4)):
        alloc = make(9)
        for seq_id in range(4):
            assert alloc.allocate(seq_id, granules(2)) == 0
        for seq_id in order:
            alloc.free(seq_id)
        assert alloc.largest_hole_bytes() == 9 * 16


def test_buddy_covers_the_budget_with_top_level_blocks_that_never_merge_across():
    alloc = make(12, "buddy")  # 12 granules: top-level blocks of 8 (granules 0-7) and 4 (8-11)
    assert alloc.num_granules == 12 and alloc.ledger().external_bytes == 0
    assert alloc.largest_hole_bytes() == 8 * 16
    tables = []
    for seq_id in range(4):  # a 2-granule request splits the smallest block that holds it
        assert alloc.allocate(seq_id, granules(2)) == 0
        tables.append(alloc.block_table(seq_id))
    assert tables == [[8, 9], [10, 11], [0, 1], [2, 3]]
    assert alloc.largest_hole_bytes() == 4 * 16  # granules 4-7
    alloc.free(0)
    alloc.free(1)
    # 8-11 merged back into its top-level block, which never merges with 0-7: 8 granules are free
    # but no hole holds an 8-granule request
    assert alloc.largest_hole_bytes() == 4 * 16
    assert alloc.allocate(9, granules(8)) is None
    assert alloc.refusal_reason(granules(8)) is Refusal.FRAGMENTED
    alloc.free(2)
    alloc.free(3)
    assert alloc.largest_hole_bytes() == 8 * 16


def test_orca_max_on_opt_13b_with_12_gib_holds_7_and_leaves_8_85_percent_unusable():
    # the vLLM paper's setting: 12 GiB of KV, 800 KiB per token, 15,728 token slots in 983 granules
    # of 16; Orca (Max) reserves S_max = 2,048 tokens (128 granules, a power of two already)
    kv = 819_200
    alloc = PerRequestAllocator(
        PerRequestConfig("declared", "buddy", 16), budget_bytes=12 * 2**30, kv_bytes_per_token=kv
    )
    shape = SeqShape(161, 2048, 161 + 338 - 1)
    admitted = 0
    while alloc.allocate(admitted, shape) is not None:
        admitted += 1
    assert admitted == 7  # 983 = 512 + 256 + 128 + 64 + 16 + 4 + 2 + 1: 4 + 2 + 1 blocks of 128
    led = alloc.ledger(next_shape=shape)
    assert led.external_bytes == 87 * 16 * kv + (12 * 2**30 - 983 * 16 * kv)  # 64 + 16 + 4 + 2 + 1 granules
    assert led.external_bytes / led.budget_bytes == pytest.approx(0.0885, abs=5e-5)


def test_append_fills_the_reservation_and_no_further():
    alloc = make(4)
    assert alloc.allocate(1, SeqShape(30, 40, 31)) == 0  # oracle: 32 tokens
    led = alloc.ledger()
    assert (led.token_bytes, led.reserved_future_bytes, led.internal_bytes) == (30, 1, 1)
    assert alloc.append(1) and alloc.append(1)
    led = alloc.ledger()
    assert not alloc.append(1)
    assert alloc.ledger() == led


def test_a_fan_out_reserves_a_range_per_branch_and_fork_copies_into_it():
    alloc = make(12)
    assert alloc.allocate(1, SeqShape(20, 100, 60, num_branches=4)) is None  # 4 x 4 granules > 12
    assert alloc.allocate(1, SeqShape(20, 100, 60, num_branches=3)) == 0  # oracle: 61 -> 4 granules each
    assert alloc.ledger().free_bytes == 0  # every branch's range is reserved at admission
    assert alloc.block_table(1) == [0, 1, 2, 3]
    alloc.fork(1, 2, child_final_kv_tokens=40)
    assert alloc.block_table(2) == [4, 5, 6, 7] and alloc.num_tokens(2) == 20
    assert alloc.ledger().token_bytes == 40  # copied, not shared
    [copy] = alloc.drain_copies()
    assert copy.num_bytes == 20 and copy.dst_block_id == 4


def test_a_declared_s_max_larger_than_the_cache_is_never_admissible():
    alloc = make(8, reserve="declared")
    assert alloc.max_sequence_tokens(SeqShape(10, 129, 20)) == 0
    assert alloc.max_sequence_tokens(SeqShape(10, 128, 20)) == 128


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("reserve", "max", "declared, pow2, oracle"),
        ("placement", "worst_fit", "first_fit, best_fit, buddy"),
        ("granule_tokens", 12, "power of two"),
        ("granule_tokens", 0, "power of two"),
    ],
)
def test_invalid_config_names_key_value_and_choices(key, value, allowed):
    with pytest.raises(ConfigError, match=rf"allocator\.{key}={value!r} is invalid: .*{allowed}"):
        PerRequestConfig(**{key: value}).validate()


@pytest.mark.parametrize(
    ("preset", "reserve"), [("orca_max", "declared"), ("orca_pow2", "pow2"), ("orca_oracle", "oracle")]
)
def test_orca_presets_are_buddy_per_request(preset, reserve):
    node = OmegaConf.load(CONF_DIR / f"{preset}.yaml")
    assert node.name == "per_request"
    assert plugin_config(PerRequestAllocator, node, "allocator") == PerRequestConfig(reserve=reserve, placement="buddy")


class TestPerRequestConformance(AllocatorConformance):
    @pytest.fixture(
        params=[
            *itertools.product(("first_fit", "best_fit", "buddy"), ("declared", "pow2", "oracle"), (16,)),
            ("first_fit", "oracle", 1),
            ("buddy", "pow2", 64),
        ],
        ids=lambda p: "-".join(map(str, p)),
    )
    def allocator_factory(self, request):
        placement, reserve, granule_tokens = request.param
        config = PerRequestConfig(reserve=reserve, placement=placement, granule_tokens=granule_tokens)
        return lambda budget_bytes, kv_bytes_per_token: PerRequestAllocator(
            config, budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token
        )
