"""The FlashInfer plugin: block tables -> FlashInfer's CSR page indices (on CPU), the one-line refusal
without CUDA, and, on a GPU with flashinfer installed, the conformance suite."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from kvbench_plugins.kernels.flashinfer import (
    BUNDLED_VARIANTS,
    FlashInferConfig,
    FlashInferKernel,
    paged_kv_indices,
)
from kvbench_plugins.kernels.torch_ref import paged_decode_reference

from kvbench.errors import ConfigError
from kvbench.kernels.layout import make_paged_case
from kvbench.testing.kernels import DECODE_CASES, DTYPES, assert_matches_reference


def test_block_tables_become_indptr_indices_and_last_page_lengths():
    # block size 4: lengths 1 (one page, 1 row used), 8 (two full pages), 6 (two pages, 2 rows in the last)
    block_tables = torch.tensor([[7, 0, 0], [2, 5, 0], [9, 1, 4]], dtype=torch.int32)
    seq_lens = torch.tensor([1, 8, 6])
    indptr, indices, last_page_len = paged_kv_indices(block_tables, seq_lens, block_size=4)
    assert indptr.tolist() == [0, 1, 3, 5]
    assert indices.tolist() == [7, 2, 5, 9, 1]  # padding entries (and the unused 4) are dropped
    assert last_page_len.tolist() == [1, 4, 2]
    assert {t.dtype for t in (indptr, indices, last_page_len)} == {torch.int32}


def test_contiguous_layout_is_one_page_per_sequence():
    block_tables = torch.tensor([[0], [1], [2]], dtype=torch.int32)
    indptr, indices, last_page_len = paged_kv_indices(block_tables, torch.tensor([64, 7, 40]), block_size=64)
    assert (indptr.tolist(), indices.tolist(), last_page_len.tolist()) == ([0, 1, 2, 3], [0, 1, 2], [64, 7, 40])


def flashinfer_semantics_decode(query, key_cache, value_cache, indptr, indices, last_page_len, page_size):
    """What FlashInfer computes from its CSR indices (its documented page-table semantics), in float64."""
    outs = []
    group = query.shape[1] // key_cache.shape[2]
    for b in range(query.shape[0]):
        pages = indices[int(indptr[b]) : int(indptr[b + 1])].long()
        n = (len(pages) - 1) * page_size + int(last_page_len[b])
        k = key_cache[pages].flatten(0, 1)[:n].double().repeat_interleave(group, dim=1)
        v = value_cache[pages].flatten(0, 1)[:n].double().repeat_interleave(group, dim=1)
        probs = (torch.einsum("hd,nhd->hn", query[b].double(), k) / math.sqrt(query.shape[-1])).softmax(-1)
        outs.append(torch.einsum("hn,nhd->hd", probs, v))
    return torch.stack(outs)


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.name)
def test_translated_indices_select_exactly_the_reference_tokens(case):
    # Attention over the pages the translation names equals kvbench's reference on every
    # conformance case, NaN-poisoned padding included: the translation is right on CPU.
    paged = case.build(torch.float32)
    indptr, indices, last_page_len = paged_kv_indices(paged.block_tables, paged.seq_lens, case.block_size)
    assert 1 <= int(last_page_len.min()) and int(last_page_len.max()) <= case.block_size
    out = flashinfer_semantics_decode(
        paged.query, paged.key_cache, paged.value_cache, indptr, indices, last_page_len, case.block_size
    )
    assert torch.isfinite(out).all(), "the translation named a padding (NaN) page"
    torch.testing.assert_close(out.float(), paged_decode_reference(*paged.args), atol=1e-5, rtol=1e-5)


def test_translation_refuses_empty_sequences_and_narrow_tables():
    block_tables = torch.zeros((2, 2), dtype=torch.int32)
    with pytest.raises(ValueError, match="at least one token"):
        paged_kv_indices(block_tables, torch.tensor([3, 0]), block_size=4)
    with pytest.raises(ValueError, match="needs 3 blocks"):
        paged_kv_indices(block_tables, torch.tensor([3, 9]), block_size=4)


def test_without_cuda_real_mode_refuses_in_one_line_before_importing_flashinfer():
    paged = make_paged_case([3, 5], 4, 2, 64, 8, torch.float16)
    with pytest.raises(ConfigError) as err:
        FlashInferKernel().decode(*paged.args)
    message = str(err.value)
    assert "\n" not in message and "needs an NVIDIA GPU" in message and "mode=sim" in message
    assert FlashInferKernel.requires_cuda


def test_sim_mode_needs_no_gpu_and_reads_the_calibration(tmp_path, monkeypatch):
    import kvbench.specs.calibration as calibration

    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)
    assert not FlashInferKernel().decode_efficiency("h200", 16, contiguous=False).calibrated
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "flashinfer.json").write_text('{"efficiency": {"16": 0.8, "contiguous": 0.9}}')
    assert FlashInferKernel().decode_efficiency("h200", 16, contiguous=False).efficiency == 0.8


@pytest.mark.parametrize("field, value", [("workspace_mib", 1), ("backend", "cudnn")])
def test_config_values_are_range_checked(field, value):
    with pytest.raises(ConfigError, match=f"kernel.{field}"):
        FlashInferConfig(**{field: value}).validate()


def test_plugin_module_imports_without_torch_or_flashinfer():
    code = (
        "import sys, kvbench_plugins.kernels.flashinfer; "
        "sys.exit(bool({'torch', 'triton', 'flashinfer'} & set(sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---------------------------------------------------------------------------------------------------
# On a GPU: the conformance suite through FlashInfer itself.
# ---------------------------------------------------------------------------------------------------


def _gpu_skip_reason(case, dtype) -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU: FlashInfer has no CPU backend (its GPU checks run in gpu/run_kernel_checks.sh)"
    reason = FlashInferKernel.unavailable_reason("cuda")
    if reason:
        return reason
    name = str(dtype).removeprefix("torch.")
    if (name, case.head_dim) not in BUNDLED_VARIANTS and os.environ.get("KVBENCH_FLASHINFER_JIT") != "1":
        return (
            f"{name} x head_dim {case.head_dim} is not among the offline bundle's prebuilt decode modules "
            "(fp16/bf16 x 64/128); FlashInfer would JIT-compile it (~30 s; KVBENCH_FLASHINFER_JIT=1 allows that)"
        )
    return None


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.name)
def test_flashinfer_kernel_conforms_on_gpu(case, dtype):
    reason = _gpu_skip_reason(case, dtype)
    if reason:
        pytest.skip(reason)
    assert_matches_reference(FlashInferKernel().decode, case, dtype, device="cuda")
