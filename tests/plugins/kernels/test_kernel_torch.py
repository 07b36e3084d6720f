"""The torch reference kernel: checked against a per-sequence float64 loop, then trusted by every other test."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from kvbench_plugins.kernels.torch_ref import TorchKernel, paged_decode_reference

from kvbench.kernels.layout import make_paged_case
from kvbench.testing.kernels import DECODE_CASES, DTYPES, assert_matches_reference


def loop_reference(query, key_cache, value_cache, block_tables, seq_lens, scale=None):
    """The obvious per-sequence implementation, in float64: an independent ground truth."""
    batch, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    outs = []
    for b in range(batch):
        n = int(seq_lens[b])
        blocks = block_tables[b, : math.ceil(n / block_size)].long()
        k = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:n].double()
        v = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:n].double()
        group = num_heads // num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        probs = (torch.einsum("hd,nhd->hn", query[b].double(), k) * scale).softmax(-1)
        outs.append(torch.einsum("hn,nhd->hd", probs, v))
    return torch.stack(outs)


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.name)
def test_reference_matches_a_float64_loop_on_nan_poisoned_caches(case):
    paged = case.build(torch.float32)
    out = paged_decode_reference(*paged.args)
    assert torch.isfinite(out).all(), "the reference read a NaN-poisoned row"
    torch.testing.assert_close(out.double(), loop_reference(*paged.args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.name)
def test_torch_kernel_conforms(case, dtype):
    assert_matches_reference(TorchKernel().decode, case, dtype)


def test_explicit_scale_is_used():
    paged = make_paged_case([5, 9], 4, 2, 64, 8, torch.float32)
    out = TorchKernel().decode(*paged.args, scale=0.3)
    torch.testing.assert_close(out.double(), loop_reference(*paged.args, scale=0.3), atol=1e-5, rtol=1e-5)


def test_one_token_sequence_returns_its_value_row():
    # softmax over one key is 1: the output is that token's V row, whatever the query
    paged = make_paged_case([1], 4, 2, 64, 16, torch.float32)
    out = paged_decode_reference(*paged.args)
    block = int(paged.block_tables[0, 0])
    expected = paged.value_cache[block, 0].repeat_interleave(2, dim=0)
    torch.testing.assert_close(out[0], expected)


def test_bad_shapes_are_refused_with_the_reason():
    paged = make_paged_case([5], 6, 4, 64, 8, torch.float32)  # 6 query heads over 4 KV heads
    with pytest.raises(ValueError, match="multiple of KV heads"):
        paged_decode_reference(*paged.args)
    paged = make_paged_case([5], 4, 2, 64, 8, torch.float32)
    with pytest.raises(ValueError, match="int32"):
        paged_decode_reference(
            paged.query, paged.key_cache, paged.value_cache, paged.block_tables.long(), paged.seq_lens
        )


def test_plugin_module_imports_without_torch():
    # the simulator imports kernel plugins for their efficiency only: that must not pay for torch
    code = "import sys, kvbench_plugins.kernels.torch_ref; sys.exit(bool({'torch', 'triton'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
