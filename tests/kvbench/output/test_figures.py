"""Per-run figures: the memory ledger's stack and the prefix cache over time, from hand-built tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvbench.output.figures import cumulative_hit_rate, ledger_stack, plot_memory_timeline, plot_prefix_cache

SUMMARY = {
    "kv_budget_bytes": 1024,
    "model": "m",
    "hardware": "h",
    "allocator": "paged",
    "block_size_tokens": 16,
    "workload": "w",
    "prefix_hit_rate_infinite": 0.5,
    "prefix_hit_rate_belady": 0.4375,
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _steps(cached=(0.0, 256.0, 512.0)) -> pd.DataFrame:
    n = len(cached)
    return pd.DataFrame(
        {
            "start_s": np.arange(n, dtype=float),
            "num_running": [1] * n,
            "token_bytes": [256.0] * n,
            "reserved_future_bytes": [0.0] * n,
            "internal_bytes": [0.0] * n,
            "external_bytes": [0.0] * n,
            "free_bytes": [768.0 - c for c in cached],
            "cached_bytes": list(cached),
        }
    )


def _requests() -> pd.DataFrame:
    # admitted out of id order; r3 never admitted (its tokens must not count)
    return pd.DataFrame(
        {
            "request_id": [0, 1, 2, 3],
            "admitted_s": [0.0, 2.0, 1.0, -1.0],
            "prompt_tokens": [8, 16, 8, 100],
            "cached_prompt_tokens": [0, 12, 4, 0],
        }
    )


def test_cumulative_hit_rate_follows_admissions():
    t_s, rate = cumulative_hit_rate(_requests())
    assert list(t_s) == [0.0, 1.0, 2.0]
    # after r0: 0 / 8; after r2: 4 / 16; after r1: 16 / 32 (the summary's prefix_hit_rate)
    assert list(rate) == [0.0, 0.25, 0.5]
    _, none_yet = cumulative_hit_rate(
        pd.DataFrame({"admitted_s": [0.0], "prompt_tokens": [0], "cached_prompt_tokens": [0]})
    )
    assert math.isnan(none_yet[0])


def test_the_cached_part_is_stacked_only_when_it_holds_something():
    assert [col for col, _, _ in ledger_stack(_steps())][-2:] == ["free_bytes", "cached_bytes"]
    assert "cached_bytes" not in [col for col, _, _ in ledger_stack(_steps(cached=(0.0, 0.0)))]
    assert "cached_bytes" not in [col for col, _, _ in ledger_stack(_steps().drop(columns="cached_bytes"))]


def test_the_prefix_figure_is_written_only_for_a_caching_run(tmp_path):
    path = plot_prefix_cache(_requests(), _steps(), SUMMARY, tmp_path / "prefix_cache.png")
    assert path == tmp_path / "prefix_cache.png" and path.read_bytes()[:8] == PNG_MAGIC
    # no cached_bytes in the steps: the hit rate alone
    assert plot_prefix_cache(_requests(), _steps().drop(columns="cached_bytes"), SUMMARY, tmp_path / "b.png")
    assert (
        plot_prefix_cache(_requests().drop(columns="cached_prompt_tokens"), _steps(), SUMMARY, tmp_path / "none.png")
        is None
    )
    assert not (tmp_path / "none.png").exists()
    # an allocator without a cache: the columns are there, all 0, and the trace shares nothing
    no_cache = _requests().assign(cached_prompt_tokens=0)
    plain = {key: value for key, value in SUMMARY.items() if not key.startswith("prefix_")}
    assert plot_prefix_cache(no_cache, _steps(cached=(0.0, 0.0)), plain, tmp_path / "plain.png") is None
    assert not (tmp_path / "plain.png").exists()
    # zero hits on a trace that shares prefixes (the bounds say why): drawn
    assert plot_prefix_cache(no_cache, _steps(cached=(0.0, 0.0)), SUMMARY, tmp_path / "zero.png")


def test_the_memory_figure_draws_with_and_without_a_cache(tmp_path):
    for name, steps in (("with.png", _steps()), ("without.png", _steps().drop(columns="cached_bytes"))):
        assert plot_memory_timeline(steps, SUMMARY, tmp_path / name).read_bytes()[:8] == PNG_MAGIC
