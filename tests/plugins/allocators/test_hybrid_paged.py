"""HybridPagedAllocator: per-group block tables from one pool, windows that free blocks, prefix hits
every group can serve, and the conformance suites."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvbench_plugins.allocators.hybrid_paged import HybridPagedAllocator
from kvbench_plugins.allocators.paged import PagedAllocator, PagedConfig

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.memory.allocator import SeqShape
from kvbench.specs.kv_groups import FULL, WINDOW, KVGroup
from kvbench.testing.allocators import (
    OPERATIONS,
    AllocatorConformance,
    CachingAllocatorConformance,
    check_invariants,
    prefix_hashes,
    run_operations,
)


def window(tokens: int) -> KVGroup:
    return KVGroup(WINDOW, 1, tokens)


FULL1 = KVGroup(FULL, 1)
#: Mistral-like (every layer windowed), Gemma-2-like (1:1), Gemma-3-like (one full, two window groups)
LAYOUTS = {
    "window_only": (window(24),),
    "full_and_window": (FULL1, window(50)),
    "full_and_two_windows": (FULL1, window(24), window(24)),
}


def make(groups, block_size_tokens=4, budget_blocks=40, slot_bytes=1, prefix_caching=False) -> HybridPagedAllocator:
    """An allocator whose blocks hold ``slot_bytes`` per token (one group's share of a token)."""
    return HybridPagedAllocator(
        PagedConfig(block_size_tokens, prefix_caching=prefix_caching),
        budget_bytes=budget_blocks * block_size_tokens * slot_bytes,
        kv_bytes_per_token=len(groups) * slot_bytes,
        kv_groups=groups,
    )


def factory(groups, block_size_tokens, prefix_caching=False):
    # the suite's kv_bytes_per_token is one group's: the whole model's is that many times the groups
    return lambda budget_bytes, kv: HybridPagedAllocator(
        PagedConfig(block_size_tokens, prefix_caching=prefix_caching),
        budget_bytes=budget_bytes,
        kv_bytes_per_token=len(groups) * kv,
        kv_groups=groups,
    )


PARAMS = [(name, size) for name in LAYOUTS for size in (8, 16)]


class TestHybridConformance(AllocatorConformance):
    max_examples = 40

    @pytest.fixture(params=PARAMS, ids=[f"{n}-B{s}" for n, s in PARAMS])
    def allocator_factory(self, request):
        name, size = request.param
        return factory(LAYOUTS[name], size)


class TestHybridCachingConformance(CachingAllocatorConformance):
    max_examples = 40

    @pytest.fixture(params=PARAMS, ids=[f"{n}-B{s}" for n, s in PARAMS])
    def allocator_factory(self, request):
        name, size = request.param
        return factory(LAYOUTS[name], size, prefix_caching=True)


def test_a_window_group_frees_each_block_exactly_when_it_leaves_the_window():
    # B = 4, W = 10: at n tokens the group holds blocks (n - 10) // 4 .. (n - 1) // 4
    alloc = make((window(10),))
    assert alloc.allocate(1, SeqShape(1, 100, 100)) == 0
    held, free = [], []
    for n in range(1, 21):
        if n > 1:
            assert alloc.append(1)
        ((first, blocks),) = alloc.group_block_tables(1)
        held.append(len(blocks))
        free.append(alloc.ledger().free_bytes // alloc.page_bytes)
    # hand-checked: a new block at n = 5, 9, 13, 17; block 0 (tokens 0-3) leaves at n = 14 (window
    # [4, 14)), block 1 (tokens 4-7) at n = 18 (window [8, 18))
    assert held == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 3, 3, 3, 4, 3, 3, 3]
    assert free == [40 - h for h in held]
    assert alloc.num_window_slid_blocks == 2
    assert alloc.group_block_tables(1)[0][0] == 2  # its first held block is logical block 2


def test_appending_many_tokens_ends_where_single_appends_end():
    one, many = make(LAYOUTS["full_and_two_windows"]), make(LAYOUTS["full_and_two_windows"])
    for alloc in (one, many):
        assert alloc.allocate(1, SeqShape(3, 200, 150)) == 0
    for _ in range(57):
        assert one.append(1)
    assert many.append(1, 57)
    assert one.ledger() == many.ledger()
    assert [(f, len(b)) for f, b in one.group_block_tables(1)] == [(f, len(b)) for f, b in many.group_block_tables(1)]


def test_per_group_bytes_sum_to_the_ledger():
    alloc = make(LAYOUTS["full_and_two_windows"], budget_blocks=100)
    assert alloc.allocate(1, SeqShape(60, 200, 150)) == 0
    assert alloc.allocate(2, SeqShape(10, 200, 150, num_branches=2)) == 0
    alloc.fork(2, 3)  # shared blocks count once, in their group
    # n = 60, B = 4: the full group holds 15 blocks, each W = 24 window [36, 60) the blocks 9..14: 6
    # n = 10: 3 blocks per group, shared by 2 and 3
    assert alloc.group_bytes() == [p * alloc.page_bytes for p in (15 + 3, 6 + 3, 6 + 3)]
    led = alloc.ledger()
    assert sum(alloc.group_bytes()) == led.allocated_bytes
    # the ledger's split: the full group's 18 blocks, the two window groups' 9 + 9
    assert led.group_bytes == (
        ("full_group_bytes", 18 * alloc.page_bytes),
        ("window_group_bytes", 18 * alloc.page_bytes),
    )
    assert led.token_bytes == (60 + 24 + 24 + 3 * 10) * alloc.slot_bytes  # shared tokens once; 60 - 36 = 24
    check_invariants(alloc, {1: 60, 2: 10, 3: 10}, {1: 150, 2: 150, 3: 150})


@pytest.mark.parametrize(
    "groups, twin_kv, hybrid_seqs, twin_seqs",
    [
        # every layer windowed (W = 8): a 20-token sequence holds blocks 3..4 (2) instead of 5
        ((window(8),), 1, 20, 8),
        # one full + one window group: 5 + 2 blocks of half a token's bytes, against 5 whole-token blocks
        ((FULL1, window(8)), 2, 5, 4),
    ],
)
def test_a_window_model_holds_more_sequences_than_its_full_attention_twin(groups, twin_kv, hybrid_seqs, twin_seqs):
    hybrid = make(groups)  # 40 blocks of 4 tokens x 1 byte
    twin = PagedAllocator(PagedConfig(4), budget_bytes=hybrid.budget_bytes, kv_bytes_per_token=twin_kv)
    shape = SeqShape(20, 40, 30)
    counts = []
    for alloc in (hybrid, twin):
        n = 0
        while alloc.allocate(n, shape) is not None:
            n += 1
        counts.append(n)
    assert counts == [hybrid_seqs, twin_seqs]


def test_a_prefix_hit_is_only_what_every_group_still_holds():
    B, granule = 4, 4
    alloc = make((FULL1, window(8)), prefix_caching=True, budget_blocks=100)
    twin = PagedAllocator(PagedConfig(B, prefix_caching=True), budget_bytes=alloc.budget_bytes, kv_bytes_per_token=2)

    def shape(prompt, shared_granules, request):
        hashes = prefix_hashes(prompt, granule, shared_granules, 0, request)
        return SeqShape(prompt, 2 * prompt, prompt + 3, 1, prompt, hashes, granule)

    for a in (alloc, twin):
        assert a.allocate(1, shape(32, 8, 1)) == 0  # the whole 32-token prompt is the shared prefix
        a.free(1)
    # same 32 tokens again (+1): every group holds [24, 32), what the window needs at 32
    assert alloc.num_cached_tokens(shape(33, 8, 2)) == twin.num_cached_tokens(shape(33, 8, 2)) == 32
    # only the first 20 tokens shared: the full group has them, the window group kept only blocks 6-7
    # ([24, 32)): no hit length p has [p - 8, p) in the window group, so nothing is served
    assert twin.num_cached_tokens(shape(40, 5, 3)) == 20
    assert alloc.num_cached_tokens(shape(40, 5, 3)) == 0


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    block_size_tokens=st.sampled_from([8, 16]),
    budget_tokens=st.integers(128, 2048),
    operations=OPERATIONS,
)
def test_no_block_is_leaked_or_freed_twice(layout, block_size_tokens, budget_tokens, operations):
    """Random scheduler operations: after each, every held block's refcount is its holders (the
    suite's checks); after freeing everything, every block is free exactly once."""
    groups = LAYOUTS[layout]
    alloc = make(groups, block_size_tokens, budget_blocks=budget_tokens // block_size_tokens)
    run_operations(alloc, operations)
    assert alloc._shared_refs == {} and set(alloc._held_per_column) == {0}
    assert alloc._num_tail_slots == alloc._num_future_slots == 0, "a sequence's ledger terms outlived it"
    free = alloc._free_block_ids + list(range(alloc.num_blocks - alloc.pool.num_fresh, alloc.num_blocks))
    assert sorted(free) == list(range(alloc.num_blocks)), "a block was leaked or freed twice"


# --- the closed-form decode projection: the steps taken one by one, and the step-by-step projection --

#: a window group of each of two sizes: the blocks of window groups do not move in step
TWO_WINDOWS = (FULL1, window(24), window(40))


def _decoding(groups, block_size_tokens, lengths, spare_blocks, truncate_by):
    """An allocator with a decoding sequence per (prompt, output) in ``lengths``, on a pool of the
    most blocks they held plus ``spare_blocks``; with ``truncate_by``, the first sequence grew that
    many tokens and gave them back (a window group then starts past its window, or holds no block)."""
    probe = make(groups, block_size_tokens, budget_blocks=10_000)
    shapes = [SeqShape(p, p + o + truncate_by, p + o) for p, o in lengths]
    for seq_id, shape in enumerate(shapes):
        assert probe.allocate(seq_id, shape) == 0
    held = probe.ledger().allocated_bytes
    if truncate_by:
        assert probe.append(0, truncate_by)
        held = max(held, probe.ledger().allocated_bytes)
    alloc = make(groups, block_size_tokens, budget_blocks=held // probe.page_bytes + spare_blocks)
    for seq_id, shape in enumerate(shapes):
        assert alloc.allocate(seq_id, shape) == 0
    if truncate_by:
        assert alloc.append(0, truncate_by)
        alloc.truncate(0, shapes[0].num_tokens)
    return alloc


@settings(max_examples=120, deadline=None)
@given(
    groups=st.sampled_from([*LAYOUTS.values(), TWO_WINDOWS]),
    block_size_tokens=st.sampled_from([4, 8]),
    lengths=st.lists(st.tuples(st.integers(1, 90), st.integers(2, 160)), min_size=1, max_size=7),
    spare_blocks=st.integers(0, 14),
    truncate_by=st.sampled_from([0, 0, 5, 30]),
    max_steps=st.integers(1, 160),
)
def test_a_closed_form_projection_is_the_steps_taken_one_by_one(
    groups, block_size_tokens, lengths, spare_blocks, truncate_by, max_steps
):
    """Short (plain integers) and long (arrays) projections, windows freeing blocks in and out of
    step, memory that runs out (where a step's own frees may or may not cover its takes): the same
    steps and ledgers as the step-by-step projection, and as the appends made one by one."""
    alloc = _decoding(groups, block_size_tokens, lengths, spare_blocks, truncate_by)
    seq_ids = list(range(len(lengths)))
    max_steps = min(max_steps, min(o for _, o in lengths) - 1) or 1
    projection = alloc.project_decode(seq_ids, max_steps)
    stepwise = alloc._project_stepwise(seq_ids, max_steps, None)
    assert projection.num_steps == stepwise.num_steps
    assert {k: list(v) for k, v in projection.ledgers.items()} == stepwise.ledgers
    for step in range(projection.num_steps):
        assert alloc.append_each(seq_ids, 1) == len(seq_ids)
        led = alloc.ledger()
        assert [projection.ledgers[f][step] for f in LEDGER_FIELDS] == [getattr(led, f) for f in LEDGER_FIELDS]
        assert [projection.ledgers[n][step] for n, _ in led.group_bytes] == [v for _, v in led.group_bytes]
    if projection.num_steps < max_steps:  # exact: the next step does not go through
        assert alloc.append_each(seq_ids, 1) < len(seq_ids)


def test_a_projection_through_a_tight_step_counts_the_frees_of_the_sequences_before():
    """Every block taken: a step where one sequence's window frees a block just before another,
    later in the batch, needs one goes through (the one-by-one appends do); the same step with the
    two in the other order does not."""
    groups = (window(8),)  # B = 4: a 12-token sequence's window leaves block 0 at 12 (frees it), 13 takes one
    for order, steps in (([0, 1], 1), ([1, 0], 0)):
        alloc = make(groups, 4, budget_blocks=5)
        assert alloc.allocate(0, SeqShape(11, 40, 30)) == 0  # blocks 0-2 (tokens 0-10): frees block 0 at 12
        assert alloc.allocate(1, SeqShape(8, 40, 30)) == 0  # blocks 0-1 (full): takes a block at 9
        assert alloc.ledger().free_bytes == 0
        projection = alloc.project_decode(order, 1)
        assert projection.num_steps == steps
        assert alloc.append_each(order, 1) == 2 * steps  # (stopping at the first that does not fit)


# --- in the engine: both loops write the same tables, windows read less, the twin holds fewer ----

FAST = ["wandb.mode=disabled", "progress=false", "kernel=torch", "output.write=false"]
# lognormal prompts (median 512, tails to 4K) around the window, on budgets that preempt
HEAVY = ["workload=lognormal", "workload.num_requests=40", "hardware.host_swap_bytes=1e9", "scheduler.max_num_seqs=64"]


def both_loops(*overrides):
    import pandas as pd

    from kvbench.api import run

    event = run([*FAST, *overrides, "event_driven=true"])
    step = run([*FAST, *overrides, "event_driven=false"])
    for table in ("requests", "steps", "refusals"):
        pd.testing.assert_frame_equal(getattr(event, table), getattr(step, table), check_exact=True)
    wall = ("sim_wall_s", "loop_wall_s", "simulated_requests_per_wall_s")
    same = [k for k in event.summary if k not in wall and event.summary[k] == event.summary[k]]
    assert {k: event.summary[k] for k in same} == {k: step.summary[k] for k in same}
    return event


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("model, budget", [("mistral-7b-v0.1", "0.3e9"), ("gemma3-12b", "2.5e9")])
def test_both_loops_agree_for_a_hybrid_model(model, budget, preemption):
    result = both_loops(
        *HEAVY,
        f"model={model}",
        "model.hf_config.sliding_window=256",
        f"hardware.kv_budget_bytes={budget}",
        f"preemption={preemption}",
    )
    s = result.summary
    r = result.requests
    assert (r["num_generated"] == r["output_tokens"]).all(), "a request lost tokens"
    # the steps table splits the held bytes by group kind: they add up to the ledger's allocated bytes
    steps = result.steps
    kinds = ["full_group_bytes", "window_group_bytes"] if model == "gemma3-12b" else ["window_group_bytes"]
    assert [c for c in steps.columns if c.endswith("_group_bytes")] == kinds
    allocated = steps[["token_bytes", "reserved_future_bytes", "internal_bytes"]].sum(axis=1)
    assert np.allclose(steps[kinds].sum(axis=1), allocated, rtol=1e-12, atol=1.0)
    assert (steps["window_group_bytes"] > 0).any()
    assert s["num_window_groups"] >= 1 and s["sliding_window_tokens"] == 256 and s["window_slid_bytes"] > 0
    assert s["num_preemptions"] > 0, "the heavy workload must preempt"


#: lognormal lengths around each model's own window (Gemma-3: 1,024 tokens, Mistral: 4,096)
OWN_WINDOW = {
    "gemma3-12b": ["workload.prompt_tokens=1024", "workload.output_tokens=256", "workload.s_max_tokens=8192"],
    "mistral-7b-v0.1": ["workload.prompt_tokens=3000", "workload.output_tokens=512", "workload.s_max_tokens=16384"],
}
#: a KV budget that preempts, and one that holds every request (and lets arrivals join a run)
OWN_BUDGETS = {"gemma3-12b": ("2e9", "30e9"), "mistral-7b-v0.1": ("1e9", "20e9")}


@pytest.mark.parametrize(
    "memory", ["tight-recompute", "tight-swap", "roomy-arrivals"], ids=["preempt-recompute", "preempt-swap", "poisson"]
)
@pytest.mark.parametrize("model", sorted(OWN_WINDOW))
def test_both_loops_agree_with_the_models_own_windows(model, memory):
    """The closed-form projection and the quiet appends on the models as configured: both loops
    write the same tables while windows slide, whether memory preempts (by recompute or swap) or
    requests arrive during runs of decode steps."""
    tight, roomy = OWN_BUDGETS[model]
    budget, _, how = memory.partition("-")
    setting = [f"preemption={how}"] if budget == "tight" else ["workload.arrival=poisson", "workload.rate_per_s=4"]
    result = both_loops(
        f"model={model}",
        "workload=lognormal",
        "workload.num_requests=30",
        "hardware.host_swap_bytes=1e9",
        f"hardware.kv_budget_bytes={tight if budget == 'tight' else roomy}",
        *OWN_WINDOW[model],
        *setting,
    )
    s = result.summary
    assert s["window_slid_bytes"] > 0 and s["num_steps"] > len(result.steps), "no window slid, or no run of steps"
    assert (s["num_preemptions"] > 0) == (budget == "tight")


@pytest.mark.parametrize(
    "sharing",
    [
        [
            "model=gemma3-12b",
            "allocator.prefix_caching=true",
            "workload.shared_prefix_tokens=512",
            "hardware.kv_budget_bytes=2e9",
        ],
        ["model=mistral-7b-v0.1", "workload.num_branches=3", "hardware.kv_budget_bytes=0.5e9", "preemption=swap"],
    ],
    ids=["prefix-cache", "forks"],
)
def test_both_loops_agree_when_windows_give_back_cached_or_shared_blocks(sharing):
    """A window releasing a prompt block the prefix cache keeps (it becomes evictable while other
    sequences take blocks, so the order of the steps decides what is evicted), or one a fork's
    branches share (what sharing saves drops during the run): a run of decode steps advanced at
    once ends, and is appended, as the steps one by one go."""
    result = both_loops(
        *sharing,
        "model.hf_config.sliding_window=256",
        "workload=lognormal",
        "workload.num_requests=30",
        "hardware.host_swap_bytes=1e9",
    )
    s = result.summary
    assert s["window_slid_bytes"] > 0 and s["num_preemptions"] > 0
    assert result.steps["num_shared_blocks"].max() > 0


@pytest.mark.parametrize("scheduler", ["mixed", "prefill_first"])
def test_both_loops_agree_when_a_sliding_window_frees_room_for_a_refused_request(scheduler):
    """Twenty requests in step at t = 0: their windows free blocks together, and while others wait
    that room admits the head of the queue at the step it appears. A run of decode steps advanced
    at once must end before that step, not take the memory the step-by-step loop admits with."""
    result = both_loops(
        "model=mistral-7b-v0.1",
        "model.hf_config.sliding_window=256",
        "workload=synthetic",
        "workload.num_requests=20",
        "workload.prompt_tokens=200",
        "workload.output_tokens=300",
        "workload.s_max_tokens=2048",
        "hardware.kv_budget_bytes=0.2e9",
        f"scheduler={scheduler}",
    )
    assert result.summary["window_slid_bytes"] > 0 and len(result.refusals) > 0


def test_a_window_model_decodes_faster_and_holds_more_than_its_twin():
    from kvbench.api import run

    common = [
        *FAST,
        "model=mistral-7b-v0.1",
        "workload=synthetic",
        "workload.num_requests=64",
        "workload.prompt_tokens=8192",
        "workload.output_tokens=64",
        "workload.s_max_tokens=16384",
        "hardware.kv_budget_bytes=20e9",
    ]
    hybrid = run(common).summary
    twin = run([*common, "model.hf_config.sliding_window=null"]).summary
    assert "num_kv_groups" not in twin  # a full-attention run reports nothing new
    # 20 GB / 128 KiB per token = 152,587 tokens: 18 sequences of 8,192 at most in full attention;
    # with a 4,096 window a sequence holds about half of that
    assert twin["peak_concurrency"] <= 18 < hybrid["peak_concurrency"]
    assert hybrid["throughput_tokens_per_s"] > twin["throughput_tokens_per_s"]


def test_a_window_model_reports_the_prefix_ceiling_only():
    """The offline LRU and Belady bounds model a cache of whole-model blocks, which a model with
    window groups does not keep: its run reports the no-eviction ceiling, which still bounds it."""
    from kvbench.api import run

    common = [*FAST, "workload.num_requests=60", "workload.shared_prefix_tokens=256", "allocator.prefix_caching=true"]
    # a window longer than the 512-token prompts: the window group holds the shared prefix too
    hybrid = run([*common, "model=mistral-7b-v0.1", "model.hf_config.sliding_window=1024"]).summary
    twin = run([*common, "model=mistral-7b-v0.1", "model.hf_config.sliding_window=null"]).summary
    assert "prefix_hit_rate_belady" in twin and "prefix_hit_rate_lru_offline" in twin
    assert "prefix_hit_rate_belady" not in hybrid and "prefix_hit_rate_lru_offline" not in hybrid
    assert hybrid["prefix_hit_rate_infinite"] == twin["prefix_hit_rate_infinite"] > 0
    assert 0 < hybrid["prefix_hit_rate"] <= hybrid["prefix_hit_rate_infinite"]
