"""What the budget holds by layer kind: each model's kinds from its per-token bytes, and the peaks
split among them (the memory table's peak_<kind>_bytes)."""

from __future__ import annotations

from kvbench.api import build
from kvbench.metrics.kv_kinds import kind_peaks, kv_kinds


def kinds_of(model: str) -> dict[str, int] | None:
    return kv_kinds(build([f"model={model}", "hardware=h200-sxm"]).model)


def test_a_dense_full_attention_model_has_no_kinds_to_show():
    assert kinds_of("llama2-7b") is None


def test_each_new_architecture_names_its_kinds():
    deepseek = build(["model=deepseek-v3", "hardware=h200-sxm"]).model
    assert kv_kinds(deepseek) == {"latent": deepseek.kv_bytes_per_token}
    glm = build(["model=glm-5", "hardware=h200-sxm"]).model
    assert kv_kinds(glm) == {
        "latent": glm.kv_bytes_per_token - glm.indexer_bytes_per_token,
        "indexer": glm.indexer_bytes_per_token,
    }
    assert set(kinds_of("gpt-oss-120b")) == {"full", "window"}
    qwen = build(["model=qwen3.5-397b-a17b", "hardware=h200-sxm"]).model
    assert kv_kinds(qwen) == {"full": qwen.kv_bytes_per_token, "state": qwen.state_bytes_per_request}


def test_one_slot_of_every_layer_splits_by_per_token_bytes():
    kinds = {"latent": 300, "indexer": 100, "state": 7}
    peaks = kind_peaks(kinds, {"kv_held_bytes": 4_000, "state_bytes": 70})
    assert peaks == {"peak_latent_bytes": 3_000, "peak_indexer_bytes": 1_000, "peak_state_bytes": 70}
    assert kind_peaks({"full": 1, "window": 3}, {"kv_held_bytes": 8}) == {"peak_full_bytes": 2, "peak_window_bytes": 6}


def test_group_blocks_are_read_per_group():
    peaks = kind_peaks({"full": 10, "window": 10}, {"full_group_bytes": 500, "window_group_bytes": 120})
    assert peaks == {"peak_full_bytes": 500, "peak_window_bytes": 120}
