"""The profiled clock: measured tables price every step, exactly where measured, explicitly outside."""

from __future__ import annotations

import numpy as np
import pytest
from recording_collective import RecordingCollective

from kvbench.api import build, run
from kvbench.errors import ConfigError
from kvbench.exec import profiled
from kvbench.specs import profiles

QUICK = ["progress=false", "output.write=false", "wandb.mode=disabled", "workload.num_requests=60"]


def _decode_frame(kernel="vllm_flash_attn_fa3", framework="vllm", system="h100_sxm"):
    version = profiles.versions(system, "attention", framework, "generation_attention_perf")[-1]
    g = profiles.read_table(system, "attention", framework, version, "generation_attention_perf")
    pick = (
        (g.kernel_source == kernel)
        & (g.num_heads == 32)
        & (g.num_key_value_heads == 8)
        & (g.head_dim == 128)
        & (g.kv_cache_dtype == "bfloat16")
        & (g.window_size == 0)
    )
    return g[pick]


def test_decode_grid_returns_the_measurements_at_grid_points_and_counts_what_lies_beyond():
    frame = _decode_frame()
    counter = profiled._Counter()
    grid = profiled.DecodeAttentionGrid(frame, 2 * 8 * 128 * 2, counter)
    for _, row in frame.sample(20, random_state=0).iterrows():
        got = grid.latency_s(int(row.batch_size), np.array([float(row.step)]))[0]
        assert got == pytest.approx(row.latency * 1e-3, rel=1e-12)
    assert counter.count == 0
    longest = frame[frame.batch_size == 64].step.max()
    beyond = grid.latency_s(64, np.array([2.0 * longest]))[0]
    at_edge = grid.latency_s(64, np.array([float(longest)]))[0]
    assert beyond > at_edge and counter.count == 1  # grows at the table's best bandwidth, and is counted


def test_a_mixed_batch_priced_at_its_mean_context_is_close_to_its_halves():
    """The measured rows are nearly linear in context length where bandwidth binds, which is what
    pricing a batch at its mean context assumes: half the batch at s1 and half at s3 against the
    whole batch at (s1 + s3) / 2."""
    errors = []
    for _, part in _decode_frame().groupby("batch_size"):
        row = part.groupby("step").latency.median().sort_index()
        s, lat = row.index.to_numpy(float), row.to_numpy()
        for i in range(len(s) - 2):
            if s[i] >= 1023:
                halves = (lat[i] + lat[i + 2]) / 2
                errors.append(abs(np.interp((s[i] + s[i + 2]) / 2, s, lat) - halves) / halves)
    assert len(errors) >= 20
    assert np.median(errors) < 0.05 and max(errors) < 0.25


def test_gemm_grid_is_exact_on_the_grid_and_linear_between():
    version = profiles.versions("h100_sxm", "gemm", "vllm", "gemm_perf")[-1]
    g = profiles.read_table("h100_sxm", "gemm", "vllm", version, "gemm_perf")
    g = g[(g.gemm_dtype == "bfloat16") & (g.kernel_source == "torch.nn.functional.linear")]
    grid = profiled.GemmGrid(g, profiled._Counter())
    for _, row in g.sample(20, random_state=1).iterrows():
        assert grid.latency_s(int(row.m), int(row.n), int(row.k)) == pytest.approx(row.latency * 1e-3, rel=1e-12)
    n0, n1 = grid.ns[-3], grid.ns[-2]
    k = grid.ks[-2]
    middle = grid.latency_s(256, (n0 + n1) // 2, k)
    assert min(grid.latency_s(256, n0, k), grid.latency_s(256, n1, k)) <= middle
    assert middle <= max(grid.latency_s(256, n0, k), grid.latency_s(256, n1, k))


def test_the_excerpt_prices_exactly_as_the_package(monkeypatch):
    pytest.importorskip("aiconfigurator_core")
    overrides = ["kernel=trtllm", "model=llama3.1-8b", "model.tp=2", "hardware.kv_budget_bytes=null", *QUICK]
    package = run(overrides).summary
    monkeypatch.setenv(profiles.SOURCE_VARIABLE, "excerpt")
    profiles.table_root.cache_clear()
    profiles.read_table.cache_clear()
    try:
        excerpt = run(overrides).summary
    finally:
        profiles.table_root.cache_clear()
        profiles.read_table.cache_clear()
    assert excerpt["calibration"].startswith("kvbench's excerpt")
    assert package["tpot_mean_s"] == excerpt["tpot_mean_s"] and package["ttft_mean_s"] == excerpt["ttft_mean_s"]


def test_measured_kernels_give_different_rows_and_name_their_tables():
    """On the defaults (Llama-2-7B, whose MHA shape SGLang and TRT-LLM were measured with)."""
    rows = {k: run([f"kernel={k}", "hardware=h100-sxm", *QUICK]).summary for k in ("sglang_fa3", "trtllm", "triton")}
    assert rows["sglang_fa3"]["tpot_mean_s"] != rows["trtllm"]["tpot_mean_s"]
    for k, source in (("sglang_fa3", "sglang 0.5.14 fa3"), ("trtllm", "trtllm 1.3.0rc20 torch_flow")):
        assert rows[k]["clock"] == "profiled"
        assert f"h100_sxm {source}" in rows[k]["calibration"] and "aiconfigurator-core 0.12.0" in rows[k]["calibration"]
    # kvbench's own kernel, never measured on H100, is priced by the transfer (test_transfer.py)
    assert rows["triton"]["clock"] == "transfer" and rows["triton"]["calibration"].startswith("transfer: triton")
    vllm = run(["kernel=vllm_fa3", "model=llama3.1-8b", "hardware.kv_budget_bytes=null", *QUICK]).summary
    assert "vllm 0.24.0 vllm_flash_attn_fa3" in vllm["calibration"]


def test_real_mode_refuses_a_measured_kernel_in_one_line():
    with pytest.raises(ConfigError) as err:
        build(["mode=real", "kernel=vllm_fa3"])
    assert "mode=sim only" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["kernel=vllm_fa3", "hardware=a100-40gb"], "no public measured tables"),
        (["kernel=vllm_fa2", "hardware=h100-sxm"], "not measured on h100_sxm"),
        (
            # SGLang's Triton backend was measured with head_dim 256/512 only: the full tables name
            # those shapes; kvbench's excerpt keeps only its own models' shapes, so it has none of
            # them and says where the full tables are
            ["kernel=sglang_triton", "model=llama3.1-8b", "hardware.kv_budget_bytes=null"],
            "for the full tables" if profiles.table_root().excerpt else "kernel_source=triton was measured",
        ),
        (["kernel=vllm_fa3", "kernel.gemm=int4"], "kernel.gemm"),
    ],
)
def test_what_was_not_measured_is_one_line(overrides, words):
    with pytest.raises(ConfigError) as err:
        build(overrides)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_fp8_kv_doubles_the_sequences_paged_holds_at_the_same_budget():
    base = ["model=llama3.1-8b", "allocator=paged", "hardware.kv_budget_bytes=40e9"]
    bf16, fp8 = build(base), build([*base, "model.kv_dtype=float8"])
    assert fp8.model.kv_bytes_per_token * 2 == bf16.model.kv_bytes_per_token
    assert fp8.budget_bytes == bf16.budget_bytes
    assert fp8.allocator.num_blocks == 2 * bf16.allocator.num_blocks


def test_tensor_parallelism_halves_the_weights_and_kv_heads_per_gpu():
    one, two = (build(["model=llama3.1-8b", f"model.tp={tp}", "hardware=h200"]) for tp in (1, 2))
    assert two.model.weight_bytes * 2 == one.model.weight_bytes
    assert two.model.kv_bytes_per_token * 2 == one.model.kv_bytes_per_token
    assert two.budget_bytes > one.budget_bytes  # the weights' half left more room for KV on each GPU
    eight = build(["model=llama3.1-8b", "model.tp=8", "hardware=h200"])
    assert eight.model.kv_heads_per_gpu == 1  # 8 KV heads over 8 GPUs


def test_tensor_parallelism_that_does_not_split_the_heads_is_one_line():
    with pytest.raises(ConfigError) as err:
        build(["model=llama3.1-8b", "model.tp=3"])
    assert "model.tp" in str(err.value)
    with pytest.raises(ConfigError):
        build(["model=llama3.1-8b", "model.tp=16"])


def test_profiled_prices_all_reduces_under_tensor_parallelism():
    s = build(["kernel=vllm_fa3", "model=llama3.1-8b", "model.tp=2", "hardware=h200"])
    assert "all-reduce vLLM_custom_graph" in s.cost.source
    alone = build(["kernel=vllm_fa3", "model=llama3.1-8b", "hardware=h200"])
    assert alone.cost.tables.allreduce is None


def test_an_all_reduce_is_looked_up_at_its_message_in_elements():
    # the comm tables' message_size counts bf16 values (aiconfigurator's estimator reads it so):
    # a layer's all-reduce of m tokens moves m x hidden of them, not m x hidden x 2 bytes
    import dataclasses

    s = build(["kernel=vllm_fa3", "model=llama3.1-8b", "model.tp=2", "hardware=h200"])
    recorder = RecordingCollective()
    tables = dataclasses.replace(s.cost.tables, allreduce=recorder)
    cost = profiled.ProfiledCostModel(s.cost.model, s.cost.hardware, tables=tables)
    cost._per_token_layer_s(1000)
    assert recorder.sizes and set(recorder.sizes) == {1000 * s.model.hidden_size}


def test_a_step_shares_its_gemms_between_prefill_and_decodes():
    s = build(["kernel=vllm_fa3", "model=llama3.1-8b", "hardware.kv_budget_bytes=null"])
    cost = s.cost
    chunks, decode_s = cost.step_times_s([(512, 0)], 32, 32 * 1024)
    apart = cost.prefill_chunk_time_s(512, 0) + cost.decode_time_s(32 * 1024, 32)
    assert chunks[0] + decode_s < apart  # one forward pass reads the weights once, not twice
    steps = cost.decode_times_s(32 * 1024, 32, 5)
    for k in range(5):
        assert steps[k] == pytest.approx(cost.decode_time_s(32 * 1024 + 32 * k, 32), rel=1e-12)
