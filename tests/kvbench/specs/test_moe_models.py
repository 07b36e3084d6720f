"""The 2026 models from their published config.json values: KV bytes per token and state bytes per
request hand-computed to the byte, KV-cache groups, weights per GPU under TP/EP/attention-DP
layouts, parameter counts against the published sizes, and bad layouts refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvbench_cli import assert_one_line_error, kvbench
from omegaconf import OmegaConf

from kvbench.app.config import to_dataclass
from kvbench.errors import ConfigError
from kvbench.specs.architecture import WEIGHT_DTYPE_BYTES
from kvbench.specs.kv_groups import FULL, STATE, WINDOW, KVGroup, layer_kinds
from kvbench.specs.model import ModelConfig, model_spec

CONF = Path(__file__).resolve().parents[3] / "conf" / "model"


def config(name: str, **overrides) -> ModelConfig:
    node = OmegaConf.load(CONF / f"{name}.yaml")
    for key, value in overrides.items():
        OmegaConf.update(node, key, value)
    return to_dataclass(ModelConfig, node, "model")


def spec(name: str, **overrides):
    return model_spec(config(name, **overrides))


# --- KV bytes per token, by hand from each config.json ---------------------------------------------


@pytest.mark.parametrize(
    "name, tp, kv_bytes",
    [
        # MLA: layers x (kv_lora_rank + qk_rope_head_dim) x 2 B, whole on every GPU whatever the tp
        ("deepseek-v3", 1, 61 * (512 + 64) * 2),  # 70,272
        ("deepseek-v3", 8, 70_272),
        ("deepseek-r1", 8, 70_272),
        ("kimi-k2.5", 8, 61 * (512 + 64) * 2),
        # sparse MLA: + the indexer's fp8 key (128 B) and one fp32 scale per 128 values (4 B)
        ("glm-5", 8, 78 * ((512 + 64) * 2 + 128 + 4)),  # 100,152
        # GQA: layers x 2 (K, V) x KV heads per GPU x head_dim x 2 B
        ("gpt-oss-120b", 1, 36 * 2 * 8 * 64 * 2),  # 73,728
        ("gpt-oss-120b", 8, 36 * 2 * 1 * 64 * 2),
        ("gpt-oss-20b", 1, 24 * 2 * 8 * 64 * 2),  # 49,152
        ("qwen3-235b-a22b", 1, 94 * 2 * 4 * 128 * 2),  # 192,512
        ("qwen3-235b-a22b", 8, 94 * 2 * 1 * 128 * 2),  # 4 KV heads on 8 GPUs: one each, replicated
        ("qwen3-30b-a3b", 1, 48 * 2 * 4 * 128 * 2),  # 98,304
        ("minimax-m2.5", 1, 62 * 2 * 8 * 128 * 2),  # 253,952
        ("minimax-m2.5", 4, 62 * 2 * 2 * 128 * 2),
        # Qwen3.5: only the 15 full-attention layers hold KV (the 45 linear ones a state)
        ("qwen3.5-397b-a17b", 1, 15 * 2 * 2 * 256 * 2),  # 30,720
        ("qwen3.5-397b-a17b", 8, 15 * 2 * 1 * 256 * 2),
    ],
)
def test_kv_bytes_per_token_are_the_hand_computation(name, tp, kv_bytes):
    assert spec(name, tp=tp).kv_bytes_per_token == kv_bytes


def test_kv_dtype_float8_halves_the_latent_but_not_the_indexer_key():
    assert spec("deepseek-v3", kv_dtype="float8").kv_bytes_per_token == 61 * 576
    glm = spec("glm-5", kv_dtype="float8")
    assert glm.kv_bytes_per_token == 78 * (576 + 132) and glm.indexer_bytes_per_token == 78 * 132


def test_an_fp8_block_checkpoint_caches_kv_in_bfloat16():
    # the published DeepSeek-V3 is fp8_block; its KV cache is bf16 unless kv_dtype says otherwise
    assert spec("deepseek-v3").dtype_bytes == pytest.approx(1 + 4 / 128**2)
    assert spec("deepseek-v3").kv_element_bytes == 2


def test_attention_dp_does_not_change_the_bytes_per_token_of_a_gpu():
    assert spec("deepseek-v3", tp=1, attention_dp=8, ep=8).kv_bytes_per_token == 70_272
    assert spec("qwen3-235b-a22b", tp=2, attention_dp=4).kv_bytes_per_token == 94 * 2 * 2 * 128 * 2


# --- linear-attention state ------------------------------------------------------------------------


def test_qwen35_state_per_request_is_the_hand_computation():
    # per linear layer: recurrent 64 value heads x 128 x 128 x 4 B (fp32, mamba_ssm_dtype) + conv
    # (4 - 1) x (2 x 16 x 128 + 64 x 128) x 2 B (bf16); 45 linear layers
    recurrent, conv = 64 * 128 * 128 * 4, 3 * (2 * 16 * 128 + 64 * 128) * 2
    assert spec("qwen3.5-397b-a17b", tp=1).state_bytes_per_request == 45 * (recurrent + conv) == 192_061_440
    # tp 8 splits the heads: 8 value and 2 key heads per GPU
    per_layer_tp8 = 8 * 128 * 128 * 4 + 3 * (2 * 2 * 128 + 8 * 128) * 2
    assert spec("qwen3.5-397b-a17b", tp=8).state_bytes_per_request == 45 * per_layer_tp8 == 24_007_680


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b", "glm-5"])
def test_models_without_linear_layers_hold_no_state(name):
    assert spec(name).state_bytes_per_request == 0


# --- KV-cache groups --------------------------------------------------------------------------------


def test_gpt_oss_is_a_full_group_and_a_128_token_window_group_with_sinks():
    s = spec("gpt-oss-120b")
    assert s.kv_groups == (KVGroup(FULL, 18), KVGroup(WINDOW, 18, 128))
    assert s.attention_sinks and spec("gpt-oss-20b").kv_groups == (KVGroup(FULL, 12), KVGroup(WINDOW, 12, 128))


def test_qwen35_is_one_full_group_and_three_state_groups_of_15_layers():
    s = spec("qwen3.5-397b-a17b", tp=1)
    per_group = 15 * (64 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 64 * 128) * 2)
    assert s.kv_groups == (KVGroup(FULL, 15),) + (KVGroup(STATE, 15, 0, per_group),) * 3
    assert [s.kv_group_bytes_per_token(g) for g in s.kv_groups] == [30_720, 0, 0, 0]
    assert s.num_token_layers == 15 and s.num_state_layers == 45


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2.5", "glm-5", "qwen3-235b-a22b", "minimax-m2.5"])
def test_full_attention_moe_models_have_no_groups(name):
    assert spec(name).kv_groups == ()


@pytest.mark.parametrize("name", ["gpt-oss-120b", "qwen3.5-397b-a17b"])
def test_the_layer_kinds_are_transformers_own(name):
    transformers = pytest.importorskip("transformers")
    fields = dict(OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))["hf_config"])
    hf = transformers.AutoConfig.for_model(
        fields["model_type"], **{k: v for k, v in fields.items() if k != "model_type"}
    )
    kinds = {"full_attention": FULL, "sliding_attention": WINDOW, "linear_attention": STATE}
    assert [kind for kind, _ in layer_kinds(fields, fields["model_type"], hf.num_hidden_layers)] == [
        kinds[t] for t in hf.layer_types
    ]
    # the same pattern derived when the config leaves layer_types out
    derived = {k: v for k, v in fields.items() if k != "layer_types"}
    assert layer_kinds(derived, fields["model_type"], hf.num_hidden_layers) == layer_kinds(
        fields, fields["model_type"], hf.num_hidden_layers
    )


# --- parameters and weights -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, total, active, rel",
    [
        # published (total, active); kvbench leaves out MTP layers and vision towers, and counts the
        # input embedding as active (gpt-oss's published active count does not: +0.58e9)
        ("deepseek-v3", 671e9, 37e9, 0.02),
        ("deepseek-r1", 671e9, 37e9, 0.02),
        ("gpt-oss-120b", 116.83e9, 5.13e9 + 0.58e9, 0.005),
        ("gpt-oss-20b", 20.91e9, 3.61e9 + 0.58e9, 0.005),
        ("qwen3-235b-a22b", 235e9, 22e9, 0.01),
        ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02),
        ("qwen3.5-397b-a17b", 397e9, 17e9, 0.03),
        ("minimax-m2.5", 230e9, 10e9, 0.11),  # 11.03e9 active: 10.42e9 without the input embedding
        ("kimi-k2.5", 1.0e12, 32e9, 0.03),
        ("glm-5", 744e9, 40e9, 0.05),
    ],
)
def test_parameter_counts_are_near_the_published_sizes(name, total, active, rel):
    s = spec(name)
    assert s.num_params == pytest.approx(total, rel=rel)
    assert s.active_params == pytest.approx(active, rel=rel)


def test_deepseek_v3_counts_to_the_parameter():
    s = spec("deepseek-v3")
    assert s.num_params == 671_026_404_352 and s.param_counts.total == s.num_params
    # 58 MoE layers of 256 routed experts of 3 x 7168 x 2048
    assert s.param_counts.routed_experts == 58 * 256 * 3 * 7168 * 2048
    assert s.active_params == s.num_params - 58 * (256 - 8) * 3 * 7168 * 2048


def test_gpt_oss_weights_per_gpu_are_the_hand_computation():
    h, vocab, experts, ffn, layers = 2880, 201088, 128, 2880, 36
    attention = layers * (2 * h * 64 * 64 + 2 * h * 8 * 64 + 64 * 64 + 2 * 8 * 64 + h + 64 + 2 * h) + h
    routed = layers * experts * (3 * h * ffn + 2 * ffn + h)  # gate_up and down, with their biases
    router = layers * (h * experts + experts)
    mxfp4 = 0.5 + 1 / 32
    for tp, adp, ep in [(1, 1, 1), (2, 1, 2), (4, 2, 8), (2, 4, 1)]:
        s = spec("gpt-oss-120b", tp=tp, attention_dp=adp, ep=ep)
        # bf16 embeddings, LM head and attention split by tp; mxfp4 experts across all tp x adp GPUs;
        # the router replicated
        expected = (2 * vocab * h + attention) * 2 / tp + routed * mxfp4 / (tp * adp) + router * 2
        assert s.weight_bytes == round(expected), (tp, adp, ep)


def test_expert_parallelism_moves_whole_experts_not_bytes():
    # the same GPUs hold the same bytes of experts whether split by expert or within each
    assert spec("deepseek-v3", tp=8, ep=8).weight_bytes == spec("deepseek-v3", tp=8, ep=1).weight_bytes
    # attention-DP: attention and shared weights copied per rank, routed experts spread over all GPUs
    s1, s2 = spec("deepseek-v3", tp=4), spec("deepseek-v3", tp=4, attention_dp=2, ep=8)
    routed = s1.param_counts.routed_experts * s1.moe_dtype_bytes
    assert s1.weight_bytes - s2.weight_bytes == pytest.approx(routed / 4 - routed / 8, abs=2)
    assert s2.moe_tp == 1 and s2.num_gpus == 8


def test_per_part_precision():
    bf16, int4 = spec("kimi-k2.5", moe_dtype="bfloat16"), spec("kimi-k2.5")
    routed = int4.param_counts.routed_experts
    saved = routed * (2 - WEIGHT_DTYPE_BYTES["int4"]) / 8
    assert bf16.weight_bytes - int4.weight_bytes == pytest.approx(saved, abs=2)
    assert int4.moe_dtype == "int4" and bf16.kv_bytes_per_token == int4.kv_bytes_per_token
    # nvfp4 experts: 4 bits and one fp8 scale per 16
    assert WEIGHT_DTYPE_BYTES["nvfp4"] == 0.5625 and WEIGHT_DTYPE_BYTES["mxfp4"] == 0.53125


def test_a_typed_in_parameter_count_scales_every_part():
    s = spec("gpt-oss-20b")
    doubled = spec("gpt-oss-20b", num_params=2 * s.num_params)
    assert doubled.weight_bytes == pytest.approx(2 * s.weight_bytes, abs=2)
    assert doubled.active_params == pytest.approx(2 * s.active_params, abs=2)


def test_dense_models_keep_their_numbers():
    llama = model_spec(to_dataclass(ModelConfig, OmegaConf.load(CONF / "llama2-7b.yaml"), "model"))
    assert llama.moe is None and llama.active_params == llama.num_params
    assert llama.state_bytes_per_request == 0 and llama.indexer_bytes_per_token == 0
    assert llama.weight_bytes == llama.num_params * 2


def test_a_multimodal_config_json_serves_its_text_decoder(tmp_path):
    import json

    fields = dict(OmegaConf.to_container(OmegaConf.load(CONF / "qwen3.5-397b-a17b.yaml"))["hf_config"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": fields, "vision_config": {}}))
    s = model_spec(ModelConfig(name="q", config_path=str(path), dtype="bfloat16", tp=8))
    assert s.kv_bytes_per_token == 15_360 and s.num_params == spec("qwen3.5-397b-a17b").num_params


# --- bad input: one line each -----------------------------------------------------------------------


def test_an_unknown_layer_kind_is_one_line():
    types = ["linear_attention"] * 3 + ["mamba"] + ["linear_attention"] * 3 + ["full_attention"]
    with pytest.raises(ConfigError, match=r"layer_types\[3\]='mamba' is an unknown layer kind: use one of"):
        spec("qwen3.5-397b-a17b", **{"hf_config.layer_types": types, "hf_config.num_hidden_layers": 8})


@pytest.mark.parametrize(
    "name, overrides, match",
    [
        ("deepseek-v3", {"tp": 8, "ep": 8, "attention_dp": 1}, None),  # fine: 256 experts over 8
        ("gpt-oss-20b", {"tp": 2, "attention_dp": 3, "ep": 3}, r"model.ep=3 is invalid: must divide the 32 routed"),
        ("deepseek-v3", {"tp": 8, "ep": 3}, r"model.ep=3 is invalid: must divide model.tp x model.attention_dp = 8"),
        ("deepseek-v3", {"tp": 4, "attention_dp": 3, "ep": 8}, r"model.ep=8 is invalid: must divide .* = 12 GPUs"),
        ("minimax-m2.5", {"tp": 5}, r"model.tp=5 is invalid: must divide the 48 attention heads"),
        ("llama2-7b", {"ep": 2, "tp": 2}, r"model.ep=2 is invalid: llama2-7b has no experts"),
        ("llama2-7b", {"moe_dtype": "nvfp4"}, r"model.moe_dtype='nvfp4' is invalid: llama2-7b has no experts"),
        ("gpt-oss-20b", {"moe_dtype": "fp4"}, r"model.moe_dtype='fp4' is invalid: choose null or one of"),
        ("gpt-oss-20b", {"dtype": "mxfp4"}, r"model.dtype='mxfp4' is invalid: choose one of"),
        ("gpt-oss-20b", {"attention_dp": 0}, r"model.attention_dp=0 is invalid: use 1 to 72"),
    ],
)
def test_a_layout_the_model_cannot_take_is_one_line(name, overrides, match):
    if match is None:
        model_spec(config(name, **overrides))  # to_dataclass validates the config
        return
    with pytest.raises(ConfigError, match=match):
        model_spec(config(name, **overrides))


def test_linear_heads_that_tp_does_not_divide_are_refused():
    # the published 16 key and 64 value heads take every tp up to 8: a config with 2 key heads does not
    with pytest.raises(ConfigError, match=r"model.tp=4 is invalid: must divide the 2 key and 64 value heads"):
        spec("qwen3.5-397b-a17b", tp=4, **{"hf_config.linear_num_key_heads": 2})


def test_a_missing_family_field_is_named():
    fields = dict(OmegaConf.to_container(OmegaConf.load(CONF / "deepseek-v3.yaml"))["hf_config"])
    del fields["kv_lora_rank"]
    with pytest.raises(ConfigError, match=r"model.hf_config.kv_lora_rank is missing: give the value of the model"):
        model_spec(ModelConfig(hf_config=fields))


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["model=gpt-oss-20b", "model.ep=3", "model.attention_dp=3", "model.tp=2"], ["model.ep=3", "32 routed"]),
        (["model=deepseek-v3", "model.ep=3"], ["model.ep=3 is invalid", "model.tp x model.attention_dp"]),
        (["model=minimax-m2.5", "model.tp=5"], ["model.tp=5 is invalid", "48 attention heads"]),
        (
            [
                "model=qwen3.5-397b-a17b",
                "model.hf_config.layer_types=[full_attention,mamba]",
                "model.hf_config.num_hidden_layers=2",
            ],
            ["layer_types[1]='mamba' is an unknown layer kind"],
        ),
    ],
)
def test_bad_layouts_exit_2_with_one_line(tmp_path, args, fragments):
    proc = kvbench("workload.num_requests=5", "wandb.mode=disabled", "progress=false", *args, cwd=tmp_path)
    assert_one_line_error(proc, *fragments, status=2)


def test_deepseek_v3_runs_in_sim_mode_on_h200(tmp_path):
    proc = kvbench(
        "model=deepseek-v3",
        "hardware=h200-sxm",
        "model.tp=8",
        "workload.num_requests=5",
        "wandb.mode=disabled",
        "progress=false",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "results").rglob("summary.parquet"))
