"""Which KV blocks of a prompt are the same as another request's: block identities for prefix caching.

kvbench has no token ids. A request carries ``prefix_hashes``: one id per *granule* of
``hash_block_tokens`` prompt tokens (the last granule may be partial), chained over the prefix, so
that two requests with the same id at granule ``g`` have the same first ``(g + 1) * G`` prompt
tokens (or the same whole prompt, for a last partial granule). Mooncake's traces give exactly this
with ``G = 512``; kvbench's synthetic workloads draw them for a shared prefix.

A KV block of ``B`` tokens covers prompt tokens ``[j*B, (j+1)*B)``; its content and everything before
it are determined by the granule holding its last token, so its identity is that granule's id and
the block's end. Only full blocks are cacheable (a partly filled last block is still being
written). Granularity is separate from the block size: with ``B < G`` several blocks share one
granule; with ``B > G`` a block spans several. A prefix shared for fewer tokens than one block
yields no cacheable block at all (hit rate 0), which is the point of sweeping the block size.
"""

from __future__ import annotations

#: a block's identity: (id of the granule holding its last token, the block's end in tokens)
BlockKey = tuple[int, int]


def block_keys(
    prompt_tokens: int, prefix_hashes: tuple[int, ...], hash_block_tokens: int, block_size_tokens: int
) -> list[BlockKey]:
    """The identities of the prompt's full blocks, in order; [] when the request has no hashes."""
    if not prefix_hashes or hash_block_tokens <= 0:
        return []
    granules = len(prefix_hashes)
    keys = []
    for end in range(block_size_tokens, prompt_tokens + 1, block_size_tokens):
        granule = (end - 1) // hash_block_tokens
        if granule >= granules:  # hashes cover fewer tokens than the prompt: the rest is unknown
            break
        keys.append((prefix_hashes[granule], end))
    return keys
