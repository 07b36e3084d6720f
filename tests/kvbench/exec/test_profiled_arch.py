"""The profiled clock on experts, MLA, windows, linear attention and attention-DP: each grid is
exact where measured, a step's parts add up, and what was never measured is one line."""

from __future__ import annotations

import numpy as np
import pytest
from recording_collective import RecordingCollective

from kvbench.api import build
from kvbench.errors import ConfigError
from kvbench.exec import profiled, profiled_comm, profiled_linear, profiled_moe
from kvbench.specs import profiles

DEEPSEEK_H200 = ["model=deepseek-v3", "hardware=h200", "kernel=sglang_fa3"]


def _cost(overrides):
    return build(overrides).cost


def test_the_moe_grid_is_exact_where_measured_linear_between_and_counts_beyond():
    rows, label = profiled_moe.select_moe(
        "h200_sxm",
        "sglang",
        hidden_size=7168,
        inter_size=2048,
        topk=8,
        num_experts=256,
        moe_tp=8,
        moe_ep=1,
        moe_dtype="fp8_block",
        distribution="power_law_1.01",
    )
    counter = profiled._Counter()
    grid = profiled_moe.MoEGrid(rows, counter)
    medians = rows.groupby("num_tokens").latency.median() * 1e-3
    for tokens, expected in medians.items():
        assert grid.latency_s(int(tokens)) == pytest.approx(expected, rel=1e-12)
    t0, t1 = 128, 160
    middle = grid.latency_s(144)
    assert middle == pytest.approx((medians[t0] + medians[t1]) / 2, rel=1e-12)
    assert counter.count == 0
    assert grid.latency_s(2 * medians.index.max()) == pytest.approx(2 * medians.iloc[-1], rel=1e-12)
    assert counter.count == 1 and "power_law_1.01" in label


def _moe_rows(source: str, ms_per_token: float):
    import pandas as pd

    tokens = [1, 16, 128, 256, 1024]
    return pd.DataFrame({"kernel_source": source, "num_tokens": tokens, "latency": [ms_per_token * t for t in tokens]})


def test_trtllm_min_latency_moe_prices_the_layers_of_at_most_128_tokens():
    import pandas as pd

    rows = pd.concat([_moe_rows("moe_torch_flow_cutlass", 0.01), _moe_rows(profiled_moe.MIN_LATENCY_SOURCE, 0.001)])
    counter = profiled._Counter()
    grid = profiled_moe.MoEGrid(rows, counter)
    assert grid.latency_s(16) == pytest.approx(16 * 0.001e-3)  # the twin's rows at decode sizes
    assert grid.latency_s(128) == pytest.approx(128 * 0.001e-3)
    assert grid.latency_s(256) == pytest.approx(256 * 0.01e-3)  # the default kernel's beyond 128
    assert grid.latency_s(129) == pytest.approx(129 * 0.01e-3)
    alone = profiled_moe.MoEGrid(_moe_rows("moe_torch_flow_cutlass", 0.01), counter)
    assert alone.latency_s(16) == pytest.approx(16 * 0.01e-3)  # no twin measured: the default's
    assert counter.count == 0


@pytest.mark.skipif(profiles.table_root().excerpt, reason="B200 NVFP4 MoE rows are in the package's tables only")
def test_trtllm_nvfp4_moe_on_b200_reads_the_min_latency_twin_at_decode():
    rows, label = profiled_moe.select_moe(
        "b200_sxm",
        "trtllm",
        hidden_size=7168,
        inter_size=2048,
        topk=8,
        num_experts=256,
        moe_tp=8,
        moe_ep=1,
        moe_dtype="nvfp4",
        distribution="power_law_1.01",
    )
    assert profiled_moe.MIN_LATENCY_SOURCE in label
    grid = profiled_moe.MoEGrid(rows, profiled._Counter())
    twin = rows[rows.kernel_source == profiled_moe.MIN_LATENCY_SOURCE]
    default = rows[rows.kernel_source != profiled_moe.MIN_LATENCY_SOURCE]
    assert set(default.kernel_source) == {"moe_torch_flow_cutlass"}
    for tokens, frame in ((16, twin), (1024, default)):
        expected = float(frame[frame.num_tokens == tokens].latency.median()) * 1e-3
        assert grid.latency_s(tokens) == pytest.approx(expected, rel=1e-12)


def test_a_gated_delta_net_and_nccl_curve_are_exact_where_measured():
    from types import SimpleNamespace

    linear = SimpleNamespace(num_key_heads=16, num_value_heads=64, key_head_dim=128, value_head_dim=128)
    decode, prefill, _ = profiled_linear.select_gdn("h200_sxm", "sglang", hidden_size=4096, linear=linear, tp=8)
    layer = profiled_linear.GDNLayer(decode, prefill, profiled._Counter())
    b = 16
    expected = sum(float(f[f.batch_size == b].latency.median()) for f in decode) * 1e-3
    assert layer.decode_s(b) == pytest.approx(expected, rel=1e-12)
    assert layer.chunk_s(2048) > layer.chunk_s(1024) > 0
    frame, _ = profiled_comm.select_nccl("h200_sxm", "all_gather", 8)
    curve = profiled_comm.CollectiveCurve(frame, profiled._Counter())
    size = int(frame.message_size.iloc[0])
    assert curve.latency_s(size) == pytest.approx(float(frame[frame.message_size == size].latency.median()) * 1e-3)


def test_a_deepseek_v3_decode_step_on_h200_adds_up_from_its_parts():
    cost = _cost(DEEPSEEK_H200)
    arch = cost.tables.arch
    assert arch.counts.mla == 61 and arch.counts.moe_mlp == 58 and arch.counts.dense_mlp == 3
    assert "moe" in cost.source and "mla" in cost.source
    b, context = 32, 2048
    step = cost.decode_time_s(b * context, b)
    pricer = cost._arch
    token_s = pricer.per_token_s(b)
    lm_head_s = cost._lm_head_s(b)
    attention_s = float(pricer.decode_attention_s(b, np.array([float(context)]))[0])
    assert step == pytest.approx(token_s + lm_head_s + attention_s, rel=1e-12)
    moe_s = 58 * arch.moe.latency_s(b)
    mla_s = 61 * float(arch.mla[0].latency_s(b, np.array([float(context)]))[0])
    assert attention_s == pytest.approx(mla_s, rel=1e-12)
    assert 0 < moe_s < token_s  # the routed experts are part of the token-bound work, not all of it
    assert 5e-3 < step < 60e-3  # a DeepSeek-V3 TP8 decode step takes milliseconds (silicon: 10-33 ms)
    # the multi-step form agrees with the single step
    assert cost.decode_times_s(b * context, b, 1)[0] == pytest.approx(step, rel=1e-12)


def test_attention_dp_prices_the_experts_at_every_ranks_tokens():
    dp = _cost([*DEEPSEEK_H200, "model.tp=1", "model.attention_dp=8", "model.ep=8"])
    arch = dp.tables.arch
    assert arch.gather is not None and "nccl" in dp.source
    b = 8
    before = arch.moe.latency_s(8 * b)
    assert dp._arch.per_token_s(b) > 58 * before  # the experts saw 8 ranks' tokens, plus the rest


def test_collectives_are_looked_up_at_their_message_in_elements():
    # all-reduces (TP) and the attention-DP all-gather/reduce-scatter: tokens x hidden values,
    # the comm tables' message_size unit (not bytes)
    cost = _cost([*DEEPSEEK_H200, "model.tp=4", "model.attention_dp=2", "model.ep=8"])
    arch, pricer = cost.tables.arch, cost._arch
    allreduce, gather, scatter = RecordingCollective(), RecordingCollective(), RecordingCollective()
    object.__setattr__(cost.tables, "allreduce", allreduce)
    arch.gather, arch.scatter = gather, scatter
    pricer._cache.clear()
    b, hidden = 16, cost.model.hidden_size
    pricer.per_token_s(b)
    assert set(allreduce.sizes) == {b * hidden}
    assert set(gather.sizes) == set(scatter.sizes) == {b * hidden * 2}  # both ranks' tokens


def test_gpt_oss_prices_its_window_layers_at_the_window():
    cost = _cost(["model=gpt-oss-120b", "model.tp=1", "hardware=h200", "kernel=vllm_fa3"])
    counts = cost.tables.arch.counts
    assert counts.window == {128: 18} and counts.full == 18
    window_grid = cost.tables.arch.window[128][0]
    short, long = (float(window_grid.latency_s(16, np.array([s]))[0]) for s in (4096.0, 65536.0))
    assert long == pytest.approx(short, rel=0.1)  # a window layer reads W tokens, however long the context
    full_short, full_long = (float(cost.tables.decode.latency_s(16, np.array([s]))[0]) for s in (4096.0, 65536.0))
    assert full_long > 3 * full_short


def test_a_precision_the_tables_never_measured_is_one_line():
    with pytest.raises(ConfigError) as err:
        _cost(["model=gpt-oss-120b", "model.tp=1", "model.moe_dtype=nvfp4", "hardware=h200", "kernel=vllm_fa3"])
    message = str(err.value)
    assert "\n" not in message and "nvfp4" in message and "w4a16_mxfp4" in message


def test_the_excerpt_prices_the_new_architectures_as_the_package(monkeypatch):
    pytest.importorskip("aiconfigurator_core")
    cases = [DEEPSEEK_H200, ["model=gpt-oss-120b", "model.tp=1", "hardware=h200", "kernel=vllm_fa3"]]

    def steps():
        out = []
        for overrides in cases:
            cost = _cost(overrides)
            out.append((cost.decode_time_s(16 * 3000, 16), cost.prefill_chunk_time_s(512, 1024)))
        return out

    package = steps()
    monkeypatch.setenv(profiles.SOURCE_VARIABLE, "excerpt")
    profiles.table_root.cache_clear()
    profiles.read_table.cache_clear()
    try:
        excerpt = steps()
    finally:
        profiles.table_root.cache_clear()
        profiles.read_table.cache_clear()
    assert excerpt == package


def _experts_s(pricer, b: int) -> tuple[float, float]:
    """A MoE model's shared-expert GEMMs and routed experts at ``b`` tokens, every MoE layer."""
    t, m = pricer.tables, pricer.model
    shared = sum(layers * t.gemm.latency_s(b, n, k) for layers, n, k in pricer.shared_shapes)
    routed = pricer.arch.counts.moe_mlp * pricer.arch.moe.latency_s(b * m.attention_dp)
    return shared, routed


@pytest.mark.parametrize(("kernel", "overlaps"), [("trtllm", True), ("sglang_fa3", False), ("vllm_fa3", False)])
def test_trtllm_overlaps_shared_and_routed_experts_in_decode_steps_only(kernel, overlaps):
    cost = _cost(["model=deepseek-v3", "hardware=h200", f"kernel={kernel}"])
    pricer = cost._arch
    b = 32
    shared, routed = _experts_s(pricer, b)
    assert shared > 0 and routed > 0
    mixed, decode = pricer.per_token_s(b), pricer.per_token_s(b, decode_only=True)
    # a step with a prefill chunk pays both; a decode-only step pays the longer of the two on TRT-LLM
    assert mixed - decode == pytest.approx(min(shared, routed) if overlaps else 0.0, rel=1e-9, abs=1e-12)
    # the decode-only price is what a run's decode steps are charged
    steps = cost.decode_times_s(b * 1000, b, 1)
    attention = float(pricer.decode_attention_s(b, np.array([1000.0]))[0])
    assert steps[0] == pytest.approx(decode + cost._lm_head_s(b) + attention, rel=1e-9)
