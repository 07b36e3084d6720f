"""KV-cache groups from config.json fields: the layer pattern transformers reads, cut into groups of
equally many layers; full-attention models unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kvbench.app.config import to_dataclass
from kvbench.errors import ConfigError
from kvbench.specs.kv_groups import FULL, WINDOW, KVGroup, kv_groups, layer_windows
from kvbench.specs.model import ModelConfig, model_spec

CONF = Path(__file__).resolve().parents[3] / "conf" / "model"


def spec(name: str, **hf_overrides):
    node = OmegaConf.load(CONF / f"{name}.yaml")
    for key, value in hf_overrides.items():
        node.hf_config[key] = value
    return model_spec(to_dataclass(ModelConfig, node, "model"))


def test_mistral_v0_1_windows_every_layer():
    s = spec("mistral-7b-v0.1")
    assert s.kv_groups == (KVGroup(WINDOW, 32, 4096),)
    assert s.kv_group_bytes_per_token(s.kv_groups[0]) == s.kv_bytes_per_token == 131_072


def test_gemma3_is_five_window_groups_and_one_full_group_of_eight_layers():
    s = spec("gemma3-12b")
    assert s.kv_groups == (KVGroup(FULL, 8),) + (KVGroup(WINDOW, 8, 1024),) * 5
    # 2 (K, V) x 8 KV heads x 256 x 2 bytes = 8 KiB per layer: 64 KiB per group, 384 KiB per token
    assert [s.kv_group_bytes_per_token(g) for g in s.kv_groups] == [65_536] * 6
    assert s.kv_bytes_per_token == 6 * 65_536


@pytest.mark.parametrize("name", ["mistral-7b-v0.1", "gemma3-12b"])
def test_the_full_attention_twin_is_one_full_group(name):
    assert spec(name, sliding_window=None).kv_groups == ()
    assert spec(name, sliding_window=None).kv_bytes_per_token == spec(name).kv_bytes_per_token


@pytest.mark.parametrize("name", ["llama3.1-8b", "qwen3-32b", "opt-13b", "llama2-7b"])
def test_full_attention_models_have_no_groups(name):
    assert spec(name).kv_groups == ()


@pytest.mark.parametrize("name", ["mistral-7b-v0.1", "gemma3-12b"])
def test_the_layer_pattern_is_transformers_own(name):
    transformers = pytest.importorskip("transformers")
    fields = dict(OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))["hf_config"])
    model_type = fields.pop("model_type")
    hf = transformers.AutoConfig.for_model(model_type, **fields)
    layer_types = getattr(hf, "layer_types", None) or ["sliding_attention"] * hf.num_hidden_layers
    expected = [hf.sliding_window if t == "sliding_attention" else 0 for t in layer_types]
    assert layer_windows({**fields}, model_type, hf.num_hidden_layers) == expected


def test_explicit_layer_types_win_and_groups_take_the_common_divisor():
    types = ["sliding_attention", "full_attention"] * 3
    windows = layer_windows({"sliding_window": 128, "layer_types": types}, "gemma2", 6)
    assert windows == [128, 0] * 3
    assert kv_groups(windows) == (KVGroup(FULL, 3), KVGroup(WINDOW, 3, 128))
    assert kv_groups([0, 0, 64, 64, 64, 64]) == (KVGroup(FULL, 2), KVGroup(WINDOW, 2, 64), KVGroup(WINDOW, 2, 64))


def test_bad_window_fields_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"model.hf_config.sliding_window=0 is invalid"):
        layer_windows({"sliding_window": 0}, "mistral", 4)
    with pytest.raises(ConfigError, match=r"model.hf_config.layer_types=.* is invalid: give num_hidden_layers=4"):
        layer_windows({"sliding_window": 8, "layer_types": ["full_attention"]}, "gemma2", 4)


def test_a_window_group_reads_at_most_its_window():
    group = KVGroup(WINDOW, 4, 1024)
    assert [group.held_tokens(n) for n in (1, 1024, 5000)] == [1, 1024, 1024]
    assert KVGroup(FULL, 4).held_tokens(5000) == 5000
