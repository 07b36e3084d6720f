"""Timing for the kernel benchmark: cold-L2 kernel times, the measured copy bandwidth, benchmark caches.

Methodology:

- every timed iteration starts with a cold L2: a buffer larger than the L2 is overwritten first,
  outside the timed interval, so the KV cache comes from HBM as it would in a real decode step;
- on a GPU each iteration is timed with CUDA events around the kernel alone; on CPU (the dry run)
  with ``time.perf_counter``;
- metadata preparation (FlashInfer's ``plan``, Triton's split choice) is timed separately;
- bandwidth is reported as a fraction of a *measured* device-to-device copy bandwidth (bytes read
  plus bytes written over time), the best a memory-bound kernel can be expected to reach.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_iterations_s(
    fn: Callable[[], object], device: torch.device, *, warmup_iters: int, timed_iters: int, flush_bytes: int
) -> list[float]:
    """Seconds per call of ``fn`` for ``timed_iters`` calls, each after a cold-L2 flush (GPU only)."""
    flush = None
    if device.type == "cuda" and flush_bytes:
        flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device)
    for _ in range(warmup_iters):
        fn()
    synchronize(device)
    times_s = []
    for _ in range(timed_iters):
        if flush is not None:
            flush.zero_()  # evicts the previous iteration's cache lines; not inside the timed interval
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times_s.append(start.elapsed_time(end) / 1e3)
        else:
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times_s.append(time.perf_counter() - t0)
    return times_s


def time_once_s(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """``(fn(), seconds)`` with the device synchronised on both sides (for metadata preparation)."""
    synchronize(device)
    t0 = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - t0


def copy_bandwidth_bytes_per_s(device: torch.device, num_bytes: int, iters: int = 10) -> float:
    """Measured device-to-device copy bandwidth: (bytes read + bytes written) / median time."""
    src = torch.ones(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times_s = time_iterations_s(lambda: dst.copy_(src), device, warmup_iters=2, timed_iters=iters, flush_bytes=0)
    return 2 * num_bytes / statistics.median(times_s)


@dataclass
class BenchCache:
    """K and V of ``batch`` sequences of ``context_tokens`` each, as one flat token-major buffer.

    Every block size is a view of the same memory (``[num_tokens / block_size, block_size, H_kv, D]``)
    with its own shuffled block table, so one allocation serves the whole block-size sweep.
    """

    key_flat: torch.Tensor  # [batch * context_tokens, H_kv, D]
    value_flat: torch.Tensor
    query: torch.Tensor  # [batch, H, D]
    batch: int
    context_tokens: int

    @classmethod
    def random(cls, batch, context_tokens, num_heads, num_kv_heads, head_dim, dtype, device, seed=0) -> "BenchCache":
        gen = torch.Generator(device=device).manual_seed(seed)
        shape = (batch * context_tokens, num_kv_heads, head_dim)
        key = torch.randn(shape, generator=gen, dtype=dtype, device=device)
        value = torch.randn(shape, generator=gen, dtype=dtype, device=device)
        query = torch.randn((batch, num_heads, head_dim), generator=gen, dtype=dtype, device=device)
        return cls(key, value, query, batch, context_tokens)

    def paged(self, block_size: int, shuffle: bool, seed: int = 0) -> tuple:
        """``(query, key_cache, value_cache, block_tables, seq_lens)`` with ``block_size``-token blocks."""
        if self.context_tokens % block_size:
            raise ValueError(f"context_tokens={self.context_tokens} is not a multiple of block_size={block_size}")
        device = self.key_flat.device
        _, num_kv_heads, head_dim = self.key_flat.shape
        num_blocks = self.key_flat.shape[0] // block_size
        key_cache = self.key_flat.view(num_blocks, block_size, num_kv_heads, head_dim)
        value_cache = self.value_flat.view(num_blocks, block_size, num_kv_heads, head_dim)
        if shuffle:  # a long-running allocator's free list hands out blocks in no particular order
            gen = torch.Generator(device=device).manual_seed(seed)
            order = torch.randperm(num_blocks, generator=gen, device=device)
        else:
            order = torch.arange(num_blocks, device=device)
        block_tables = order.to(torch.int32).view(self.batch, num_blocks // self.batch)
        seq_lens = torch.full((self.batch,), self.context_tokens, dtype=torch.int32, device=device)
        return self.query, key_cache, value_cache, block_tables, seq_lens

    def contiguous(self) -> tuple:
        """The same call with one block per sequence (the contiguous layout)."""
        return self.paged(self.context_tokens, shuffle=False)

    def sdpa_operands(self) -> tuple:
        """``(q, k, v)`` for ``scaled_dot_product_attention``: ``[B, H, 1, D]`` and ``[B, H_kv, S, D]``.

        NOTE: the flat buffers are reinterpreted as head-major per sequence (SDPA's natural
        contiguous layout) rather than copied: the values are random, only the layout matters here.
        """
        _, num_kv_heads, head_dim = self.key_flat.shape
        shape = (self.batch, num_kv_heads, self.context_tokens, head_dim)
        return self.query[:, :, None, :], self.key_flat.view(shape), self.value_flat.view(shape)
