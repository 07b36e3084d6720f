"""``kernel=flashinfer``: FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` (NVIDIA GPUs only).

kvbench's cache layout ``[num_blocks, block_size, H_kv, D]`` is FlashInfer's ``NHD`` paged layout,
so the caches are passed as they are; only the block tables are translated into FlashInfer's CSR
form by :func:`paged_kv_indices` (pure torch, tested on CPU). FlashInfer has no CPU backend: in
real mode on a machine without CUDA, :meth:`FlashInferKernel.decode` refuses with one line, while
``sim`` mode keeps working: from the calibration file where one exists, else on H100/H200 from the
transfer of SGLang's measured FlashInfer backend (:mod:`kvbench.exec.transfer`), else the roofline. ``flashinfer`` (a large import that may
JIT-compile) is imported only inside :meth:`FlashInferKernel.plan_decode`.

On the offline GPU machine FlashInfer comes from a prepared bundle (``docs/gpu.md``) whose prebuilt
modules cover the default CUDA-core decode path for float16/bfloat16 and head dims 64/128
(:data:`BUNDLED_VARIANTS`); anything else JIT-compiles there with nvcc (about 30 s each).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from kvbench import hookimpl
from kvbench.errors import ConfigError, require
from kvbench.kernels.kernel import Kernel

#: (dtype name, head dim) pairs whose decode module the offline bundle prebuilds (variants.txt)
BUNDLED_VARIANTS = frozenset((dtype, head_dim) for dtype in ("float16", "bfloat16") for head_dim in (64, 128))
BACKENDS = ("auto", "fa2")


def paged_kv_indices(block_tables, seq_lens, block_size: int):
    """Translate kvbench block tables into FlashInfer's ``(indptr, indices, last_page_len)``, all int32.

    ``indices[indptr[b]:indptr[b + 1]]`` are sequence ``b``'s pages in order (the first
    ``ceil(seq_lens[b] / block_size)`` entries of its block-table row; padding is dropped) and
    ``last_page_len[b]`` in ``1..block_size`` is how many rows of its last page hold tokens.
    Works on CPU or GPU tensors and returns tensors on the block tables' device.
    """
    import torch

    seq_lens = seq_lens.to(device=block_tables.device, dtype=torch.int64)
    if seq_lens.numel() and int(seq_lens.min()) < 1:
        raise ValueError("every sequence needs at least one token (FlashInfer's last_page_len is 1..page_size)")
    num_pages = (seq_lens + block_size - 1) // block_size
    if num_pages.numel() and int(num_pages.max()) > block_tables.shape[1]:
        raise ValueError(
            f"a sequence needs {int(num_pages.max())} blocks but block_tables has {block_tables.shape[1]} columns"
        )
    indptr = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=block_tables.device)
    indptr[1:] = torch.cumsum(num_pages, 0)
    live = torch.arange(block_tables.shape[1], device=block_tables.device)[None, :] < num_pages[:, None]
    indices = block_tables[live].to(torch.int32)  # boolean indexing is row-major: sequence by sequence
    last_page_len = (seq_lens - (num_pages - 1) * block_size).to(torch.int32)
    return indptr, indices, last_page_len


@dataclass
class FlashInferConfig:
    #: FlashInfer's tensor-core decode path (prefill kernels) instead of its CUDA-core decode
    #: kernel; the offline bundle prebuilds only the default (False), so True JIT-compiles there
    use_tensor_cores: bool = False
    #: float workspace FlashInfer's split-KV plan writes partial results into, in MiB (its docs use 128)
    workspace_mib: int = 128
    #: FlashInfer decode backend ("auto" picks FA2 on Hopper for this wrapper)
    backend: str = "auto"

    def validate(self) -> None:
        require(self.workspace_mib >= 16, "kernel.workspace_mib", self.workspace_mib, "use at least 16 MiB")
        require(self.backend in BACKENDS, "kernel.backend", self.backend, f"choose one of {', '.join(BACKENDS)}")


class FlashInferKernel(Kernel):
    """Paged decode through FlashInfer: plan (CSR page indices, split heuristics) then run."""

    name = "flashinfer"
    Config = FlashInferConfig
    requires_cuda = True

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self._wrappers: dict = {}  # device -> BatchDecodeWithPagedKVCacheWrapper (owns the workspace)

    @classmethod
    def unavailable_reason(cls, device_type: str) -> str | None:
        """Why real mode cannot run this kernel on ``device_type``, or None if it can."""
        if device_type != "cuda":
            return (
                f"kernel=flashinfer needs an NVIDIA GPU (CUDA) in real mode; tensors are on {device_type} and "
                "FlashInfer has no CPU backend (use mode=sim, or kernel=torch / kernel=triton)"
            )
        if importlib.util.find_spec("flashinfer") is None:
            return (
                "kernel=flashinfer needs the flashinfer-python package on this GPU machine "
                "(offline machines: install the prepared bundle, see docs/gpu.md)"
            )
        return None

    def _wrapper(self, device):
        import flashinfer
        import torch

        if device not in self._wrappers:
            config = self.config or FlashInferConfig()
            workspace = torch.empty(config.workspace_mib * 2**20, dtype=torch.uint8, device=device)
            self._wrappers[device] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_tensor_cores=config.use_tensor_cores, backend=config.backend
            )
        return self._wrappers[device]

    def plan_decode(self, query, key_cache, value_cache, block_tables, seq_lens, scale: float | None = None):
        """Translate the block tables and run FlashInfer's ``plan``; return a zero-argument callable that runs.

        Lets the kernel benchmark time the metadata preparation apart from the kernel itself.
        """
        reason = self.unavailable_reason(query.device.type)
        if reason:
            raise ConfigError(reason)
        import math

        from kvbench.kernels.layout import check_decode_inputs

        _, num_heads, num_kv_heads, head_dim, block_size = check_decode_inputs(
            query, key_cache, value_cache, block_tables, seq_lens
        )
        indptr, indices, last_page_len = paged_kv_indices(block_tables, seq_lens, block_size)
        wrapper = self._wrapper(query.device)
        wrapper.plan(
            indptr,
            indices,
            last_page_len,
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            q_data_type=query.dtype,
            kv_data_type=key_cache.dtype,
            sm_scale=1.0 / math.sqrt(head_dim) if scale is None else float(scale),
        )
        return lambda: wrapper.run(query, (key_cache, value_cache))

    def decode(self, query, key_cache, value_cache, block_tables, seq_lens, scale: float | None = None):
        return self.plan_decode(query, key_cache, value_cache, block_tables, seq_lens, scale)()


@hookimpl
def kvbench_register_kernels():
    return [FlashInferKernel]
