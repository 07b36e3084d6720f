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


# --- a sweep computes the offline bounds once per (requests, block size, capacity) ----------------

#: a short sweep whose jobs share a trace with shared prefixes (so, bounds to compute)
SWEPT = [
    "workload.num_requests=60",
    "workload.shared_prefix_tokens=256",
    "allocator.prefix_caching=true",
    "progress=false",
    "wandb.mode=disabled",
    "output.steps=false",
    "output.figures=false",
]


def _bounds_key_of(overrides: list[str]) -> str:
    """The cache key of the bounds of ``kvbench <overrides>``, from its requests as the run makes them."""
    from kvbench.api import build
    from kvbench.core.request import requests_from_workload
    from kvbench.metrics.prefix_bounds import bounds_key

    s = build(overrides)
    requests = requests_from_workload(s.workload_source.generate(np.random.default_rng(0)), 0)
    block_size_tokens = s.allocator.block_size_tokens
    return bounds_key(requests, block_size_tokens, s.budget_bytes // (s.model.kv_bytes_per_token * block_size_tokens))


def test_a_sweep_s_jobs_share_one_computation_per_block_size(tmp_path):
    import pandas as pd
    from kvbench_cli import kvbench

    from kvbench.app.run import BOUNDS_CACHE
    from kvbench.metrics.prefix_bounds import cache_file

    proc = kvbench(
        "-m",
        "scheduler=mixed,prefill_first",
        "allocator.block_size_tokens=16,32",
        *SWEPT,
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    cache = tmp_path / "sweep" / BOUNDS_CACHE
    keys = {size: _bounds_key_of([*SWEPT, f"allocator.block_size_tokens={size}"]) for size in (16, 32)}
    # four jobs, two block sizes: two computations, kept beside the jobs (not among them)
    assert sorted(cache.glob("*.json")) == sorted(cache_file(cache, key) for key in keys.values())
    table = pd.read_parquet(tmp_path / "sweep" / "comparison.parquet")
    assert len(table) == 4 and not table["failed"].any()
    for size in (16, 32):
        rows = table[table["block_size_tokens"] == size]
        alone = run([*SWEPT, f"allocator.block_size_tokens={size}"]).summary  # in this process: no folder
        assert rows["prefix_hit_rate_belady"].tolist() == [alone["prefix_hit_rate_belady"]] * 2
        assert rows["prefix_hit_rate_infinite"].tolist() == [alone["prefix_hit_rate_infinite"]] * 2


def test_a_job_reads_the_bounds_its_sweep_kept(tmp_path):
    """Each job of a sweep, in its own process, takes the bounds from the sweep's folder: values
    planted there under the key of its requests come out in its results."""
    import pandas as pd
    from kvbench_cli import kvbench

    from kvbench.app.run import BOUNDS_CACHE
    from kvbench.io.atomic import write_json
    from kvbench.metrics.prefix_bounds import cache_file

    key = _bounds_key_of(SWEPT)
    planted = {
        "prefix_hit_rate_infinite": 0.125,
        "prefix_hit_rate_lru_offline": 0.0625,
        "prefix_hit_rate_belady": 0.09375,
    }
    cache = tmp_path / "sweep" / BOUNDS_CACHE
    cache.mkdir(parents=True)
    write_json(cache_file(cache, key), {"key": key, "bounds": planted})
    proc = kvbench("-m", "scheduler=mixed,prefill_first", *SWEPT, "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_parquet(tmp_path / "sweep" / "comparison.parquet")
    for name, value in planted.items():
        assert table[name].tolist() == [value, value]
