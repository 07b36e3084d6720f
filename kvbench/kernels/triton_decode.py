"""Paged decode attention in Triton, flash-decoding style.

Two launches:

1. ``_split_kernel``, grid ``(B, H_kv, num_splits)``: each program takes one sequence, one KV head
   and one contiguous range of ``tokens_per_split`` tokens of that sequence. It loads the query
   rows of every query head that shares the KV head (GQA: the KV rows are read once for the whole
   group), walks its range in tiles of ``TILE_TOKENS`` tokens with an online softmax, and writes a
   normalised partial output plus its log-sum-exp (base 2).
2. ``_merge_kernel``, grid ``(B, H)``: combines a head's partial outputs weighted by
   ``exp2(lse_s - max_s lse)``; splits that start past the sequence's length are masked out.

The tile is independent of the cache's block size: each token's physical row is looked up through
the block table (``block_tables[b, t // BLOCK_SIZE]``, row ``t % BLOCK_SIZE``), so one tile may span
several small blocks or a fraction of a large one. Block ids are widened to int64 before they are
multiplied by the block stride: a 16 GiB cache overflows int32 element offsets.

The same source runs compiled on a CUDA GPU or through Triton's CPU interpreter. The interpreter
mishandles bf16 arithmetic, so ``UPCAST`` converts loads to float32 there (and float32 inputs use
an IEEE ``tl.dot`` rather than TF32 on the GPU). :mod:`kvbench.kernels.triton_compile` builds the
kernels for a GPU target without a GPU, which is how CPU-only CI catches GPU-only compile errors.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton.language as tl

from kvbench.kernels.layout import check_decode_inputs

#: ``tl.dot`` needs every dimension >= 16 on the GPU, so GQA groups are padded to this many rows
MIN_DOT_ROWS = 16
LOG2_E = 1.4426950408889634
#: the merge reads a [num_splits, D] tile per head: a few warps are plenty
MERGE_NUM_WARPS = 4


def _split_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    scale_log2,
    stride_q_batch,
    stride_q_head,
    stride_k_block,
    stride_k_token,
    stride_k_head,
    stride_v_block,
    stride_v_token,
    stride_v_head,
    stride_bt_batch,
    stride_p_batch,
    stride_p_head,
    stride_p_split,
    stride_l_batch,
    stride_l_head,
    tokens_per_split,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    USE_DOT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    batch = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + batch)
    split_start = split * tokens_per_split
    split_end = tl.minimum(split_start + tokens_per_split, seq_len)

    rows = tl.arange(0, GROUP_PAD)  # the query heads of this KV head's group (padded)
    dims = tl.arange(0, HEAD_DIM_PAD)  # head dims padded to a power of two (e.g. 80 -> 128)
    row_mask = rows < GROUP
    dim_mask = dims < HEAD_DIM
    heads = kv_head * GROUP + rows
    q_ptrs = query_ptr + batch * stride_q_batch + heads[:, None] * stride_q_head + dims[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max of scores (log2 units)
    l_i = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    bt_row = block_tables_ptr + batch * stride_bt_batch
    # Every tile holds at least one live token (the loop stops at the sequence's end), so m_i is
    # finite after the first tile and no exp2(-inf - -inf) NaN can appear.
    for tile_start in range(split_start, split_end, TILE_TOKENS):
        tokens = tile_start + tl.arange(0, TILE_TOKENS)
        token_mask = tokens < split_end
        block_ids = tl.load(bt_row + tokens // BLOCK_SIZE, mask=token_mask, other=0).to(tl.int64)
        in_block = tokens % BLOCK_SIZE
        kv_mask = token_mask[:, None] & dim_mask[None, :]
        k_ptrs = (
            key_cache_ptr
            + block_ids[:, None] * stride_k_block
            + in_block[:, None] * stride_k_token
            + kv_head * stride_k_head
            + dims[None, :]
        )
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        if USE_DOT:
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        else:  # one query row (MHA): a broadcast multiply-reduce beats a 16x padded tl.dot
            scores = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], 2)
        scores = tl.where(token_mask[None, :], scores * scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = (
            value_cache_ptr
            + block_ids[:, None] * stride_v_block
            + in_block[:, None] * stride_v_token
            + kv_head * stride_v_head
            + dims[None, :]
        )
        # NOTE: the mask matters for V even though p is 0 there: 0 * NaN (stale rows) is NaN.
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        if USE_DOT:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], 1)
        m_i = m_new

    # A split that starts past the sequence's end did no work: write 0 and lse -inf (the merge
    # masks it out anyway; this keeps the buffer free of NaN).
    has_tokens = l_i > 0
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None]
    lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
    p_ptrs = (
        partial_out_ptr
        + batch * stride_p_batch
        + heads[:, None] * stride_p_head
        + split * stride_p_split
        + dims[None, :]
    )
    tl.store(p_ptrs, out, mask=row_mask[:, None] & dim_mask[None, :])
    tl.store(partial_lse_ptr + batch * stride_l_batch + heads * stride_l_head + split, lse, mask=row_mask)


def _merge_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    seq_lens_ptr,
    out_ptr,
    tokens_per_split,
    num_splits,
    stride_p_batch,
    stride_p_head,
    stride_p_split,
    stride_l_batch,
    stride_l_head,
    stride_o_batch,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    batch = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + batch)
    num_live_splits = tl.minimum(tl.cdiv(seq_len, tokens_per_split), num_splits)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    split_mask = splits < num_live_splits
    dim_mask = dims < HEAD_DIM
    lse = tl.load(
        partial_lse_ptr + batch * stride_l_batch + head * stride_l_head + splits, mask=split_mask, other=float("-inf")
    )
    weights = tl.exp2(lse - tl.max(lse, 0))  # masked splits weigh exp2(-inf) = 0
    p_ptrs = (
        partial_out_ptr
        + batch * stride_p_batch
        + head * stride_p_head
        + splits[:, None] * stride_p_split
        + dims[None, :]
    )
    partial = tl.load(p_ptrs, mask=split_mask[:, None] & dim_mask[None, :], other=0.0)
    out = tl.sum(weights[:, None] * partial, 0) / tl.sum(weights, 0)
    o_ptrs = out_ptr + batch * stride_o_batch + head * stride_o_head + dims
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=dim_mask)


def interpreter_active() -> bool:
    """True when this process's triton runs kernels through its CPU interpreter.

    Triton decides at import time: ``@triton.jit`` reads ``TRITON_INTERPRET`` when it decorates, and
    its standard library (``tl.zeros``, ``tl.sum``'s combine function, ...) is decorated when
    ``triton.language`` is imported. So the variable must be set before triton's first import, and
    one process is either all-interpreted or all-compiled.
    """
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.zeros, InterpretedFunction)


@functools.lru_cache(maxsize=2)
def kernels(interpret: bool) -> tuple:
    """``(split_kernel, merge_kernel)``, compiled (``JITFunction``) or for the CPU interpreter."""
    if interpret != interpreter_active():
        raise RuntimeError(
            f"triton was imported with TRITON_INTERPRET={'1' if interpreter_active() else 'unset'}; "
            f"{'interpreted' if interpret else 'compiled'} kernels need it "
            f"{'set to 1' if interpret else 'unset'} before triton's first import"
        )
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction as wrap
    else:
        from triton.runtime.jit import JITFunction as wrap
    return wrap(_split_kernel), wrap(_merge_kernel)


def _next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(n)))


def group_layout(num_heads: int, num_kv_heads: int) -> tuple[int, int, bool]:
    """``(GROUP, GROUP_PAD, USE_DOT)``: MHA uses one broadcast row; GQA a tl.dot over >= 16 rows."""
    group = num_heads // num_kv_heads
    if group == 1:
        return 1, 1, False
    return group, max(MIN_DOT_ROWS, _next_pow2(group)), True


def choose_splits(
    batch: int,
    num_kv_heads: int,
    max_tokens: int,
    tile_tokens: int,
    num_splits: int,
    min_tokens_per_split: int,
    target_programs: int,
) -> tuple[int, int]:
    """``(num_splits, tokens_per_split)`` covering ``max_tokens`` in whole tiles.

    ``num_splits=0`` picks enough splits to give the GPU about ``target_programs`` programs, but no
    split shorter than ``min_tokens_per_split`` (each split costs a partial write and a merge read).
    """
    max_tiles = math.ceil(max_tokens / tile_tokens)
    if num_splits <= 0:
        by_occupancy = math.ceil(target_programs / (batch * num_kv_heads))
        by_length = max(1, max_tokens // max(min_tokens_per_split, tile_tokens))
        num_splits = min(by_occupancy, by_length)
    num_splits = max(1, min(num_splits, max_tiles))
    tokens_per_split = math.ceil(max_tiles / num_splits) * tile_tokens
    return math.ceil(max_tokens / tokens_per_split), tokens_per_split


def dot_precision(dtype: torch.dtype, upcast: bool) -> str:
    # float32 inputs on the GPU would otherwise run in TF32 (10-bit mantissa): use IEEE instead
    return "ieee" if upcast or dtype == torch.float32 else "tf32"


@dataclass(frozen=True)
class LaunchPlan:
    """Both launches of one decode call: grids and arguments by the kernels' parameter names."""

    split_grid: tuple[int, int, int]
    split_args: dict
    merge_grid: tuple[int, int]
    merge_args: dict
    out: torch.Tensor
    num_warps: int
    num_stages: int
    interpret: bool


def plan_launch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    *,
    tile_tokens: int = 64,
    num_splits: int = 0,
    min_tokens_per_split: int = 128,
    num_warps: int = 8,
    num_stages: int = 2,
    interpret: bool = False,
) -> LaunchPlan:
    """Check inputs, choose the split, allocate the partial buffers and name every kernel argument.

    Works on ``meta`` tensors too, which is how :mod:`kvbench.kernels.triton_compile` gets the exact
    argument types and alignments a GPU launch would have.
    """
    batch, num_heads, num_kv_heads, head_dim, block_size = check_decode_inputs(
        query, key_cache, value_cache, block_tables, seq_lens
    )
    if tile_tokens < 16 or tile_tokens & (tile_tokens - 1):
        raise ValueError(f"tile_tokens={tile_tokens} must be a power of two >= 16 (tl.dot needs K >= 16)")
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head) dimension")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    block_tables = block_tables.contiguous()
    seq_lens = seq_lens.contiguous()

    group, group_pad, use_dot = group_layout(num_heads, num_kv_heads)
    # Upper bound on any sequence's length without a device sync: the block table's width.
    max_tokens = block_tables.shape[1] * block_size
    if query.is_cuda:
        target_programs = 4 * torch.cuda.get_device_properties(query.device).multi_processor_count
    elif interpret:
        target_programs = 8  # the interpreter runs programs one after another: few is fastest
    else:
        target_programs = 4 * 132  # compile-only (meta tensors): an H100/H200's 132 SMs
    num_splits, tokens_per_split = choose_splits(
        batch, num_kv_heads, max_tokens, tile_tokens, num_splits, min_tokens_per_split, target_programs
    )
    partial_out = torch.empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=query.device)
    partial_lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=query.device)
    out = torch.empty_like(query)
    head_dim_pad = max(16, _next_pow2(head_dim))
    upcast = interpret  # the interpreter's bf16 arithmetic does not match a GPU's: compute in float32

    split_args = dict(
        query_ptr=query,
        key_cache_ptr=key_cache,
        value_cache_ptr=value_cache,
        block_tables_ptr=block_tables,
        seq_lens_ptr=seq_lens,
        partial_out_ptr=partial_out,
        partial_lse_ptr=partial_lse,
        scale_log2=scale * LOG2_E,
        stride_q_batch=query.stride(0),
        stride_q_head=query.stride(1),
        stride_k_block=key_cache.stride(0),
        stride_k_token=key_cache.stride(1),
        stride_k_head=key_cache.stride(2),
        stride_v_block=value_cache.stride(0),
        stride_v_token=value_cache.stride(1),
        stride_v_head=value_cache.stride(2),
        stride_bt_batch=block_tables.stride(0),
        stride_p_batch=partial_out.stride(0),
        stride_p_head=partial_out.stride(1),
        stride_p_split=partial_out.stride(2),
        stride_l_batch=partial_lse.stride(0),
        stride_l_head=partial_lse.stride(1),
        tokens_per_split=tokens_per_split,
        GROUP=group,
        GROUP_PAD=group_pad,
        USE_DOT=use_dot,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        BLOCK_SIZE=block_size,
        TILE_TOKENS=tile_tokens,
        UPCAST=upcast,
        DOT_PRECISION=dot_precision(query.dtype, upcast),
    )
    merge_args = dict(
        partial_out_ptr=partial_out,
        partial_lse_ptr=partial_lse,
        seq_lens_ptr=seq_lens,
        out_ptr=out,
        tokens_per_split=tokens_per_split,
        num_splits=num_splits,
        stride_p_batch=partial_out.stride(0),
        stride_p_head=partial_out.stride(1),
        stride_p_split=partial_out.stride(2),
        stride_l_batch=partial_lse.stride(0),
        stride_l_head=partial_lse.stride(1),
        stride_o_batch=out.stride(0),
        stride_o_head=out.stride(1),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        SPLITS_PAD=_next_pow2(num_splits),
    )
    return LaunchPlan(
        (batch, num_kv_heads, num_splits),
        split_args,
        (batch, num_heads),
        merge_args,
        out,
        num_warps,
        num_stages,
        interpret,
    )


def launch(plan: LaunchPlan) -> torch.Tensor:
    """Run both kernels of ``plan`` (asynchronously on a GPU) and return its output tensor."""
    split_kernel, merge_kernel = kernels(plan.interpret)
    split_kernel[plan.split_grid](**plan.split_args, num_warps=plan.num_warps, num_stages=plan.num_stages)
    merge_kernel[plan.merge_grid](**plan.merge_args, num_warps=MERGE_NUM_WARPS)
    return plan.out
