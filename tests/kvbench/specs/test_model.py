"""ModelSpec from config.json fields: KV bytes, parameters and FLOPs the lecture uses, the same numbers
transformers gives, without importing transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from hang import HANG_S
from omegaconf import OmegaConf

from kvbench.app.config import to_dataclass
from kvbench.errors import ConfigError
from kvbench.specs.model import FAMILY_DEFAULTS, ModelConfig, model_spec, resolve_architecture

CONF = Path(__file__).resolve().parents[3] / "conf" / "model"
MODELS = sorted(path.stem for path in CONF.glob("*.yaml"))
#: model types transformers knows by another name: Kimi-K2's text decoder is DeepSeek-V3's (transformers'
#: kimi_k25 config builds its text_config as deepseek_v3)
TRANSFORMERS_TYPE = {"kimi_k2": "deepseek_v3"}


def hf_config(fields: dict):
    """transformers' config of the same config.json fields."""
    from transformers import AutoConfig

    fields = dict(fields)
    model_type = fields.pop("model_type")
    return AutoConfig.for_model(TRANSFORMERS_TYPE.get(model_type, model_type), **fields)


def spec(name: str):
    return model_spec(to_dataclass(ModelConfig, OmegaConf.load(CONF / f"{name}.yaml"), "model"))


@pytest.mark.parametrize(
    "name, kv_bytes, num_params",
    [
        ("llama2-7b", 524_288, 6_738_415_616),  # 512 KiB per token (MHA), 6.74 B parameters
        ("llama3-8b", 131_072, 8_030_261_248),  # 128 KiB per token (GQA-8)
        ("opt-13b", 819_200, 12_853_473_280),  # 800 KB per token, as the vLLM paper says
    ],
)
def test_kv_bytes_and_parameters(name, kv_bytes, num_params):
    s = spec(name)
    assert s.kv_bytes_per_token == kv_bytes
    assert s.num_params == num_params


@pytest.mark.parametrize("name", MODELS)
def test_parameter_formula_matches_the_transformers_model(name):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    hf = hf_config(OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))["hf_config"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    assert spec(name).num_params == sum(p.numel() for p in model.parameters())


def test_lecture_prefill_flops_for_a_4k_prompt():
    # lecture section 10.5: 55.2 + 8.8 TFLOP for 4,096 tokens of Llama-2-7B
    s = spec("llama2-7b")
    assert s.prefill_flops(4096) == pytest.approx(55.2e12 + 8.8e12, rel=2e-3)
    assert s.weight_bytes == pytest.approx(13.5e9, rel=2e-3)


def test_a_local_config_json_works(tmp_path):
    fields = dict(OmegaConf.to_container(OmegaConf.load(CONF / "llama3-8b.yaml"))["hf_config"])
    (tmp_path / "config.json").write_text(json.dumps(fields))
    s = model_spec(ModelConfig(name="local", config_path=str(tmp_path), dtype="bfloat16"))
    assert s.kv_bytes_per_token == 131_072 and s.num_kv_heads == 8


def test_bad_model_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"model.config_path=.*no config.json"):
        model_spec(ModelConfig(config_path=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match=r"model.dtype='int3' is invalid"):
        to_dataclass(ModelConfig, {"dtype": "int3", "hf_config": {"model_type": "llama"}}, "model")
    with pytest.raises(
        ConfigError,
        match=r"model_type='gpt2' is not one kvbench knows the defaults of: use one of "
        r"llama, mistral, qwen3, opt, gemma2, gemma3_text, or set model.num_params and give num_hidden_layers, "
        r"num_attention_heads, hidden_size, max_position_embeddings in model.hf_config$",
    ):
        model_spec(ModelConfig(hf_config={"model_type": "gpt2"}))


def llama(**changes) -> ModelConfig:
    fields = dict(OmegaConf.to_container(OmegaConf.load(CONF / "llama2-7b.yaml"))["hf_config"])
    return to_dataclass(ModelConfig, {"hf_config": {**fields, **changes}}, "model")


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_hidden_layers", 0),  # divided by zero before
        ("hidden_size", -4096),  # ran to exit 0 with negative memory before
        ("num_attention_heads", True),  # a bool is not a count
        ("num_key_value_heads", 0),
        ("intermediate_size", 2.5),
        ("vocab_size", "abc"),  # transformers' TypeError before
        ("max_position_embeddings", -1),
        ("head_dim", 0),
    ],
)
def test_architecture_fields_are_positive_integers(field, value):
    with pytest.raises(ConfigError, match=rf"model.hf_config.{field}={value!r} is invalid: use a positive integer"):
        model_spec(llama(**{field: value}))


def test_positions_are_capped_at_2_pow_24():
    assert model_spec(llama(max_position_embeddings=2**24)).max_positions == 2**24
    with pytest.raises(ConfigError, match=r"max_position_embeddings=16777217 is invalid: use at most 2\*\*24"):
        model_spec(llama(max_position_embeddings=2**24 + 1))


def test_heads_must_divide_the_hidden_size_where_transformers_requires_it():
    with pytest.raises(
        ConfigError,
        match=r"model.hf_config.num_attention_heads=7 is invalid: must divide "
        r"hidden_size=4096, as transformers' llama model requires",
    ):
        model_spec(llama(num_attention_heads=7, num_key_value_heads=7))
    opt = dict(OmegaConf.to_container(OmegaConf.load(CONF / "opt-13b.yaml"))["hf_config"])
    with pytest.raises(ConfigError, match=r"num_attention_heads=48 is invalid: must divide hidden_size=5120"):
        model_spec(ModelConfig(hf_config={**opt, "num_attention_heads": 48}))
    # Mistral sets head_dim apart from hidden_size, and transformers accepts heads that do not divide it
    s = model_spec(ModelConfig(hf_config={"model_type": "mistral", "num_attention_heads": 24, "head_dim": 128}))
    assert (s.num_heads, s.num_kv_heads, s.head_dim) == (24, 8, 128)


def test_kv_heads_must_divide_the_query_heads():
    with pytest.raises(ConfigError, match=r"num_key_value_heads=5 is invalid: must divide num_attention_heads=32"):
        model_spec(llama(num_key_value_heads=5))


@pytest.mark.parametrize("typo, guess", [("llamaa", "llama"), ("Mistral", "mistral"), ("opt2", "opt")])
def test_a_misspelled_model_type_names_the_type_meant(typo, guess):
    with pytest.raises(
        ConfigError,
        match=rf"model_type='{typo}' is not one kvbench knows the defaults of \(did you mean "
        rf"'{guess}'\?\): use one of llama, mistral, qwen3, opt, gemma2, gemma3_text",
    ):
        model_spec(ModelConfig(hf_config={"model_type": typo}))


def test_another_model_type_works_when_its_shape_and_parameters_are_given():
    shape = {
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_size": 3584,
        "max_position_embeddings": 32768,
    }  # Qwen2-7B
    s = model_spec(ModelConfig(hf_config={"model_type": "qwen2", **shape}, num_params=7_615_616_512))
    assert (s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim, s.max_positions) == (28, 28, 4, 128, 32768)
    assert s.num_params == 7_615_616_512
    # the count typed in but a shape field left out: the message names just that field
    del shape["max_position_embeddings"]
    with pytest.raises(
        ConfigError,
        match=r"model_type='qwen2' is not one .*: use one of llama, mistral, qwen3, opt, gemma2, gemma3_text, or "
        r"give max_position_embeddings in model.hf_config$",
    ):
        model_spec(ModelConfig(hf_config={"model_type": "qwen2", **shape}, num_params=7_615_616_512))


def test_family_defaults_fill_what_the_config_leaves_out():
    mistral = model_spec(ModelConfig(hf_config={"model_type": "mistral"}))
    assert (mistral.num_kv_heads, mistral.head_dim, mistral.max_positions) == (8, 128, 131_072)  # not 32 KV heads
    opt = resolve_architecture(ModelConfig(hf_config={"model_type": "opt", "hidden_size": 1536}))
    assert opt["word_embed_proj_dim"] == 1536 and opt["tie_word_embeddings"] is True  # LLaMA's is False
    assert (
        resolve_architecture(ModelConfig(hf_config={"model_type": "llama", "num_key_value_heads": None}))[
            "num_key_value_heads"
        ]
        == 32
    )


@pytest.mark.parametrize(
    "model_type, field, value, match",
    [
        (
            "mistral",
            "num_key_value_heads",
            None,
            r"=None is invalid: use a positive integer, or leave it out for mistral's default \(8\)",
        ),
        (
            "llama",
            "hidden_size",
            None,
            r"=None is invalid: use a positive integer, or leave it out for llama's default \(4096\)",
        ),
        ("llama", "tie_word_embeddings", "yes", r"='yes' is invalid: use true or false"),
        ("llama", "attention_bias", 1, r"=1 is invalid: use true or false"),  # 1 would count as a bias
        (
            "opt",
            "do_layer_norm_before",
            None,
            r"=None is invalid: use true or false, or leave it out for opt's default \(True\)",
        ),
    ],
)
def test_family_fields_have_the_types_transformers_requires(model_type, field, value, match):
    with pytest.raises(ConfigError, match=rf"model.hf_config.{field}{match}"):
        model_spec(ModelConfig(hf_config={"model_type": model_type, field: value}))


@pytest.mark.parametrize("name", MODELS)
def test_every_conf_model_matches_transformers_autoconfig(name):
    pytest.importorskip("transformers")
    config = to_dataclass(ModelConfig, OmegaConf.load(CONF / f"{name}.yaml"), "model")
    hf = hf_config(config.hf_config)
    s = model_spec(config)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    if s.mla is not None:  # transformers' head_dim is the rope part; kvbench's the query/key head
        head_dim = hf.qk_nope_head_dim + hf.qk_rope_head_dim
        assert (s.mla.kv_lora_rank, s.mla.qk_rope_head_dim, s.mla.v_head_dim, s.mla.q_lora_rank) == (
            hf.kv_lora_rank,
            hf.qk_rope_head_dim,
            hf.v_head_dim,
            hf.q_lora_rank,
        )
    expected = (
        hf.num_hidden_layers,
        hf.num_attention_heads,
        getattr(hf, "num_key_value_heads", hf.num_attention_heads),
        head_dim,
        hf.max_position_embeddings,
    )
    assert (s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim, s.max_positions) == expected
    if s.moe is not None:
        experts = next(
            getattr(hf, k) for k in ("n_routed_experts", "num_experts", "num_local_experts") if hasattr(hf, k)
        )
        assert (s.moe.num_experts, s.moe.experts_per_token) == (experts, hf.num_experts_per_tok)
    if hf.model_type in FAMILY_DEFAULTS:
        assert family_fields(resolve_architecture(config).get, hf.model_type) == family_fields(
            partial(getattr, hf), hf.model_type
        )


@pytest.mark.parametrize("model_type", sorted(FAMILY_DEFAULTS))
def test_the_defaults_table_is_transformers_own(model_type):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoConfig.for_model(model_type)  # every field left to its default
    arch = resolve_architecture(ModelConfig(hf_config={"model_type": model_type}))
    assert family_fields(arch.get, model_type) == family_fields(partial(getattr, hf), model_type)


def family_fields(read, model_type: str) -> dict:
    """The fields FAMILY_DEFAULTS lists for ``model_type``, each read with ``read(name)``."""
    return {name: read(name) for name in FAMILY_DEFAULTS[model_type]}


SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "vocab_size": 1000,
    "max_position_embeddings": 128,
}


@pytest.mark.parametrize(
    "model_type, fields",
    [
        (
            "llama",
            {
                "intermediate_size": 96,
                "attention_bias": True,
                "mlp_bias": True,
                "tie_word_embeddings": True,
                "num_key_value_heads": 2,
            },
        ),
        ("llama", {"intermediate_size": 96, "head_dim": 16}),
        (
            "mistral",
            {"intermediate_size": 96, "head_dim": 12, "num_key_value_heads": 4, "attention_bias": True},
        ),  # Mistral has no biases
        ("opt", {"ffn_dim": 96, "enable_bias": False, "layer_norm_elementwise_affine": False}),
        (
            "opt",
            {"ffn_dim": 96, "word_embed_proj_dim": 32, "do_layer_norm_before": False, "tie_word_embeddings": False},
        ),
        ("opt", {"ffn_dim": 96, "_remove_final_layer_norm": True}),
    ],
)
def test_parameter_formula_follows_the_options_of_each_family(model_type, fields):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model(model_type, **SMALL, **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    s = model_spec(ModelConfig(hf_config={"model_type": model_type, **SMALL, **fields}))
    assert s.num_params == sum(p.numel() for p in model.parameters())


def test_building_a_model_spec_imports_neither_transformers_nor_torch():
    code = (
        "import sys; from kvbench.specs.model import ModelConfig, model_spec; "
        "model_spec(ModelConfig(hf_config={'model_type': 'llama'})); "
        "model_spec(ModelConfig(hf_config={'model_type': 'opt'})); "
        "loaded = [m for m in ('transformers', 'torch') if m in sys.modules]; assert not loaded, loaded"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr


def test_opt_heads_wider_than_the_model_are_refused():
    fields = dict(OmegaConf.to_container(OmegaConf.load(CONF / "opt-13b.yaml"))["hf_config"])
    config = to_dataclass(ModelConfig, {"hf_config": {**fields, "hidden_size": 10}}, "model")
    with pytest.raises(
        ConfigError, match=r"model.hf_config.hidden_size=10 is invalid: must be at least num_attention_heads=40"
    ):
        model_spec(config)


@pytest.mark.parametrize(
    "text, match",
    [
        ("[1, 2]", "holds a JSON list, not an object"),
        ('"llama"', "holds a JSON str"),
        ("{", "is not valid JSON: line 1"),
    ],
)
def test_a_config_json_must_hold_an_object(tmp_path, text, match):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=rf"model.config_path=.* {match}"):
        model_spec(ModelConfig(config_path=str(tmp_path)))


def test_a_bad_field_in_a_config_json_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 0}))
    with pytest.raises(ConfigError, match=rf"num_hidden_layers=0 is invalid: use a positive integer \(in {tmp_path}"):
        model_spec(ModelConfig(config_path=str(tmp_path)))


@pytest.mark.parametrize("name", ["a/b", "..", "../x", ".x", "x" * 65])
def test_model_name_is_a_safe_name(name):
    with pytest.raises(ConfigError, match=r"model.name=.* is invalid"):
        to_dataclass(ModelConfig, {"name": name, "hf_config": {"model_type": "llama"}}, "model")
