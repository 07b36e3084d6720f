"""The host tier's numbers for a run's summary (only when ``allocator.host_cache_bytes`` > 0).

Hit rates split by tier, over the same denominator as ``prefix_hit_rate`` (prompt tokens of
admitted requests): ``prefix_hit_rate_gpu`` are prompt tokens served by blocks found in GPU memory,
``prefix_hit_rate_host`` those reloaded from host memory; they add up to ``prefix_hit_rate``.
Traffic in both directions of the host link, the reloads' time (on the link; waited for by the
requests when overlapped; added to steps when blocking), and the offline bounds at the capacity
of both tiers together: the tiers are exclusive (:mod:`kvbench.memory.host_cache`), so they hold
up to GPU blocks + host blocks distinct blocks, the capacity Belady's and LRU's bounds are given.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvbench.core.request import Request
from kvbench.io.table import ColumnTable
from kvbench.metrics.prefix_bounds import Progress, cached_prefix_cache_bounds
from kvbench.sched.scheduler import Scheduler


def host_tier_summary(
    scheduler: Scheduler,
    request_table: ColumnTable,
    requests: list[Request],
    *,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> dict:
    """The summary keys of the host tier; {} without one (a default run gains no key)."""
    alloc, reloads = scheduler.allocator, scheduler.host_reloads
    host = getattr(alloc, "host_cache", None)
    if host is None or reloads is None:
        return {}
    block_size = alloc.block_size_tokens
    # a host slot holds one GPU block: the whole model's (paged), or one KV group's (hybrid_paged)
    block_bytes = host.block_bytes
    admitted = np.asarray(request_table["admitted_s"]) >= 0
    prompt_tokens = int(np.asarray(request_table["prompt_tokens"])[admitted].sum())
    cached_tokens = int(np.asarray(request_table["cached_prompt_tokens"])[admitted].sum())
    rate = (lambda tokens: tokens / prompt_tokens) if prompt_tokens else (lambda tokens: float("nan"))
    out: dict = {
        "host_cache_bytes": host.capacity_blocks * block_bytes,
        "host_reload": "blocking" if reloads.blocking else "overlapped",
        "prefix_hit_rate_gpu": rate(cached_tokens - reloads.host_hit_tokens),
        "prefix_hit_rate_host": rate(reloads.host_hit_tokens),
        "num_host_reloads": reloads.num_reloads,
        "host_reload_bytes": reloads.reload_bytes,
        "host_offload_bytes": host.num_offloaded_blocks * block_bytes,
        "host_reload_s": reloads.reload_s,
        "host_reload_wait_s": reloads.reload_wait_s,
        "host_reload_step_s": reloads.blocking_step_s,
        "host_link_queue_s": reloads.link_queue_s,
        "num_host_evicted_blocks": host.num_evicted_blocks,
        "host_peak_bytes": host.peak_blocks * block_bytes,
    }
    if any(g.window_tokens for g in getattr(alloc, "kv_groups", ())):
        # a sliding-window model's cache holds a prefix's last window per window group, not
        # whole-model blocks: bounds of a cache of whole-model blocks bound nothing it does
        return out
    # the bounds count whole-model blocks: both tiers' bytes in those
    model_block_bytes = block_size * alloc.kv_bytes_per_token
    capacity_blocks = alloc.budget_bytes // model_block_bytes + host.capacity_blocks * block_bytes // model_block_bytes
    bounds = cached_prefix_cache_bounds(requests, block_size, capacity_blocks, cache_dir=cache_dir, progress=progress)
    if bounds:
        out["prefix_hit_rate_lru_offline_with_host"] = bounds["prefix_hit_rate_lru_offline"]
        out["prefix_hit_rate_belady_with_host"] = bounds["prefix_hit_rate_belady"]
    return out
