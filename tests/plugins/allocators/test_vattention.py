"""VAttentionAllocator: virtually contiguous ranges backed by page groups mapped on demand."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvbench_plugins.allocators.vattention import (
    KIB,
    MIB,
    PageGeometry,
    VAttentionAllocator,
    VAttentionConfig,
)
from omegaconf import OmegaConf

from kvbench.app.config import plugin_config
from kvbench.errors import ConfigError
from kvbench.memory.allocator import Refusal, SeqShape
from kvbench.specs.model import ModelConfig, model_spec
from kvbench.testing.allocators import AllocatorConformance, check_ledger

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"


def tiny(budget_bytes: int, kv_bytes_per_token: int, tokens_per_page: int, **options) -> VAttentionAllocator:
    """Pages of ``tokens_per_page`` tokens, one buffer (what the conformance suite's byte sizes allow)."""
    geometry = PageGeometry(
        tokens_per_page * kv_bytes_per_token, 1, tokens_per_page, tokens_per_page * kv_bytes_per_token
    )
    return VAttentionAllocator(
        VAttentionConfig(num_layers=1, **options),
        budget_bytes=budget_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        geometry=geometry,
    )


class TestVAttentionConformance(AllocatorConformance):
    @pytest.fixture(params=[1, 8, 16])
    def allocator_factory(self, request):
        return lambda budget_bytes, kv_bytes_per_token: tiny(budget_bytes, kv_bytes_per_token, request.param)


def llama2_7b() -> int:
    """Llama-2-7B's KV bytes per token, from its config file."""
    node = OmegaConf.load(CONF_DIR / "model" / "llama2-7b.yaml")
    return model_spec(ModelConfig(**OmegaConf.to_container(node))).kv_bytes_per_token


def test_llama2_7b_pages_hold_256_tokens_at_2_mib_and_8_at_64_kib():
    kv = llama2_7b()
    per_buffer_bytes = kv // (2 * 32)  # one layer's K (or V) of one token
    assert per_buffer_bytes == 4096 * 2  # 32 heads x 128 dims x 2 bytes
    for page_size, expected in ((2 * MIB, 256), (256 * KIB, 32), (64 * KIB, 8)):
        geometry = PageGeometry.of(page_size, kv, 32)
        assert geometry.tokens_per_page == page_size // per_buffer_bytes == expected
        assert geometry.group_bytes == page_size * 64 == expected * kv


@pytest.mark.parametrize("page_size", [64 * KIB, 2 * MIB])
def test_page_counts_and_fragmentation_by_hand(page_size):
    """1000 tokens of Llama-2-7B: 2 MiB pages -> 4 groups of 256 (24 slots of tail, per buffer),
    64 KiB pages -> 125 groups of 8 (no tail)."""
    kv = llama2_7b()
    alloc = VAttentionAllocator(
        VAttentionConfig(page_size_bytes=page_size, num_layers=32), budget_bytes=10 * 2**30, kv_bytes_per_token=kv
    )
    tokens_per_page = page_size // 8192
    assert alloc.allocate(1, SeqShape(1000, 4096, 1000)) == 0  # prompt 1000, output 1: finished at 1000
    groups = -(-1000 // tokens_per_page)
    assert groups == (4 if page_size == 2 * MIB else 125)
    led = check_ledger(alloc)
    physical_bytes = groups * page_size * 64
    assert led.allocated_bytes == physical_bytes
    assert led.token_bytes == 1000 * kv
    assert led.internal_bytes == physical_bytes - 1000 * kv == (24 * kv if page_size == 2 * MIB else 0)
    assert alloc.block_table(1) == list(range(groups))  # consecutive virtual pages
    mapping = alloc.drain_page_mapping()
    assert mapping.num_pages == groups * 64  # every layer's K and V page
    assert alloc.drain_page_mapping().num_pages == 0


def test_ledger_accounts_for_every_byte_with_a_remainder():
    kv = llama2_7b()
    budget = 3 * 2 * MIB * 64 + 12345  # three groups and a bit
    alloc = VAttentionAllocator(VAttentionConfig(num_layers=32), budget_bytes=budget, kv_bytes_per_token=kv)
    assert alloc.num_groups == 3
    assert alloc.ledger().external_bytes == 12345
    assert alloc.allocate(1, SeqShape(300, 4096, 600)) == 0  # 2 groups, 212 slots of future
    led = check_ledger(alloc)
    assert led.reserved_future_bytes == (512 - 300) * kv and led.internal_bytes == 0
    assert led.free_bytes == 2 * MIB * 64
    assert alloc.allocate(2, SeqShape(300, 4096, 600)) is None  # needs 2 groups, 1 free
    assert alloc.refusal_reason(SeqShape(300, 4096, 600)) is Refusal.NO_MEMORY
    alloc.free(1)
    assert check_ledger(alloc).free_bytes == 3 * 2 * MIB * 64


def test_growth_maps_a_group_per_page_crossed_and_reuses_freed_ones():
    alloc = tiny(10 * 8, 1, 8)  # 10 groups of 8 tokens
    assert alloc.allocate(1, SeqShape(8, 100, 80)) == 0
    assert alloc.drain_page_mapping().num_pages == 1
    assert alloc.append(1, 1)  # token 9: a second group
    assert alloc.append(1, 7)  # fills it: no new group
    assert alloc.drain_page_mapping().num_pages == 1
    alloc.free(1)
    assert alloc.allocate(2, SeqShape(80, 100, 80)) == 0  # every group, two of them mapped before
    assert alloc.num_groups_mapped == 12
    assert alloc.allocate(3, SeqShape(1, 100, 80)) is None


def test_a_sequence_never_outgrows_its_virtual_range():
    alloc = tiny(1000, 1, 8)
    assert alloc.allocate(1, SeqShape(10, 20, 19)) == 0  # S_max 20 -> a range of 3 pages, 24 tokens
    assert alloc.max_sequence_tokens(SeqShape(10, 20, 19)) == 24
    assert alloc.append(1, 14)
    assert not alloc.append(1, 1)
    capped = tiny(1000, 1, 8, max_model_len_tokens=16)
    assert not capped.fits_in_empty(SeqShape(10, 20, 19))
    assert capped.allocate(1, SeqShape(17, 20, 19)) is None


def test_a_fan_out_maps_whole_ranges_and_fork_copies_into_them():
    alloc = tiny(100 * 8, 1, 8)
    assert alloc.allocate(1, SeqShape(5, 200, 100, num_branches=3)) == 0
    assert alloc.ledger().allocated_bytes == 3 * 25 * 8  # S_max 200 = 25 pages, for each of 3 branches
    assert alloc.drain_page_mapping().num_pages == 75
    assert alloc.append(1, 12)  # the prompt grows to 17 tokens within its mapped range
    alloc.fork(1, 2)
    (copy,) = alloc.drain_copies()
    assert copy.num_bytes == 17 and copy.num_blocks == 3
    assert alloc.drain_page_mapping().num_pages == 0  # a fork maps nothing
    assert alloc.num_tokens(2) == 17 and set(alloc.block_table(2)).isdisjoint(alloc.block_table(1))
    alloc.free(1)  # the third branch was never forked: its range goes with the request's first sequence
    assert alloc.ledger().allocated_bytes == 25 * 8


def test_map_ahead_is_priced_overlapped_and_on_demand_on_the_critical_path():
    for map_ahead in (True, False):
        alloc = tiny(100, 1, 10, map_ahead=map_ahead, page_map_latency_s=0.5)
        alloc.allocate(1, SeqShape(25, 100, 80))
        mapping = alloc.drain_page_mapping()
        assert mapping.num_pages == 3 and mapping.map_s == pytest.approx(1.5)
        assert mapping.overlapped is map_ahead


def test_bad_page_size_is_one_config_error_naming_the_choices():
    node = OmegaConf.create({"name": "vattention", "page_size_bytes": 4096, "num_layers": 32})
    with pytest.raises(ConfigError, match=r"allocator\.page_size_bytes=4096 is invalid: choose one of 65536"):
        plugin_config(VAttentionAllocator, node, "allocator")


def test_config_file_takes_the_models_layers():
    node = OmegaConf.load(CONF_DIR / "allocator" / "vattention.yaml")
    cfg = OmegaConf.create({"model": OmegaConf.load(CONF_DIR / "model" / "llama2-7b.yaml"), "allocator": node})
    config = plugin_config(VAttentionAllocator, cfg.allocator, "allocator")
    assert config.num_layers == 32 and config.page_size_bytes == 2 * MIB and config.map_ahead is True


@settings(max_examples=80, deadline=None)
@given(
    tokens_per_page=st.sampled_from([1, 4, 8]),
    num_groups=st.integers(0, 40),
    ops=st.lists(
        st.tuples(st.sampled_from(["allocate", "append", "free", "truncate"]), st.integers(0, 9), st.integers(1, 30)),
        max_size=60,
    ),
)
def test_no_group_is_leaked_or_freed_twice(tokens_per_page, num_groups, ops):
    """Free + held groups are always the pool; held groups are exactly the live tables' pages;
    freeing everything gives every group back."""
    alloc = tiny(num_groups * tokens_per_page, 1, tokens_per_page)
    live: dict[int, int] = {}
    next_id = 0
    for kind, which, n in ops:
        if kind == "allocate":
            if alloc.allocate(next_id, SeqShape(n, 200, n + 20)) is not None:
                live[next_id] = n
            next_id += 1
            continue
        if not live:
            continue
        seq_id = sorted(live)[which % len(live)]
        if kind == "append" and alloc.append(seq_id, n):
            live[seq_id] += n
        elif kind == "truncate":
            keep = max(0, live[seq_id] - n)
            alloc.truncate(seq_id, keep)
            live[seq_id] = keep
        elif kind == "free":
            alloc.free(seq_id)
            del live[seq_id]
            with pytest.raises(KeyError):
                alloc.free(seq_id)
        held = sum(len(alloc.block_table(s)) for s in live)
        assert held == sum(-(-t // tokens_per_page) for t in live.values())
        assert alloc.ledger().free_bytes == (num_groups - held) * tokens_per_page
        assert check_ledger(alloc).total_bytes == alloc.budget_bytes
    for seq_id in live:
        alloc.free(seq_id)
    assert alloc.ledger().free_bytes == num_groups * tokens_per_page


def _run(*overrides: str):
    from kvbench.api import run

    return run([*overrides, "workload.num_requests=60", "output.write=false", "progress=false"])


@pytest.mark.parametrize("map_ahead", ["true", "false"])
def test_a_run_taken_step_by_step_equals_the_event_driven_one(map_ahead):
    options = ("allocator=vattention", "allocator.page_size_bytes=65536", f"allocator.map_ahead={map_ahead}")
    fast, slow = _run(*options), _run(*options, "event_driven=false")
    keys = ("duration_s", "pages_mapped", "page_map_s", "page_map_added_s", "ttft_p99_s", "tpot_p50_s")
    assert [fast.summary[k] for k in keys] == pytest.approx([slow.summary[k] for k in keys], rel=1e-9)
    assert fast.summary["pages_mapped"] > 0


def test_every_request_finishes_with_its_output_as_with_paged_and_mapping_costs_time():
    paged, ahead = _run("allocator=paged"), _run("allocator=vattention")
    on_demand = _run("allocator=vattention", "allocator.map_ahead=false")
    for result in (ahead, on_demand):
        assert result.summary["num_finished"] == paged.summary["num_finished"] == 60
        assert (result.requests["output_tokens"].to_numpy() == paged.requests["output_tokens"].to_numpy()).all()
    assert "pages_mapped" not in paged.summary and "pages_mapped" not in paged.steps  # no new columns for others
    assert on_demand.summary["page_map_added_s"] == pytest.approx(on_demand.summary["page_map_s"])
    assert 0 <= ahead.summary["page_map_added_s"] < on_demand.summary["page_map_added_s"]
    assert ahead.summary["pages_mapped"] == on_demand.summary["pages_mapped"]
