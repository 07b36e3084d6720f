"""Measured kernels: decode attention as public measurements of real GPUs timed it.

Each kernel here is named by what was measured, never by a kvbench kernel: the tables of
NVIDIA's aiconfigurator-core (:mod:`kvbench.specs.profiles`) time vLLM's FlashAttention builds,
SGLang's FlashAttention-3 and Triton backends and TRT-LLM's attention on A100, H100 and H200.
Picking one prices every step of a ``mode=sim`` run from those tables (the profiled clock,
:mod:`kvbench.exec.profiled`): its attention, and the GEMMs and all-reduces of the same framework.
They have no code to run, so ``mode=real`` refuses them. kvbench's own ``triton`` and
``flashinfer`` kernels are priced on H100/H200 by a transfer from SGLang's Triton and FlashInfer
tables (:mod:`kvbench.exec.transfer`) until a GPU run calibrates them (``gpu/run_all.sh``).

``kernel.gemm`` picks the weights' GEMM table: ``auto`` follows ``model.dtype`` (float8: the
per-tensor FP8 GEMMs; fp8_block and nvfp4 their own; otherwise bf16), or name ``bfloat16``, ``fp8``,
``fp8_block`` or ``nvfp4``
(block-scaled FP8, as DeepSeek-style FP8 checkpoints and SGLang's FP8 quantization use).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvbench import hookimpl
from kvbench.errors import require
from kvbench.kernels.kernel import Kernel
from kvbench.specs.profiles import GEMM_DTYPES, MeasuredKernel

GEMM_CHOICES = ("auto", *GEMM_DTYPES)
#: model.dtype -> the GEMM table's dtype under kernel.gemm=auto (float8: per-tensor FP8)
MODEL_GEMM_DTYPES = {"float8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}

VLLM_GEMMS = {
    "bfloat16": ("torch.nn.functional.linear", "vllm_default"),
    "fp8": ("CutlassFP8ScaledMMLinearKernel",),
    "fp8_block": ("DeepGemmFp8BlockScaledMMKernel",),
    "nvfp4": ("FlashInferCuteDslNvFp4LinearKernel",),
}
#: vLLM's block-scaled FP8 GEMMs are priced from its per-tensor FP8 rows (CUTLASS): the tables'
#: fp8_block rows time the host, not the GPU. DeepGemmFp8BlockScaledMMKernel takes 0.172 ms for an
#: 8 x 4096 x 3072 GEMM on B200 and 0.175 ms for 4096 x 4096 x 3072 (512 times the FLOPs; the
#: per-tensor kernel 0.008 and 0.078 ms), 0.28-0.33 ms flat on GB200/GB300, and on H100/H200 the
#: FlashInfer lane (m <= 8) and DeepGEMM lane (m >= 64) sit at 0.06-0.09 ms flat: a launch cost that
#: vLLM's CUDA-graph decode does not pay. Both read the same FP8 weights (the block scales add 4
#: bytes per 128 x 128 tile) and do the same FLOPs. MiniMax-M2.5's silicon rows (fp8_block, vLLM
#: 0.19, B200 TP2 batch 8) measure 10.8 ms a step; the fp8_block rows price 29.7 ms, the per-tensor 9.0.
VLLM_GEMM_ROWS = {"fp8_block": "fp8"}
SGLANG_GEMMS = {
    "bfloat16": ("sglang_torch_linear", "sglang"),
    "fp8": ("sglang_sgl_kernel_fp8_scaled_mm", "sglang"),
    "fp8_block": ("sglang_deepgemm_gemm_nt_f8f8bf16", "sglang"),
    "nvfp4": ("sglang_flashinfer_cutedsl_nvfp4",),
}
#: TRT-LLM's block-scaled FP8 GEMM is DeepGEMM on Blackwell (the only one its tables hold there)
TRTLLM_GEMMS = {dtype: ("torch_flow",) for dtype in GEMM_DTYPES}


@dataclass
class MeasuredKernelConfig:
    #: the weights' GEMM table: auto (from model.dtype), bfloat16, fp8 or fp8_block
    gemm: str = "auto"

    def validate(self) -> None:
        require(self.gemm in GEMM_CHOICES, "kernel.gemm", self.gemm, f"choose one of {', '.join(GEMM_CHOICES)}")


class MeasuredAttention(Kernel):
    """A kernel known only by its measurements: sim mode prices it from them."""

    Config = MeasuredKernelConfig
    measured: ClassVar[MeasuredKernel]
    #: what the tables call it, for the docs and ``kvbench profiles``
    description: ClassVar[str]

    @classmethod
    def unavailable_reason(cls, device_type: str) -> str | None:
        return (
            f"kernel={cls.name} is a public measurement of {cls.description}, priced in mode=sim only; "
            "pick kernel=torch, triton or flashinfer to run one"
        )

    def gemm_dtype(self, model_dtype: str) -> str:
        if self.config is not None and self.config.gemm != "auto":
            return self.config.gemm
        return MODEL_GEMM_DTYPES.get(model_dtype, "bfloat16")


def _kernel(
    name: str,
    description: str,
    framework: str,
    sources: dict,
    gemms: dict,
    allreduce: str,
    prefill_sources: dict | None = None,
    gemm_rows: dict | None = None,
) -> type:
    measured = MeasuredKernel(framework, sources, gemms, allreduce, prefill_sources or {}, gemm_rows or {})
    return type(
        f"Measured_{name}",
        (MeasuredAttention,),
        {
            "name": name,
            "measured": measured,
            "description": description,
            "__doc__": f"``kernel={name}``: {description}.",
        },
    )


H100_H200 = ("h100_sxm", "h200_sxm")
#: the Blackwell systems the tables measured (B200, B300 and the Grace-Blackwell GB200, GB300)
BLACKWELL = ("b200_sxm", "b300_sxm", "gb200", "gb300")
MEASURED_KERNELS = [
    _kernel(
        "vllm_fa3",
        "vLLM's default attention backend: FlashAttention-3 on H100/H200 (vllm_flash_attn_fa3), FlashInfer's "
        "TRT-LLM kernels on Blackwell (vllm_flashinfer_trtllmdecode, prefill vllm_flashinfer_trtllmprefill), "
        "vLLM 0.24.0",
        "vllm",
        {**dict.fromkeys(H100_H200, "vllm_flash_attn_fa3"), **dict.fromkeys(BLACKWELL, "vllm_flashinfer_trtllmdecode")},
        VLLM_GEMMS,
        "vLLM_custom_graph",
        # the tables split FlashInfer's lane on Blackwell: its decode name's prefill rows are isl=1 only
        dict.fromkeys(BLACKWELL, "vllm_flashinfer_trtllmprefill"),
        VLLM_GEMM_ROWS,
    ),
    _kernel(
        "vllm_fa2",
        "vLLM's FlashAttention-2 decode on A100 (vllm_flash_attn, vLLM 0.14.0)",
        "vllm",
        {"a100_sxm": "vllm_flash_attn"},
        VLLM_GEMMS,
        "vLLM_custom_graph",
        gemm_rows=VLLM_GEMM_ROWS,
    ),
    _kernel(
        "sglang_fa3",
        "SGLang's default attention backend: FlashAttention-3 on H100/H200 (fa3), TRT-LLM's MHA kernels on "
        "Blackwell, where FA3 does not run (trtllm_mha), SGLang 0.5.14",
        "sglang",
        {**dict.fromkeys(H100_H200, "fa3"), **dict.fromkeys(BLACKWELL, "trtllm_mha")},
        SGLANG_GEMMS,
        "SGLang_CustomAllReduce_graph",
    ),
    _kernel(
        "sglang_triton",
        "SGLang's Triton attention backend (triton, SGLang 0.5.14)",
        "sglang",
        dict.fromkeys((*H100_H200, *BLACKWELL), "triton"),
        SGLANG_GEMMS,
        "SGLang_CustomAllReduce_graph",
    ),
    _kernel(
        "trtllm",
        "TRT-LLM's PyTorch-flow attention (torch_flow: TRT-LLM 1.3.0rc20 on H100/H200/Blackwell, 1.0.0 on A100)",
        "trtllm",
        dict.fromkeys(("a100_sxm", *H100_H200, *BLACKWELL), "torch_flow"),
        TRTLLM_GEMMS,
        "TRTLLM",
    ),
]


@hookimpl
def kvbench_register_kernels():
    return MEASURED_KERNELS
