"""A silicon row the validation tests share: an admissible dense row that kvbench's excerpt prices."""

from __future__ import annotations

NAN = float("nan")

#: Llama-3.1-8B on H100 with TRT-LLM, TP1, bf16, 2,048 prompt and 128 output tokens at batch 16
DENSE_ROW = {
    "id": "r",
    "backend": "trtllm",
    "model_path": "meta-llama/Llama-3.1-8B-Instruct",
    "system": "h100_sxm",
    "precision": NAN,
    "mode": "agg",
    "isl": 2048,
    "osl": 128,
    "gemm_quant_mode": NAN,
    "moe_quant_mode": NAN,
    "batch_size": 16.0,
    "tp_size": 1.0,
    "attention_dp_size": NAN,
    "moe_ep_size": NAN,
}
