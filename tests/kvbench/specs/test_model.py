"""ModelSpec from transformers configs: KV bytes, parameters and FLOPs the lecture uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kvbench.app.config import to_dataclass
from kvbench.errors import ConfigError
from kvbench.specs.model import ModelConfig, model_spec

CONF = Path(__file__).resolve().parents[3] / "conf" / "model"


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


@pytest.mark.parametrize("name", ["llama2-7b", "llama3-8b", "opt-13b"])
def test_parameter_formula_matches_the_transformers_model(name):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))["hf_config"])
    hf = AutoConfig.for_model(fields.pop("model_type"), **fields)
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
    with pytest.raises(ConfigError, match="no parameter-count formula"):
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


def test_transformers_own_checks_become_one_line():
    with pytest.raises(ConfigError, match=r"invalid for transformers' 'llama' config: The hidden size \(4096\) is not a "
                                          r"multiple of the number of attention heads \(7\)"):  # fmt: skip
        model_spec(llama(num_attention_heads=7))
    with pytest.raises(ConfigError, match=r"model.hf_config.model_type='llamaa' is invalid: not a transformers model type"):
        model_spec(ModelConfig(hf_config={"model_type": "llamaa"}))


def test_opt_heads_wider_than_the_model_are_refused():
    fields = dict(OmegaConf.to_container(OmegaConf.load(CONF / "opt-13b.yaml"))["hf_config"])
    config = to_dataclass(ModelConfig, {"hf_config": {**fields, "hidden_size": 10}}, "model")
    with pytest.raises(ConfigError, match=r"model.hf_config.hidden_size=10 is invalid: must be at least num_attention_heads=40"):
        model_spec(config)


@pytest.mark.parametrize("text, match", [("[1, 2]", "holds a JSON list, not an object"),
                                         ('"llama"', "holds a JSON str"), ("{", "is not valid JSON: line 1")])  # fmt: skip
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
