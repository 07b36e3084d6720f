"""The options of a block-pool allocator (``allocator=paged``, and ``hybrid_paged``, which a model
with sliding-window layers gets for the same options): block size, the prefix cache and its host
tier. Each option is checked in one line by :meth:`PagedConfig.validate`."""

from __future__ import annotations

from dataclasses import dataclass, fields

from kvbench.errors import ConfigError, require
from kvbench.memory.host_cache import validate_host_tier

#: the block size an MLA model's paged groups get unless ``allocator.block_size_tokens`` says
#: otherwise: FlashMLA's decode kernel reads its latent cache in pages of 64 tokens (vLLM's FlashMLA
#: backend requires block_size 64), so vLLM and SGLang run DeepSeek-V3 with 64-token blocks
MLA_BLOCK_SIZE_TOKENS = 64
#: any other model's (vLLM's default block_size)
DEFAULT_BLOCK_SIZE_TOKENS = 16


def model_block_size_tokens(model) -> int:
    """The block size the model's attention kernels want (``allocator.block_size_tokens: null``):
    64 tokens for an MLA model, 16 for the others."""
    return MLA_BLOCK_SIZE_TOKENS if getattr(model, "mla", None) is not None else DEFAULT_BLOCK_SIZE_TOKENS


@dataclass
class PagedConfig:
    #: tokens per KV block (vLLM's block_size): a power of two from 8 to 256; small blocks waste
    #: less tail, large blocks give the attention kernel longer contiguous runs. Every paged group
    #: (full, window, an MLA model's latents) uses it; a linear-attention state takes whole blocks.
    #: null (the default): a run takes the model's kernels' size (:func:`model_block_size_tokens`:
    #: 64 for MLA, 16 otherwise), shown as the run's ``block_size_tokens``, and an allocator built
    #: without a model 16; ``allocator.block_size_tokens=<n>`` overrides it for any model
    block_size_tokens: int | None = None
    #: keep full prompt blocks across requests and reuse the longest cached prefix (vLLM's
    #: enable_prefix_caching); needs a workload whose requests carry prefix hashes
    prefix_caching: bool = False
    #: with prefix_caching: key every full block of a one-sequence request, its own prompt tokens
    #: and its generated ones too, as vLLM hashes every full block; a request preempted by
    #: recompute then finds its own blocks again while they stay cached (counted as recomputation
    #: served from the cache, not as prompt hits). Works without prefix hashes in the workload
    cache_generated_blocks: bool = False
    #: with prefix_caching: bytes of host (CPU) memory that keep cached blocks the GPU evicts
    #: (LMCache, vLLM's offloading connector, SGLang HiCache); a later prefix hit on them reloads
    #: them over the host link. 0: no host tier (evicted blocks are gone)
    host_cache_bytes: float = 0
    #: with prefix_caching: a block computed with content another block already holds (the last
    #: block of a fully cached prompt, a recomputed block whose cached copy is past a broken chain)
    #: takes the key too and, freed, is cached and evictable like it, as vLLM's BlockPool keeps
    #: duplicates; false: it stays private and is freed as an ordinary block (one block per key)
    cache_duplicate_blocks: bool = False
    #: how a reload is paid: overlapped (started when the request is first considered, the request
    #: admitted once its blocks have arrived, other requests running meanwhile) or blocking (the
    #: copy is added to the step that admits the request)
    host_reload: str = "overlapped"

    def validate(self) -> None:
        size = self.block_size_tokens
        require(
            size is None or (isinstance(size, int) and 8 <= size <= 256 and size & (size - 1) == 0),
            "allocator.block_size_tokens",
            size,
            "use a power of two from 8 to 256, or null for the model's (64 for MLA, else 16)",
        )
        require(
            isinstance(self.prefix_caching, bool), "allocator.prefix_caching", self.prefix_caching, "use true or false"
        )
        require(
            isinstance(self.cache_generated_blocks, bool) and (self.prefix_caching or not self.cache_generated_blocks),
            "allocator.cache_generated_blocks",
            self.cache_generated_blocks,
            "use true with allocator.prefix_caching=true, or false",
        )
        require(
            isinstance(self.cache_duplicate_blocks, bool) and (self.prefix_caching or not self.cache_duplicate_blocks),
            "allocator.cache_duplicate_blocks",
            self.cache_duplicate_blocks,
            "use true with allocator.prefix_caching=true, or false",
        )
        validate_host_tier(self.host_cache_bytes, self.host_reload, self.prefix_caching)

    def refuse_unsupported(self, supported: tuple[str, ...], where: str) -> None:
        """Refuse, in one line, an option left off its default that an allocator ``where`` does not
        implement (``supported``: the options it does)."""
        for option in fields(self):
            value = getattr(self, option.name)
            if option.name not in supported and value != option.default:
                raise ConfigError(
                    f"allocator.{option.name}={value!r} is not supported {where}; leave it at {option.default!r}"
                )
