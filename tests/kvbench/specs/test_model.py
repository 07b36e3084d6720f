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
