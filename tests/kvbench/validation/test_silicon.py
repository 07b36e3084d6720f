"""kvbench.validation.silicon: which rows are replayed (and why not), and the overrides of a replay."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvbench.validation import silicon
from kvbench.validation.silicon import REASONS, Precision, admitted, precision, replay

NAN = math.nan


def _row(**changes) -> dict:
    """An admissible dense row (Llama-3.1-8B, H100, TRT-LLM, TP1, bf16) with ``changes``."""
    base = {
        "id": "r",
        "backend": "trtllm",
        "backend_version": "1.3.0rc1",
        "model_path": "meta-llama/Llama-3.1-8B-Instruct",
        "system": "h100_sxm",
        "precision": NAN,
        "mode": "agg",
        "isl": 1024,
        "osl": 128,
        "gemm_quant_mode": NAN,
        "moe_quant_mode": NAN,
        "batch_size": 16.0,
        "tp_size": 1.0,
        "pp_size": 1.0,
        "attention_dp_size": NAN,
        "moe_tp_size": NAN,
        "moe_ep_size": NAN,
        "silicon_ttft_ms": 100.0,
        "silicon_tpot_ms": 10.0,
    }
    return {**base, **changes}


DEEPSEEK = {
    "model_path": "deepseek-ai/DeepSeek-R1",
    "system": "h200_sxm",
    "precision": "fp8",
    "gemm_quant_mode": "fp8",
    "moe_quant_mode": "fp8_block",
}


def test_each_refused_row_is_counted_by_its_one_word_reason():
    rows = [
        _row(id="ok-dense"),
        _row(id="ok-dep", **DEEPSEEK, tp_size=1.0, attention_dp_size=8.0, moe_tp_size=1.0, moe_ep_size=8.0),
        _row(id="ok-unset-moe-tp", **DEEPSEEK, tp_size=8.0, moe_tp_size=0.0, moe_ep_size=8.0),
        _row(mode="disagg"),  # no layout per role
        _row(mode="disagg", model_path="nobody/else"),  # the first reason wins
        _row(model_path="nobody/else"),
        _row(system="l40s"),
        _row(system="a100_sxm", backend="sglang"),  # SGLang's kernel is not measured on the A100
        _row(silicon_tpot_ms=NAN),
        _row(batch_size=0.0),
        _row(pp_size=2.0),
        _row(**DEEPSEEK, tp_size=8.0, attention_dp_size=2.0, moe_tp_size=1.0, moe_ep_size=16.0),  # 16 GPUs
        _row(**DEEPSEEK, tp_size=4.0, moe_tp_size=2.0, moe_ep_size=1.0),  # 4 GPUs but 2 x 1 for the MoE
        _row(tp_size=2.0, attention_dp_size=2.0),  # a dense model with attention DP
        _row(model_path="openai/gpt-oss-120b", precision="fp8", gemm_quant_mode="fp8", moe_quant_mode="fp8"),
        _row(gemm_quant_mode="int3_magic"),
    ]
    kept, refused = admitted(pd.DataFrame(rows))
    assert list(kept["id"]) == ["ok-dense", "ok-dep", "ok-unset-moe-tp"]
    assert refused.to_dict() == {
        "unmodelled-model": 2,
        "unmodelled-gpu": 1,
        "unmeasured-engine": 1,
        "incomplete": 3,
        "pipeline": 1,
        "multinode": 1,
        "layout": 2,
        "precision": 2,
    }
    assert list(refused.index) == [r for r in REASONS if r in refused.index]  # REASONS' order
    for reason in refused.index:
        assert " " not in reason and reason in REASONS


def test_a_dense_rows_moe_columns_are_not_read():
    # the sample fills moe_tp/moe_ep on dense rows with whatever the launcher had: not a layout
    kept, refused = admitted(pd.DataFrame([_row(tp_size=2.0, moe_tp_size=1.0, moe_ep_size=2.0)]))
    assert len(kept) == 1 and refused.sum() == 0
    job = replay(kept.iloc[0], "profiled")
    assert "model.tp=2" in job.overrides
    assert not any(o.startswith(("model.ep=", "model.attention_dp=", "model.moe_dtype=")) for o in job.overrides)


def test_an_attention_dp_and_expert_parallel_row_replays_one_rank():
    row = pd.Series(
        _row(**DEEPSEEK, backend="trtllm", tp_size=1.0, attention_dp_size=8.0, moe_tp_size=1.0, moe_ep_size=8.0)
    )
    job = replay(row, "profiled")
    for override in (
        "model=deepseek-r1",
        "model.tp=1",
        "model.attention_dp=8",
        "model.ep=8",
        "model.dtype=fp8_block",  # labelled fp8: DeepSeek-R1's FP8 checkpoint is block-scaled
        "model.moe_dtype=fp8_block",
        "model.kv_dtype=bfloat16",  # the block-scaled checkpoint declares no KV quantization
        "hardware=h200",
        "kernel=trtllm",
        "kernel.gemm=fp8_block",
        # batch_size is the concurrency of one attention-DP rank: the deployment's client keeps
        # 8 x 16 in flight, and the simulated rank takes its round-robin share of 16
        "workload.max_concurrency=128",
        f"workload.num_requests={silicon.WAVES * 128}",
        "scheduler.max_num_seqs=16",
        "workload.prompt_tokens=1024",
        "workload.output_tokens=128",
    ):
        assert override in job.overrides, override
    roofline = replay(row, "roofline").overrides
    assert "kernel=torch" in roofline and not any(o.startswith("kernel.gemm") for o in roofline)


@pytest.mark.parametrize(
    ("changes", "moe", "expected"),
    [
        ({}, False, Precision("bfloat16", "bfloat16", None, "bfloat16")),
        ({"precision": "fp8", "gemm_quant_mode": "fp8"}, False, Precision("float8", "fp8", None, "float8")),
        # a block-scaled FP8 checkpoint declares no KV quantization: kv_cache_dtype=auto keeps bf16
        ({"gemm_quant_mode": "fp8_block"}, False, Precision("fp8_block", "fp8_block", None, "bfloat16")),
        (
            {"gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4"},
            True,
            Precision("nvfp4", "nvfp4", "nvfp4", "float8"),
        ),
        (  # DeepSeek-R1's FP8 checkpoint is block-scaled (128 x 128), whatever the fp8 label
            {"model_path": "deepseek-ai/DeepSeek-R1", "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8"},
            True,
            Precision("fp8_block", "fp8_block", "fp8_block", "bfloat16"),
        ),
        (  # Kimi-K2.5's int4 checkpoint: int4 experts, bf16 elsewhere, a bf16 KV cache
            {"precision": "int4", "gemm_quant_mode": "int4_wo", "moe_quant_mode": "int4_wo"},
            True,
            Precision("bfloat16", "bfloat16", "int4", "bfloat16"),
        ),
        (  # gpt-oss: labelled nvfp4, served from its MXFP4 checkpoint
            {"model_path": "openai/gpt-oss-120b", "precision": "fp4", "gemm_quant_mode": "nvfp4"},
            True,
            Precision("bfloat16", "bfloat16", "mxfp4", "bfloat16"),
        ),
    ],
)
def test_the_precision_of_each_part(changes, moe, expected):
    assert precision(_row(**changes), moe) == expected


def _disagg(**changes) -> dict:
    """An admissible disaggregated DeepSeek-R1 row on H200 under TRT-LLM: 2 prefill workers of
    TP1 x ADP8 x EP8 at batch 1, 4 decode workers of TP8 x EP8 at batch 8, concurrency 32."""
    base = _row(**DEEPSEEK, mode="disagg", isl=8192, osl=1024, batch_size=NAN, tp_size=NAN, pp_size=NAN)
    base["silicon_data_source"] = "source_file=x.csv; silicon_concurrency=32; measured=2026-01-01"
    for name, layout in (
        ("prefill", dict(batch_size=1.0, num_workers=2.0, tp_size=1.0, attention_dp_size=8.0, moe_ep_size=8.0)),
        ("decode", dict(batch_size=8.0, num_workers=4.0, tp_size=8.0, attention_dp_size=1.0, moe_ep_size=8.0)),
    ):
        base.update({f"{name}_{field}": value for field, value in layout.items()})
        base.update({f"{name}_pp_size": 1.0, f"{name}_moe_tp_size": 1.0})
    return {**base, **changes}


def test_each_refused_disaggregated_row_is_counted_by_its_one_word_reason():
    rows = [
        _disagg(id="ok"),
        _disagg(id="ok-nvl72", system="gb200", decode_tp_size=16.0, decode_moe_ep_size=16.0),  # one NVL72 rack
        _disagg(prefill_num_workers=NAN, decode_num_workers=NAN, prefill_batch_size=NAN, decode_batch_size=NAN),
        _disagg(decode_tp_size=NAN),
        _disagg(decode_pp_size=2.0),
        _disagg(decode_tp_size=16.0, decode_moe_ep_size=16.0),  # 16 GPUs: two HGX nodes
        _disagg(prefill_moe_ep_size=4.0),  # 8 GPUs but 1 x 4 for the MoE
        _disagg(gemm_quant_mode="int3_magic"),
    ]
    kept, refused = admitted(pd.DataFrame(rows))
    assert list(kept["id"]) == ["ok", "ok-nvl72"]
    assert refused.to_dict() == {
        "incomplete": 1,
        "unknown-workers": 1,
        "pipeline": 1,
        "multinode": 1,
        "layout": 1,
        "precision": 1,
    }


def test_the_nvlink_domain_is_a_rack_where_nvlink_joins_its_nodes():
    assert silicon.nvlink_domain_gpus("gb200") == silicon.nvlink_domain_gpus("gb300") == 72
    assert silicon.nvlink_domain_gpus("h200_sxm") == silicon.nvlink_domain_gpus("b200_sxm") == 8
    assert silicon.gpus_per_node("gb200") == 4  # a compute tray, what the aggregated rows are held to


def test_the_concurrency_is_the_samples_else_the_decode_sides_requests():
    assert silicon.disagg_concurrency(pd.Series(_disagg())) == 32
    # no silicon_concurrency: decode_batch_size x decode_attention_dp_size x decode_num_workers
    row = pd.Series(_disagg(silicon_data_source=NAN, decode_attention_dp_size=2.0, decode_tp_size=4.0))
    assert silicon.disagg_concurrency(row) == 8 * 2 * 4


def test_a_disaggregated_row_replays_its_workers_layouts_and_client_divided_by_their_gcd():
    job = replay(pd.Series(_disagg()), "profiled")
    assert job.overrides == (
        "model=deepseek-r1",
        "model.dtype=fp8_block",
        "model.kv_dtype=bfloat16",
        "model.moe_dtype=fp8_block",
        "hardware=h200",
        "hardware.kv_budget_bytes=null",
        "kernel=trtllm",
        "scheduler=chunked",
        "scheduler.max_num_batched_tokens=8192",
        "deployment=disagg",
        # 2 prefill + 4 decode workers at 32 in flight: two copies of 1 + 2 at 16
        "deployment.prefill_workers=1",
        "deployment.decode_workers=2",
        "deployment.transfer=after_prefill",
        "deployment.link=auto",
        "deployment.prefill.tp=1",
        "deployment.prefill.attention_dp=8",
        "deployment.prefill.ep=8",
        "deployment.prefill.max_num_seqs=1",
        "deployment.prefill.max_num_batched_tokens=8192",
        "deployment.decode.tp=8",
        "deployment.decode.attention_dp=1",
        "deployment.decode.ep=8",
        "deployment.decode.max_num_seqs=8",
        "router=round_robin",
        "workload=closed_loop",
        "workload.max_concurrency=16",
        f"workload.num_requests={silicon.WAVES * 16}",
        "workload.prompt_tokens=8192",
        "workload.output_tokens=1024",
        "workload.s_max_tokens=9216",
        "progress=false",
        "output.write=false",
        "wandb.mode=disabled",
        "kernel.gemm=fp8_block",
    )
    # coprime worker counts: the deployment as it ran
    odd = replay(pd.Series(_disagg(prefill_num_workers=3.0, silicon_data_source=NAN)), "profiled").overrides
    assert {"deployment.prefill_workers=3", "deployment.decode_workers=4", "workload.max_concurrency=32"} <= set(odd)


def test_a_dense_disaggregated_row_names_no_attention_dp_or_experts():
    row = _disagg(model_path="Qwen/Qwen3-32B", system="h100_sxm", backend="vllm", precision=NAN)
    row.update(gemm_quant_mode=NAN, moe_quant_mode=NAN, prefill_attention_dp_size=1.0, prefill_tp_size=2.0)
    kept, _ = admitted(pd.DataFrame([row]))
    job = replay(kept.iloc[0], "roofline")
    assert "deployment.prefill.tp=2" in job.overrides and "kernel=torch" in job.overrides
    assert not any(".attention_dp=" in o or ".ep=" in o or "moe_dtype" in o for o in job.overrides)


def test_a_replay_shares_kvbench_s_scheduler_unless_told_to_schedule_as_its_framework():
    row = pd.Series(_row())  # TRT-LLM on H100
    framework = replay(row, "profiled", schedulers="framework").overrides
    assert framework[0] == "engine=trtllm" and "scheduler=chunked" not in framework
    assert "scheduler.max_num_seqs=16" in framework  # the row's own batch stays on top of the preset
    shared = replay(row, "profiled").overrides
    assert "scheduler=chunked" in shared and not any(o.startswith("engine=") for o in shared)
    sglang = replay(pd.Series(_row(backend="sglang", system="h200_sxm")), "profiled", schedulers="framework")
    assert sglang.overrides[0] == "engine=sglang"
    # TRT-LLM runs a prompt whole: a longer prompt than its 8,192 tokens a step raises the budget to it
    long = replay(pd.Series(_row(isl=15000)), "profiled", schedulers="framework").overrides
    assert "scheduler.max_num_batched_tokens=15000" in long
    with pytest.raises(silicon.ConfigError, match="choose one of shared, framework"):
        replay(row, "profiled", schedulers="vllm")
