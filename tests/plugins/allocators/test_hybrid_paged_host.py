"""hybrid_paged with a host tier for evicted prefix blocks: keys of every group move to host memory
as the GPU evicts them, a longer hit that every group can serve is reloaded and pinned, the host
ledger accounts for every byte, and whole runs of a sliding-window model finish every request."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
from kvbench_plugins.allocators.hybrid_paged import HybridPagedAllocator

from kvbench.errors import ConfigError
from kvbench.memory.allocator import SeqShape
from kvbench.memory.paged_config import PagedConfig
from kvbench.specs.kv_groups import FULL, WINDOW, KVGroup
from kvbench.testing.allocators import CachingAllocatorConformance, check_cache, check_ledger, prefix_hashes
from kvbench.testing.cache_checks import check_host_tier

B = 4
GROUPS = (KVGroup(FULL, 1), KVGroup(WINDOW, 1, 8))  # one full group, one window of two blocks


def make(budget_blocks: int, host_blocks: int) -> HybridPagedAllocator:
    """Blocks of ``B`` tokens of one byte each (a slot is one group's byte)."""
    config = PagedConfig(B, prefix_caching=True, host_cache_bytes=host_blocks * B)
    return HybridPagedAllocator(config, budget_bytes=budget_blocks * B, kv_bytes_per_token=2, kv_groups=GROUPS)


def shape(prompt: int, prefix: int, request: int) -> SeqShape:
    hashes = prefix_hashes(prompt, B, 1000, prefix, request)
    return SeqShape(prompt, 2 * prompt, prompt + 1, 1, prompt, hashes, B)


def test_evicted_blocks_go_to_host_and_a_longer_hit_comes_back_pinned():
    alloc = make(budget_blocks=16, host_blocks=8)
    a = shape(17, 0, 0)  # 4 full blocks: the full group holds 5, the window group its last 3
    assert alloc.allocate(1, a) == 0
    alloc.free(1)
    assert alloc.num_cached_tokens(a) == 16
    assert alloc.allocate(2, shape(48, 1, 1)) == 0  # 14 blocks: 4 of A's cached ones evicted
    host = alloc.host_cache
    assert host.num_offloaded_blocks == alloc.num_evicted_blocks > 0 and len(host) > 0
    alloc.free(2)
    check_host_tier(alloc)
    before_gpu = alloc.num_cached_tokens(a)
    assert before_gpu < 16
    reload = alloc.reload_from_host(-2, a)
    assert reload is not None and reload.num_tokens == 16 - before_gpu
    assert reload.transfer.num_bytes == host.num_reloaded_blocks * alloc.page_bytes
    check_host_tier(alloc)
    assert alloc.num_cached_tokens(a) == 16  # every group serves the whole prefix from the GPU now
    assert alloc.allocate(3, a) == 16  # the pin's blocks are the hit
    alloc.free(-2)  # the pin goes; request 3 keeps its blocks
    check_ledger(alloc)
    alloc.free(3)
    check_cache(alloc, {})
    led = alloc.host_ledger()
    assert led.total_bytes == led.budget_bytes == 8 * B


def test_nothing_to_reload_changes_nothing():
    alloc = make(budget_blocks=40, host_blocks=8)
    a = shape(17, 0, 0)
    assert alloc.allocate(1, a) == 0
    alloc.free(1)
    before = (alloc.ledger(), alloc.cached_block_ids(), alloc.host_cache.keys())
    assert alloc.reload_from_host(-2, a) is None  # nothing on host
    assert (alloc.ledger(), alloc.cached_block_ids(), alloc.host_cache.keys()) == before


def test_a_host_tier_smaller_than_one_block_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^allocator.host_cache_bytes=3 holds no block: one block is 4 bytes"):
        make(budget_blocks=10, host_blocks=0.75)


def test_options_paged_alone_implements_are_still_refused():
    config = PagedConfig(B, prefix_caching=True, cache_duplicate_blocks=True)
    with pytest.raises(ConfigError, match=r"^allocator.cache_duplicate_blocks=True is not supported for a model"):
        HybridPagedAllocator(config, budget_bytes=40, kv_bytes_per_token=2, kv_groups=GROUPS)


class TestHybridHostConformance(CachingAllocatorConformance):
    max_examples = 25

    @pytest.fixture(params=[((KVGroup(FULL, 1), KVGroup(WINDOW, 1, 24)), 8), ((KVGroup(WINDOW, 1, 24),), 16)])
    def allocator_factory(self, request):
        groups, size = request.param
        return lambda budget_bytes, kv: HybridPagedAllocator(
            PagedConfig(size, prefix_caching=True, host_cache_bytes=budget_bytes // 2),
            budget_bytes=budget_bytes,
            kv_bytes_per_token=len(groups) * kv,
            kv_groups=groups,
        )


def test_a_run_reloads_from_host_finishes_every_request_and_the_host_ledger_sums(toy_run):
    """The toy machine, a full and a window group of 8-token blocks: request 0 computes a prefix,
    requests 1 and 2 (their own prompts) evict it to host, request 3 shares it: its blocks come back."""
    from kvbench_plugins.preemption.recompute import RecomputePolicy
    from kvbench_plugins.schedulers.mixed import MixedScheduler
    from toy import TOY_KV_BYTES

    from kvbench.core.request import Request

    size = 8
    page_bytes = size * TOY_KV_BYTES // 2
    config = PagedConfig(size, prefix_caching=True, host_cache_bytes=16 * page_bytes, host_reload="blocking")
    groups = (KVGroup(FULL, 1), KVGroup(WINDOW, 1, 16))
    alloc = HybridPagedAllocator(
        config, budget_bytes=12 * page_bytes, kv_bytes_per_token=TOY_KV_BYTES, kv_groups=groups
    )

    def hashed(request_id, arrival_s, prompt, hashes):
        return Request(request_id, arrival_s, prompt, prompt + 2, (2,), prefix_hashes=hashes, hash_block_tokens=size)

    requests = [
        hashed(0, 0.0, 33, (1, 2, 3, 4, 50)),
        hashed(1, 30.0, 40, (11, 12, 13, 14, 15)),
        hashed(2, 60.0, 40, (21, 22, 23, 24, 25)),
        hashed(3, 90.0, 33, (1, 2, 3, 4, 51)),
    ]
    twin = copy.deepcopy(alloc)
    run = toy_run(MixedScheduler, RecomputePolicy, alloc, requests)
    event = toy_run(MixedScheduler, RecomputePolicy, twin, requests, event_driven=True)
    for name in ("requests", "steps", "refusals"):  # both loops write the same tables
        pd.testing.assert_frame_equal(getattr(run.record, name), getattr(event.record, name), check_exact=True)
    r = run.record.requests.set_index("request_id")
    assert (r["num_generated"] == r["output_tokens"]).all()  # every request, exactly its output
    reloads = run.engine.scheduler.host_reloads
    assert reloads.num_reloads == 1 and reloads.host_hit_tokens > 0
    assert r.loc[3, "cached_prompt_tokens"] == 4 * size  # the whole prefix, every group served
    host = alloc.host_cache
    assert host.num_reloaded_blocks > 0 and reloads.reload_bytes == host.num_reloaded_blocks * page_bytes
    led = alloc.host_ledger()
    assert led.total_bytes == led.budget_bytes == 16 * page_bytes and led.cached_bytes == len(host) * page_bytes
    check_host_tier(alloc)
    assert all(seq_id >= 0 for seq_id in alloc._tables), "a pin outlived the run"


FAST = ["wandb.mode=disabled", "progress=false", "kernel=torch", "output.write=false"]
#: Gemma-3-12B (one full-attention group, five window groups) on the Mooncake trace's first 60
#: requests in a budget small enough to evict: blocks go to host and come back
GEMMA_HOST = [
    "workload=mooncake_conversation",
    "model=gemma3-12b",
    "workload.num_requests=60",
    "hardware.kv_budget_bytes=8e9",
    "allocator=paged_cached",
    "allocator.host_cache_bytes=1e10",
]


@pytest.mark.parametrize("mode", ["overlapped", "blocking"])
def test_gemma3_with_a_host_tier_reloads_finishes_every_request_in_both_loops(mode):
    from kvbench.api import run

    result = run([*FAST, *GEMMA_HOST, f"allocator.host_reload={mode}", "event_driven=true"])
    step = run([*FAST, *GEMMA_HOST, f"allocator.host_reload={mode}", "event_driven=false"])
    for name in ("requests", "steps", "refusals"):  # both loops write the same tables
        pd.testing.assert_frame_equal(getattr(result, name), getattr(step, name), check_exact=True)
    s = result.summary
    assert s["num_kv_groups"] == 6 and s["num_host_reloads"] > 0 and s["host_reload_bytes"] > 0
    assert (result.requests["num_generated"] == result.requests["output_tokens"]).all()  # nobody lost
    assert s["prefix_hit_rate_gpu"] + s["prefix_hit_rate_host"] == pytest.approx(s["prefix_hit_rate"])
    assert s["host_offload_bytes"] >= s["host_reload_bytes"] and s["host_peak_bytes"] <= s["host_cache_bytes"]
    # a window model's cache is not a cache of whole-model blocks: no offline LRU / Belady bound
    assert "prefix_hit_rate_belady_with_host" not in s
