"""kvbench's presets against the engines' own schedulers, step by step (kvbench.validation.differential).

Each peer's checks run where it is installed and skip elsewhere with the one line that says how to
get it: nano-vllm from its repository (``pip install --no-deps git+https://github.com/GeeeekExplorer/nano-vllm.git``
and ``pip install xxhash``), vLLM in its own venv (tools/install_vllm_scheduler.sh)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from kvbench.api import compose
from kvbench.errors import ConfigError
from kvbench.validation.differential import compare, difference, run_differential
from kvbench.validation.peers import nano_vllm, vllm_v1
from kvbench.validation.peers.types import PeerStep, PeerTrace

NANO = ["engine=nano_vllm", "allocator.block_size_tokens=256"]
VLLM = ["engine=vllm_v1"]
#: the Azure conversation trace's first 2,000 rows (1,857 fit llama2-7b), 20 x faster: contended
AZURE = ["workload=azure_conv", "workload.num_requests=2000", "workload.rate_scale=20"]
needs_vllm = pytest.mark.skipif(vllm_v1.unavailable_reason() is not None, reason=str(vllm_v1.unavailable_reason()))
needs_nano_vllm = pytest.mark.skipif(
    nano_vllm.unavailable_reason() is not None, reason=str(nano_vllm.unavailable_reason())
)


def diff(overrides: list[str], peer: str):
    cfg, _ = compose(overrides)
    return run_differential(cfg, peer)


def numbers(c) -> list[tuple[int, int, int, int]]:
    return [(n["steps"], n["preemptions"], n["peak_blocks"], n["finished"]) for n in c.per_side.values()]


@needs_nano_vllm
def test_the_nano_vllm_preset_decides_as_nano_vllm_on_the_lecture_workload():
    c = diff(NANO, "nano_vllm")
    assert c.identical
    assert numbers(c) == [(941, 325, 465, 1000)] * 2
    assert c.num_identical_finish_steps == c.num_requests == 1000


@pytest.mark.parametrize(
    ("overrides", "peer", "expected"),
    [
        pytest.param(NANO + AZURE, "nano_vllm", (7437, 441, 465, 1857), marks=needs_nano_vllm, id="nano_vllm-trace"),
        pytest.param(
            NANO + ["allocator=paged_cached", "allocator.cache_generated_blocks=true"],
            "nano_vllm",
            (941, 325, 465, 1000),
            marks=needs_nano_vllm,
            id="nano_vllm-every-block-cached",
        ),
        # the 62.5 GB budget holds 7,450 blocks; vLLM's null block leaves 7,449, the peak
        pytest.param(VLLM, "vllm_v1", (656, 130, 7449, 1000), marks=needs_vllm, id="vllm_v1-lecture"),
        pytest.param(VLLM + AZURE, "vllm_v1", (5709, 413, 7449, 1857), marks=needs_vllm, id="vllm_v1-trace"),
        # vLLM v1's options
        pytest.param(
            VLLM + ["scheduler=mixed", "scheduler.decodes_in_budget=true"],  # chunking off
            "vllm_v1",
            (657, 132, 7449, 1000),
            marks=needs_vllm,
            id="vllm_v1-no-chunking",
        ),
        pytest.param(
            VLLM + ["scheduler.long_prefill_token_threshold=2048", *AZURE],
            "vllm_v1",
            (5710, 428, 7449, 1857),
            marks=needs_vllm,
            id="vllm_v1-long-prefill-threshold",
        ),
        # int(0.01 x 7,450) = 74 blocks, the null block counted in the pool, as vLLM counts it
        pytest.param(
            VLLM + ["scheduler.watermark_fraction=0.01"],
            "vllm_v1",
            (657, 77, 7449, 1000),
            marks=needs_vllm,
            id="vllm_v1-watermark",
        ),
    ],
)
def test_the_preset_decides_as_its_peer(overrides, peer, expected):
    c = diff(overrides, peer)
    assert c.identical
    assert numbers(c) == [expected] * 2


@needs_nano_vllm
def test_nano_vllm_hashes_blocks_after_the_step_which_kvbench_does_not_model():
    # Mooncake's first two requests share a 512-token prefix and are admitted in one step: kvbench
    # keys the first one's blocks as they are scheduled, so the second hits them; nano-vllm hashes
    # them only after the step
    trace = ["workload=mooncake_conversation", "model=llama2-7b-32k", "workload.num_requests=40"]
    c = diff(NANO + ["allocator=paged_cached", "allocator.cache_generated_blocks=true", *trace], "nano_vllm")
    assert c.first_divergence.step == 0
    assert difference(c.first_divergence) == "request 1: kvbench 6810, peer 7322"


@needs_nano_vllm
def test_kvbench_s_own_defaults_are_not_nano_vllm_and_the_first_divergence_says_where():
    c = diff(["scheduler=prefill_first", "allocator.block_size_tokens=256"], "nano_vllm")
    assert not c.identical
    d = c.first_divergence
    # kvbench's default keeps 1 % of the budget free when admitting: with memory nearly full it
    # admits six 512-token prompts where nano-vllm, with no watermark, admits eight
    assert d.step == 14
    assert difference(d) == "request 230: kvbench 0, peer 512\nrequest 231: kvbench 0, peer 512"


def test_compare_counts_identical_steps_and_finish_steps():
    a = PeerTrace("a", [PeerStep({0: 4}), PeerStep({0: 1}, finished=[0])], [1, 1])
    b = PeerTrace("b", [PeerStep({0: 4}), PeerStep({0: 1}), PeerStep({0: 1}, finished=[0])], [1, 1, 2])
    c = compare(a, b, 1)
    assert (c.first_divergence.step, c.num_identical_steps, c.num_identical_finish_steps) == (1, 1, 0)
    assert c.per_side["b"] == {"steps": 3, "preemptions": 0, "peak_blocks": 2, "finished": 1}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["allocator=naive"], "use allocator=paged"),
        (["workload=synthetic", "workload.num_branches=2", "workload.num_requests=4"], "branches"),
        (["scheduler.queue=shortest_prompt"], "the peers schedule fcfs or priority"),
        pytest.param(
            NANO + ["allocator.block_size_tokens=16"],
            "set allocator.block_size_tokens=256 .or a multiple of it., or add --any-block-size",
            marks=needs_nano_vllm,
        ),
    ],
)
def test_what_a_peer_cannot_run_is_one_line(overrides, message):
    """Said whether the peer is installed or not (but the block size, which needs nano-vllm loaded)."""
    with pytest.raises(ConfigError, match=message):
        diff(overrides, "nano_vllm")


@needs_nano_vllm
def test_a_block_size_nano_vllm_refuses_runs_with_any_block_size():
    cfg, _ = compose(NANO + ["allocator.block_size_tokens=16", "workload.num_requests=200"])
    c = run_differential(cfg, "nano_vllm", peer_options={"allow_any_block_size": True})
    assert c.identical and c.num_identical_finish_steps == 200


def test_a_missing_nano_vllm_is_one_line_saying_how_to_get_it(tmp_path, monkeypatch):
    cfg, _ = compose(NANO + ["workload.num_requests=10"])
    with pytest.raises(ConfigError, match=r"--peer=nano_vllm: --nano-vllm-path .*: no nanovllm/engine/scheduler.py"):
        run_differential(cfg, "nano_vllm", peer_options={"nano_vllm_path": str(tmp_path)})
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nanovllm" else find_spec(name, *a)
    )
    with pytest.raises(ConfigError, match=r"--peer=nano_vllm: nano-vllm is not installed: pip install --no-deps git\+"):
        run_differential(cfg, "nano_vllm")


@needs_vllm
def test_the_vllm_v1_preset_with_priorities_decides_as_vllm(tmp_path):
    # 1,500 requests, Poisson at 40/s, priorities 0-3: the priority queue and vLLM's priority victim
    # (the largest (priority, arrival) among all running, one already scheduled this step included)
    rng = np.random.default_rng(1)
    arrival_s = np.cumsum(rng.exponential(1 / 40, 1500))
    rows = zip(arrival_s, rng.integers(50, 2001, 1500), rng.integers(10, 601, 1500), rng.integers(0, 4, 1500))
    path = tmp_path / "priorities.csv"
    path.write_text(
        "arrival_s,prompt_tokens,output_tokens,priority\n" + "".join(f"{a:.4f},{p},{o},{q}\n" for a, p, o, q in rows)
    )
    workload = ["workload=request_csv", f"workload.path={path}"]
    c = diff(VLLM + workload + ["scheduler.queue=priority", "preemption.victim=lowest_priority"], "vllm_v1")
    assert c.identical, difference(c.first_divergence)
    assert numbers(c) == [(5162, 308, 7449, 1500)] * 2
    newest = diff(VLLM + workload + ["scheduler.queue=priority"], "vllm_v1")
    assert not newest.identical  # the newest victim is not vLLM's priority victim


@needs_vllm
def test_a_watermark_in_bytes_is_not_vllm_s():
    # 0.01 of the bytes is 74.5 blocks' worth, which keeps 75 blocks free where vLLM keeps 74
    c = diff(VLLM + ["scheduler.watermark_fraction=0.01", "scheduler.watermark_in_blocks=false"], "vllm_v1")
    assert not c.identical


@needs_vllm
def test_vllm_s_prefix_cache_is_matched_only_with_generated_blocks_cached():
    cached = VLLM + ["allocator=paged_cached"]
    c = diff(cached + ["allocator.cache_generated_blocks=true"], "vllm_v1")
    assert c.identical
    assert numbers(c) == [(656, 128, 7449, 1000)] * 2  # preempted requests re-hit their own blocks
    prompt_only = diff(cached, "vllm_v1")
    assert not prompt_only.identical and prompt_only.first_divergence.step == 128


@needs_vllm
def test_vllm_s_prefix_cache_on_a_trace_with_shared_prefixes():
    # Mooncake's conversation trace (hash_ids: shared 512-token prefixes), 10x faster
    trace = [
        "workload=mooncake_conversation",
        "model=llama2-7b-32k",
        "workload.num_requests=400",
        "workload.rate_scale=10",
    ]
    c = diff(VLLM + ["allocator=paged_cached", "allocator.cache_generated_blocks=true", *trace], "vllm_v1")
    assert c.identical
    assert numbers(c) == [(12496, 16, 7449, 364)] * 2


#: 500 lognormal requests (medians 512 + 128) whose prompts all start with one 1,000-token system
#: prompt (a shorter prompt is all system prompt), all at t = 0, in 4 GB: 475 blocks of 16 tokens
#: beside the null block, so requests are preempted and come back to partly evicted blocks
SHARED_PREFIX = [
    "workload=lognormal",
    "workload.num_requests=500",
    "workload.shared_prefix_tokens=1000",
    "hardware.kv_budget_bytes=4e9",
]


@needs_vllm
def test_vllm_s_prefix_cache_under_memory_pressure_on_a_shared_system_prompt():
    cached = VLLM + ["allocator=paged_cached", "allocator.cache_generated_blocks=true", *SHARED_PREFIX]
    c = diff(cached, "vllm_v1")
    assert c.identical, difference(c.first_divergence)
    assert numbers(c) == [(7465, 336, 475, 500)] * 2
    # vLLM keeps a recomputed copy of a cached block cached too (its BlockPool does not
    # de-duplicate); freed at once instead, it spares one of a preempted request's own blocks
    private = diff(cached + ["engine.cache_duplicate_blocks=false"], "vllm_v1")
    assert private.first_divergence.step == 1508
    assert difference(private.first_divergence) == "request 116: kvbench 658, peer 674"
