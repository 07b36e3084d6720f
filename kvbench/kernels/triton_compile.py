"""Compile the Triton decode kernels for a GPU target on a machine without a GPU.

Triton's interpreter checks neither layouts nor ``tl.dot``'s shape rules, so CPU-only CI also builds
PTX and a cubin for ``GPUTarget("cuda", 90, 32)`` with the argument types, constexprs and
alignment hints a real launch would have (taken from :func:`~kvbench.kernels.triton_decode.plan_launch`
on ``meta`` tensors). This needs triton imported without ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import math

import torch

from kvbench.kernels.triton_decode import MERGE_NUM_WARPS, kernels, plan_launch

_TRITON_DTYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
}


def _specialize(value) -> tuple[str, object]:
    """``(type, hint)`` the way a JIT launch specialises an argument ("D": divisible by 16)."""
    try:  # Triton >= 3.4: ask the JIT itself
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        return native_specialize_impl(BaseBackend, value, False, True, True)
    except ImportError:  # older Triton: the same rules, written out
        if isinstance(value, torch.Tensor):
            return "*" + _TRITON_DTYPES[value.dtype], "D" if value.data_ptr() % 16 == 0 else ""
        if isinstance(value, bool):
            return "u1", None
        if isinstance(value, int):
            if value == 1:
                return "constexpr", 1
            return ("i32" if -(2**31) <= value < 2**31 else "i64"), "D" if value % 16 == 0 else ""
        return "fp32", None


def _signature(fn, args: dict) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` as a JIT launch with ``args`` would specialise them."""
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        value = args[name]
        if fn.params[i].is_constexpr:
            signature[name], constexprs[name] = "constexpr", value
            continue
        # NOTE: the JIT turns an integer argument equal to 1 into a constexpr and marks pointers
        # and integers divisible by 16 ("D"); without these the compile is not the one a GPU runs.
        kind, hint = _specialize(value)
        signature[name] = kind
        if kind == "constexpr":
            constexprs[name] = hint
        elif hint == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def compile_for_target(
    target,
    dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    *,
    batch: int = 4,
    max_seq_len_tokens: int = 4096,
    **options,
) -> tuple:
    """Compile both kernels for ``target`` (e.g. ``GPUTarget("cuda", 90, 32)``) with no GPU present.

    The arguments come from :func:`plan_launch` on ``meta`` tensors of the given shape, so the
    types, constexprs and alignment hints are those of a real GPU launch, and a compile error that
    only a GPU build hits (layouts, ``tl.dot`` shapes, dtype rules) fails here too. Returns the two
    compiled kernels (``.asm`` holds the PTX and cubin).
    """
    import triton
    from triton.compiler import ASTSource

    num_blocks = batch * math.ceil(max_seq_len_tokens / block_size)
    meta = dict(device="meta", dtype=dtype)
    plan = plan_launch(
        torch.empty((batch, num_heads, head_dim), **meta),
        torch.empty((num_blocks, block_size, num_kv_heads, head_dim), **meta),
        torch.empty((num_blocks, block_size, num_kv_heads, head_dim), **meta),
        torch.empty((batch, math.ceil(max_seq_len_tokens / block_size)), device="meta", dtype=torch.int32),
        torch.empty((batch,), device="meta", dtype=torch.int32),
        **options,
    )
    split_kernel, merge_kernel = kernels(interpret=False)
    compiled = []
    for fn, args, launch in (
        (split_kernel, plan.split_args, dict(num_warps=plan.num_warps, num_stages=plan.num_stages)),
        (merge_kernel, plan.merge_args, dict(num_warps=MERGE_NUM_WARPS)),
    ):
        signature, constexprs, attrs = _signature(fn, args)
        src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
        compiled.append(triton.compile(src, target=target, options=launch))
    return tuple(compiled)
