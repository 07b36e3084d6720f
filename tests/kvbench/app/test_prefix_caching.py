"""Prefix caching through a whole run: the same tokens come out, fewer are computed, the hit rate
is the arithmetic's, and the ledger still sums to the budget with cached blocks in it."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.api import run
from kvbench.core.ledger import LEDGER_FIELDS

#: 200 requests of 512 prompt tokens whose first 256 are one shared system prompt; a budget large
#: enough that nobody is preempted, so computed tokens can be counted exactly
SHARED = [
    "workload.num_requests=200",
    "workload.shared_prefix_tokens=256",
    "scheduler.max_num_seqs=64",
    "workload.output_tokens=32",
    "progress=false",
]


@pytest.fixture(scope="module")
def runs():
    return run(SHARED), run([*SHARED, "allocator.prefix_caching=true"])


def test_caching_never_changes_what_a_request_emits(runs):
    plain, cached = runs
    assert (cached.requests["num_generated"] == cached.requests["output_tokens"]).all()
    assert plain.requests["num_generated"].tolist() == cached.requests["num_generated"].tolist()


def test_only_uncached_prompt_tokens_are_computed(runs):
    plain, cached = runs
    assert plain.summary["num_preemptions"] == cached.summary["num_preemptions"] == 0
    hits = cached.requests["cached_prompt_tokens"]
    # the first request computes the shared prefix; every later one finds its 16 blocks cached
    assert hits.iloc[0] == 0 and (hits.iloc[1:] == 256).all()
    saved = plain.requests["num_computed_tokens"].sum() - cached.requests["num_computed_tokens"].sum()
    assert saved == hits.sum() == 199 * 256
    assert cached.summary["prefix_hit_rate"] == pytest.approx(199 * 256 / (200 * 512))
    # an infinite cache could not do better here, and the budget holds the whole prefix
    assert cached.summary["prefix_hit_rate_infinite"] == pytest.approx(cached.summary["prefix_hit_rate"])
    assert cached.summary["prefix_hit_rate_belady"] == pytest.approx(cached.summary["prefix_hit_rate"])
    assert cached.summary["ttft_p50_s"] < plain.summary["ttft_p50_s"]  # less prefill per request
    assert plain.summary["prefix_hit_rate"] == 0


def test_the_ledger_sums_to_the_budget_with_cached_blocks(runs):
    _, cached = runs
    steps = cached.steps
    assert steps["cached_bytes"].max() > 0  # finished requests leave their prefix blocks cached
    total = sum(steps[field] for field in LEDGER_FIELDS)
    assert np.allclose(total, cached.summary["kv_budget_bytes"], rtol=0, atol=1e-3 * 2**20)


def test_a_shared_prefix_shorter_than_a_block_gives_no_hit_and_says_why():
    result = run([*SHARED, "workload.shared_prefix_tokens=12", "allocator.prefix_caching=true"])
    assert result.summary["prefix_hit_rate"] == 0 and result.summary["prefix_hit_rate_infinite"] == 0
    assert "block" in result.summary["prefix_note"]
