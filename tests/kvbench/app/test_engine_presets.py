"""What an engine preset sets on the allocator it is given: vLLM's prefix cache keeps duplicate
blocks (engine.cache_duplicate_blocks), on a paged allocator's prefix cache and nowhere else."""

from __future__ import annotations

import pytest

from kvbench.api import build
from kvbench.errors import ConfigError


def keeps_duplicates(*overrides: str) -> bool:
    return build(list(overrides)).allocator.capabilities.caches_duplicate_blocks


def test_the_vllm_preset_keeps_duplicate_blocks_in_a_paged_prefix_cache():
    assert keeps_duplicates("engine=vllm_v1", "allocator=paged_cached")
    assert keeps_duplicates("engine=vllm_v1", "allocator=paged", "allocator.prefix_caching=true")
    assert not keeps_duplicates("engine=vllm_v1", "allocator=paged_cached", "engine.cache_duplicate_blocks=false")


def test_other_presets_and_kvbench_s_default_keep_one_block_per_key():
    assert not keeps_duplicates("allocator=paged_cached")
    assert not keeps_duplicates("engine=nano_vllm", "allocator=paged_cached")
    assert keeps_duplicates("allocator=paged_cached", "allocator.cache_duplicate_blocks=true")  # the option alone


@pytest.mark.parametrize("allocator", ["paged", "naive", "vattention"])
def test_the_vllm_preset_leaves_an_allocator_without_a_prefix_cache_as_it_is(allocator):
    setup = build(["engine=vllm_v1", f"allocator={allocator}"])
    assert not setup.allocator.capabilities.caches_duplicate_blocks
    assert not getattr(setup.allocator.config, "cache_duplicate_blocks", False)


def test_keeping_duplicate_blocks_needs_prefix_caching():
    with pytest.raises(
        ConfigError,
        match="allocator.cache_duplicate_blocks=True is invalid: use true with allocator.prefix_caching=true",
    ):
        build(["allocator.cache_duplicate_blocks=true"])
    with pytest.raises(ConfigError, match="engine.cache_duplicate_blocks='yes' is invalid: use true or false"):
        build(["engine=vllm_v1", "engine.cache_duplicate_blocks=yes"])


def test_a_model_with_sliding_window_layers_keeps_one_block_per_key_under_the_vllm_preset():
    # its paged allocator is hybrid_paged (one block table per KV group), which keeps one block per key
    setup = build(["engine=vllm_v1", "allocator=paged_cached", "model=mistral-7b-v0.1"])
    assert setup.allocator.name == "hybrid_paged" and setup.allocator.capabilities.caches_prefixes
    assert not setup.allocator.capabilities.caches_duplicate_blocks
