"""The paged decode layout every kernel reads, its input checks, and a builder for test/benchmark caches.

Layout (the one interface of :meth:`kvbench.kernels.kernel.Kernel.decode`):

- ``query`` ``[B, H, D]``; ``key_cache`` / ``value_cache`` ``[num_blocks, block_size, H_kv, D]``;
- ``block_tables`` ``[B, max_blocks]`` int32: sequence ``b``'s token ``t`` lives in block
  ``block_tables[b, t // block_size]`` at row ``t % block_size``;
- ``seq_lens`` ``[B]`` (>= 1 each); entries of ``block_tables`` past ``ceil(seq_lens[b] / block_size)``
  are padding that no kernel may read through;
- query head ``h`` reads KV head ``h // (H // H_kv)`` (GQA; MHA when ``H == H_kv``);
- output ``[B, H, D]`` in the query's dtype.

A contiguous cache is the same call with one block per sequence (``block_size >= max(seq_lens)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_decode_inputs(query, key_cache, value_cache, block_tables, seq_lens) -> tuple[int, int, int, int, int]:
    """Validate shapes and dtypes (no device sync); return ``(B, H, H_kv, D, block_size)``."""
    if query.dim() != 3:
        raise ValueError(f"query must be [B, H, D], got shape {tuple(query.shape)}")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            "key_cache and value_cache must both be [num_blocks, block_size, H_kv, D], got "
            f"{tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    batch, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, kv_head_dim = key_cache.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"query head dim {head_dim} != cache head dim {kv_head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"query heads H={num_heads} must be a multiple of KV heads H_kv={num_kv_heads}")
    if not (query.dtype == key_cache.dtype == value_cache.dtype):
        raise ValueError(
            f"query and caches must share a dtype, got {query.dtype}, {key_cache.dtype}, {value_cache.dtype}"
        )
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or block_tables.dtype != torch.int32:
        raise ValueError(
            f"block_tables must be int32 [B={batch}, max_blocks], got {block_tables.dtype} {tuple(block_tables.shape)}"
        )
    if seq_lens.dim() != 1 or seq_lens.shape[0] != batch:
        raise ValueError(f"seq_lens must be [B={batch}], got shape {tuple(seq_lens.shape)}")
    return batch, num_heads, num_kv_heads, head_dim, block_size


@dataclass
class PagedCase:
    """One decode problem in the paged layout, plus what a benchmark needs to count bytes."""

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor

    @property
    def args(self) -> tuple:
        return self.query, self.key_cache, self.value_cache, self.block_tables, self.seq_lens

    def bytes_read(self) -> int:
        """Bytes a decode step must read at least: every live K and V row, and the query."""
        _, _, num_kv_heads, head_dim = self.key_cache.shape
        num_tokens = int(self.seq_lens.sum())
        kv_bytes = 2 * num_tokens * num_kv_heads * head_dim * self.key_cache.element_size()
        return kv_bytes + self.query.numel() * self.query.element_size()


def make_paged_case(
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float16,
    device: str | torch.device = "cpu",
    *,
    shuffle: bool = True,
    poison: bool = True,
    seed: int = 0,
) -> PagedCase:
    """A random decode problem: each sequence gets its own blocks, handed out in shuffled order.

    With ``poison``, every cache row no sequence owns is NaN: the tail of each last block and a
    spare block 0, which every padding entry of ``block_tables`` points at. A kernel that reads past
    a sequence's length, or through a padding entry, returns NaN instead of passing a test.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in seq_lens]
    max_blocks = max(blocks_per_seq)
    num_blocks = sum(blocks_per_seq) + 1
    # NOTE: block 0 is the spare, all-NaN block: padding entries point at it, and so does any
    # masked block-table load that falls back to 0 (other=0), so neither can go unnoticed.
    spare_block = 0
    order = 1 + (torch.randperm(num_blocks - 1, generator=gen) if shuffle else torch.arange(num_blocks - 1))

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen, dtype=torch.float32)
    value_cache = torch.randn(shape, generator=gen, dtype=torch.float32)
    query = torch.randn((len(seq_lens), num_heads, head_dim), generator=gen, dtype=torch.float32)
    block_tables = torch.full((len(seq_lens), max_blocks), spare_block, dtype=torch.int32)
    live = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    next_block = 0
    for b, (n, nb) in enumerate(zip(seq_lens, blocks_per_seq)):
        ids = order[next_block : next_block + nb]
        next_block += nb
        block_tables[b, :nb] = ids.to(torch.int32)
        for i, block_id in enumerate(ids.tolist()):
            live[block_id, : min(block_size, n - i * block_size)] = True
    if poison:
        key_cache[~live] = float("nan")
        value_cache[~live] = float("nan")
    return PagedCase(
        query=query.to(dtype=dtype, device=device),
        key_cache=key_cache.to(dtype=dtype, device=device),
        value_cache=value_cache.to(dtype=dtype, device=device),
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
    )
