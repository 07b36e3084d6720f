"""The reference decode attention every kernel is tested against: gather each sequence's blocks,
then an ordinary softmax.

It favours being obviously right over being fast: it gathers the whole ``[B, max_blocks * block_size]``
window (memory grows with the longest sequence), computes in float32 and masks tokens past each
sequence's length. It runs on any device torch supports, CPU included. It is core code (ground
truth belongs in the core); the ``torch`` kernel plugin adapts it to the kernel interface.
"""

from __future__ import annotations


def paged_decode_reference(query, key_cache, value_cache, block_tables, seq_lens, scale: float | None = None):
    """Decode attention over a paged cache (layout in :mod:`kvbench.kernels.layout`), in float32.

    Returns ``[B, H, D]`` in the query's dtype. Padding entries of ``block_tables`` are never
    dereferenced (they are replaced by block 0 before the gather, then masked).
    """
    import math

    import torch

    from kvbench.kernels.layout import check_decode_inputs

    batch, num_heads, num_kv_heads, head_dim, block_size = check_decode_inputs(
        query, key_cache, value_cache, block_tables, seq_lens
    )
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    max_blocks = block_tables.shape[1]
    seq_lens = seq_lens.to(device=query.device, dtype=torch.int64)

    blocks = torch.arange(max_blocks, device=query.device)
    live_blocks = blocks[None, :] * block_size < seq_lens[:, None]  # [B, max_blocks]
    block_ids = torch.where(live_blocks, block_tables.long(), 0)
    tokens = torch.arange(max_blocks * block_size, device=query.device)
    live_tokens = tokens[None, :] < seq_lens[:, None]  # [B, T]

    def gather(cache):
        rows = cache[block_ids].reshape(batch, max_blocks * block_size, num_kv_heads, head_dim).float()
        # NOTE: zero, not just mask, the stale rows: softmax weight 0 times a NaN row is still NaN.
        rows = torch.where(live_tokens[:, :, None, None], rows, 0.0)
        return rows.repeat_interleave(num_heads // num_kv_heads, dim=2)  # [B, T, H, D]

    keys, values = gather(key_cache), gather(value_cache)
    scores = torch.einsum("bhd,bthd->bht", query.float(), keys) * scale
    scores = scores.masked_fill(~live_tokens[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bht,bthd->bhd", probs, values).to(query.dtype)
