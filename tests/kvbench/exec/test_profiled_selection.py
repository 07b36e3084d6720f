"""Which measured rows the profiled clock reads: every table it selects covers the lengths a real
run asks for, and a stand-in for a layout or model variant the tables never measured is named
and counted."""

from __future__ import annotations

import pytest
from kvbench_plugins.kernels.measured import MEASURED_KERNELS

from kvbench.api import build, compose, model_spec_of
from kvbench.exec.profiled import select_tables, table_kv_dtype
from kvbench.specs import profiles

#: the longest prompt every prefill table must have measured (a real prompt is never priced
#: beyond the rows for every length: the silicon rows' prompts reach 8,192 tokens)
PROMPT_TOKENS = 8192


@pytest.mark.parametrize(
    ("kernel", "system"),
    # sglang_triton measured other head shapes than Llama's on Hopper (the excerpt keeps none of it)
    [
        (k.name, s)
        for k in MEASURED_KERNELS
        for s in k.measured.sources
        if s in profiles.SYSTEMS.values() and k.name != "sglang_triton"
    ],
)
def test_every_measured_kernels_prefill_rows_cover_real_prompts(kernel, system):
    cls = next(k for k in MEASURED_KERNELS if k.name == kernel)
    hardware = next(h for h, s in profiles.SYSTEMS.items() if s == system)
    cfg = compose(["model=llama3.1-8b", f"hardware={hardware}"])[0]
    model = model_spec_of(cfg)
    selected = select_tables(cls.measured, system, model, "bfloat16", table_kv_dtype(model))
    assert selected.prefill["isl"].max() >= PROMPT_TOKENS
    assert selected.decode["step"].max() >= PROMPT_TOKENS


@pytest.mark.parametrize("hardware", ["b200-sxm", "b300-sxm", "gb200", "gb300"])
def test_vllm_on_blackwell_prices_prefill_from_its_prefill_kernel(hardware):
    cost = build(["model=llama3.1-70b", "model.tp=4", f"hardware={hardware}", "kernel=vllm_fa3"]).cost
    assert "vllm_flashinfer_trtllmdecode/vllm_flashinfer_trtllmprefill" in cost.source
    prefill_s = cost.prefill_chunk_time_s(2048, 0)
    assert cost.extrapolated == 0  # 2,048 tokens lie inside the prefill kernel's rows
    # a 70B model's 2,048-token prefill on 4 Blackwell GPUs takes tens of milliseconds (the decode
    # kernel's one-token rows extrapolated it to thousands of seconds)
    assert 5e-3 < prefill_s < 0.5


@pytest.mark.parametrize("hardware", ["h200", "b200-sxm"])
def test_vllm_mla_prefill_comes_from_the_kernel_measured_over_full_prompts(hardware):
    cost = build(["model=deepseek-v3", f"hardware={hardware}", "kernel=vllm_fa3"]).cost
    curve = cost.tables.arch.mla[1]
    assert curve.isl[-1] >= PROMPT_TOKENS
    before = cost.extrapolated
    prefill_s = cost.prefill_chunk_time_s(4096, 0)
    assert cost.extrapolated == before
    assert 5e-3 < prefill_s < 2.0


@pytest.mark.parametrize(("hardware", "checkpoint"), [("h200", "zai-org/GLM-5-FP8"), ("b200-sxm", "zai-org/GLM-5-FP8")])
def test_glm5_on_sglang_reads_the_rows_of_a_checkpoint_with_its_attention_shapes(hardware, checkpoint):
    cost = build(["model=glm-5", f"hardware={hardware}", "kernel=sglang_fa3"]).cost
    assert f"{checkpoint} stands in for zai-org/GLM-5" in cost.source
    decode, prefill = cost.tables.arch.mla
    rows = profiles.read_table(
        profiles.SYSTEMS[hardware], "sparse_attention", "sglang", "0.5.14", "dsa_generation_module_perf"
    )
    rows = rows[(rows["model"] == checkpoint) & (rows["gemm_type"] == "fp8_block") & (rows["num_heads"] == 8)]
    rows = rows[(rows["kv_cache_dtype"] == "bfloat16") & (rows["batch_size"] == 1)]
    step = int(rows["step"].iloc[0])
    expected_s = float(rows[rows["step"] == step]["latency"].median()) * 1e-3
    assert float(decode.latency_s(1, [float(step)])[0]) == pytest.approx(expected_s, rel=1e-12)
    assert prefill.isl[-1] >= 8192  # the sparse prefill, not the dense path SGLang runs to 2,048 tokens


def test_an_nvfp4_glm5_reads_the_nvfp4_checkpoints_bf16_attention():
    cost = build(
        ["model=glm-5", "hardware=b200-sxm", "kernel=sglang_fa3", "model.dtype=nvfp4", "model.moe_dtype=nvfp4"]
    ).cost
    label = next(part for part in cost.source.split(", ") if part.startswith("sparse_attention"))
    assert " bfloat16 " in label and "nvidia/GLM-5.2-NVFP4 stands in" in label


def test_a_sparse_attention_shape_no_table_measured_is_one_line():
    from kvbench.errors import ConfigError
    from kvbench.exec import profiled_mla

    model = model_spec_of(compose(["model=glm-5"])[0])
    assert profiled_mla.dsa_architecture(model.mla, model.indexer, model.hidden_size) == "GlmMoeDsaForCausalLM"
    with pytest.raises(ConfigError, match="no sparse-attention module table measured") as info:
        profiled_mla.dsa_architecture(model.mla, model.indexer, 4096)
    assert "\n" not in str(info.value)


MINIMAX_MOE = dict(hidden_size=3072, inter_size=1536, topk=8, num_experts=256, moe_dtype="fp8_block")


def test_an_unmeasured_moe_layout_is_the_nearest_measured_per_gpu_work_scaled_and_counted():
    from kvbench.exec import profiled, profiled_moe

    layout = dict(distribution="power_law_1.2", moe_ep=1)
    # vLLM's tables measured MiniMax-M2.5's block-scaled experts at moe_tp 1, 2 and 4, not 8
    rows, label = profiled_moe.select_moe("h200_sxm", "vllm", **MINIMAX_MOE, **layout, moe_tp=8)
    measured, _ = profiled_moe.select_moe("h200_sxm", "vllm", **MINIMAX_MOE, **layout, moe_tp=4)
    assert "layout 8x1 never measured: layout 4x1 scaled by 4/8 stands in" in label
    counter = profiled._Counter()
    grid, reference = profiled_moe.MoEGrid(rows, counter), profiled_moe.MoEGrid(measured, profiled._Counter())
    for tokens in (1, 64, 4096):
        assert grid.latency_s(tokens) == pytest.approx(reference.latency_s(tokens) / 2, rel=1e-12)
    assert counter.count == 3  # every lookup of a stand-in is counted
    reference.latency_s(64)
    assert reference.counter.count == 0  # a measured layout is not


def test_a_moe_layout_measured_as_its_per_gpu_slice_reads_that_slice_unscaled(monkeypatch):
    import pandas as pd

    from kvbench.exec import profiled_moe

    def row(inter_size, moe_tp, tokens, latency_ms):
        return dict(
            hidden_size=64,
            inter_size=inter_size,
            topk=2,
            num_experts=8,
            moe_dtype="bfloat16",
            distribution="power_law_1.2",
            moe_tp_size=moe_tp,
            moe_ep_size=1,
            kernel_source="k",
            num_tokens=tokens,
            latency=latency_ms,
        )

    # the 256-wide experts were measured at moe_tp 1 only; a 128-wide shape at moe_tp 1 runs exactly
    # what one GPU of the 256-wide experts at moe_tp 2 runs
    frame = pd.DataFrame([row(256, 1, 8, 1.0), row(256, 1, 64, 3.0), row(128, 1, 8, 0.7), row(128, 1, 64, 1.6)])
    monkeypatch.setattr(profiles, "versions", lambda *args: ["1.0"])
    monkeypatch.setattr(profiles, "read_table", lambda *args: frame)
    shape = dict(hidden_size=64, inter_size=256, topk=2, num_experts=8, moe_dtype="bfloat16")
    rows, label = profiled_moe.select_moe("sys", "fw", **shape, moe_tp=2, moe_ep=1, distribution="power_law_1.2")
    assert "inter_size=128 at layout 1x1 stands in" in label
    assert sorted(rows["latency"]) == [0.7, 1.6]


def test_gpt_oss_on_trtllm_at_moe_tp_2_is_priced_by_its_moe_tp_1_rows():
    cost = build(["model=gpt-oss-120b", "model.tp=2", "hardware=b200-sxm", "kernel=trtllm"]).cost
    assert "layout 2x1 never measured: layout 1x1 scaled by 1/2 stands in" in cost.source
    before = cost.extrapolated
    assert 1e-3 < cost.decode_time_s(16 * 1024, 16) < 0.1
    assert cost.extrapolated > before


def test_gpt_oss_on_trtllm_runs_its_mxfp4_experts_on_mxfp8_activations_on_blackwell_only():
    # TRT-LLM's gpt-oss deployment guide: MXFP8 activations on Blackwell, bf16 on Hopper
    blackwell = build(["model=gpt-oss-120b", "hardware=b200-sxm", "kernel=trtllm"]).cost
    hopper = build(["model=gpt-oss-120b", "hardware=h200", "kernel=trtllm"]).cost
    assert "moe moe_torch_flow w4a8_mxfp4_mxfp8" in blackwell.source
    assert "moe moe_torch_flow w4a16_mxfp4" in hopper.source


def test_a_sparse_prefill_curve_is_of_whole_prompts_not_prompts_after_a_cached_prefix():
    cost = build(["model=glm-5", "hardware=h200", "kernel=sglang_fa3"]).cost
    prefill = cost.tables.arch.mla[1]
    rows = profiles.read_table("h200_sxm", "sparse_attention", "sglang", "0.5.14", "dsa_context_module_perf")
    rows = rows[(rows["model"] == "zai-org/GLM-5-FP8") & (rows["num_heads"] == 8) & (rows["gemm_type"] == "fp8_block")]
    rows = rows[(rows["kv_cache_dtype"] == "bfloat16") & (rows["mla_dtype"] == "bfloat16") & (rows["step"] == 0)]
    rows = rows[(rows["kernel_source"] == "sglang_dsa_indexer_flashmla_sparse") & (rows["batch_size"] == 1)]
    expected_s = float(rows[rows["isl"] == 4096]["latency"].median()) * 1e-3
    assert prefill.full_s(4096) == pytest.approx(expected_s, rel=1e-12)


def test_a_short_sparse_prefill_reads_the_dense_path_sglang_runs_below_the_indexers_top_k():
    cost = build(["model=glm-5", "hardware=h200", "kernel=sglang_fa3"]).cost
    assert "sglang_dsa_dense_mha_fa3 below isl" in cost.source
    prefill = cost.tables.arch.mla[1]
    rows = profiles.read_table("h200_sxm", "sparse_attention", "sglang", "0.5.14", "dsa_context_module_perf")
    rows = rows[(rows["model"] == "zai-org/GLM-5-FP8") & (rows["num_heads"] == 8) & (rows["gemm_type"] == "fp8_block")]
    rows = rows[(rows["kv_cache_dtype"] == "bfloat16") & (rows["step"] == 0) & (rows["batch_size"] == 1)]
    dense = rows[(rows["kernel_source"] == "sglang_dsa_dense_mha_fa3") & (rows["isl"] == 1024)]
    assert prefill.full_s(1024) == pytest.approx(float(dense["latency"].median()) * 1e-3, rel=1e-12)


@pytest.mark.parametrize("hardware", ["h200", "b200-sxm"])
def test_vllm_prices_block_fp8_gemms_by_their_work(hardware):
    # vLLM's fp8_block rows are flat in the tokens (0.17 ms for 8 or 4,096 on B200): kvbench
    # prices block-scaled FP8 weights from the per-tensor FP8 rows, which read the same bytes
    cost = build(["model=minimax-m2.5", f"hardware={hardware}", "kernel=vllm_fa3"]).cost  # its tp 4: in the excerpt
    assert "fp8 (pricing fp8_block)" in cost.source
    gemm = cost.tables.gemm
    # a GEMM with 512 times the tokens (and FLOPs) takes several times as long
    assert gemm.latency_s(4096, 4096, 3072) > 4 * gemm.latency_s(8, 4096, 3072)
