"""A run's prefix-cache summary values that the headline and the printed report are both checked on."""

from __future__ import annotations

#: why a run's prefix cache hit nothing, as kvbench.metrics.prefix_bounds words it
ZERO_HIT_NOTE = "hit rate 0: prompts share at most 8 tokens, less than one 16-token block (only full blocks are cached)"
#: a run whose prefix cache hit nothing and could not have (every offline bound 0 too), and the note why
ZERO_PREFIX_HITS = {
    "prefix_hit_rate": 0.0,
    "prefix_recompute_cached_tokens": 0,
    "prefix_hit_rate_infinite": 0.0,
    "prefix_hit_rate_belady": 0.0,
    "prefix_hit_rate_lru_offline": 0.0,
    "prefix_note": ZERO_HIT_NOTE,
}
