"""The mixture-of-experts families kvbench reads from their published config.json fields: shapes
(:mod:`kvbench.specs.architecture`) and parameter counts, part by part, layer by layer.

Each family's parameters are counted as transformers' modeling code (5.x,
``models/<type>/modeling_<type>.py``) builds them, and a test checks every shipped config against
it on the meta device: Kimi-K2's (``kimi_k2``, the text decoder of Kimi-K2.5) is DeepSeek-V3's
architecture and is counted as ``deepseek_v3``. Buffers that are not parameters (DeepSeek's and
MiniMax's ``e_score_correction_bias``, a few hundred values per layer) are not counted. The
multi-token-prediction (MTP, "nextn") layers some checkpoints carry (``num_nextn_predict_layers``,
``mtp_num_hidden_layers``) are not counted either: transformers does not build them and the serving
runs kvbench models do not run them. Vision towers of multimodal checkpoints (Kimi-K2.5,
Qwen3.5) are not counted: kvbench serves the text decoder.

Unlike the dense families, these have no defaults here: a field the formulas read must be in the
config (one line names the one missing), as every published config of these models spells it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbench.errors import ConfigError, require
from kvbench.specs.architecture import IndexerShape, LinearStateShape, MLAShape, MoEShape, ParamCounts
from kvbench.specs.kv_groups import STATE, layer_kinds

if TYPE_CHECKING:
    from kvbench.specs.model import ModelConfig

#: DeepSeek-V3's architecture: MLA, shared + routed experts after the first dense layers
DEEPSEEK_LIKE = ("deepseek_v3", "kimi_k2", "glm_moe_dsa")
MOE_FAMILIES = DEEPSEEK_LIKE + ("gpt_oss", "qwen3_moe", "qwen3_5_moe_text", "minimax_m2")
#: the fields every family's formulas read
_COMMON = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "max_position_embeddings")
#: positive-integer fields each family must give (beyond _COMMON)
REQUIRED: dict[str, tuple[str, ...]] = {
    "deepseek_v3": (
        "intermediate_size",
        "moe_intermediate_size",
        "n_routed_experts",
        "num_experts_per_tok",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
    ),
    "gpt_oss": ("num_key_value_heads", "head_dim", "intermediate_size", "num_local_experts", "num_experts_per_tok"),
    "qwen3_moe": ("num_key_value_heads", "head_dim", "moe_intermediate_size", "num_experts", "num_experts_per_tok"),
    "qwen3_5_moe_text": (
        "num_key_value_heads",
        "head_dim",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "num_experts",
        "num_experts_per_tok",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    ),
    "minimax_m2": ("num_key_value_heads", "head_dim", "intermediate_size", "num_local_experts", "num_experts_per_tok"),
}
REQUIRED["kimi_k2"] = REQUIRED["deepseek_v3"]
REQUIRED["glm_moe_dsa"] = REQUIRED["deepseek_v3"] + ("index_head_dim", "index_n_heads", "index_topk")
#: fields that may be 0 or absent (their default), never negative
NON_NEGATIVE_DEFAULTS = {
    "n_shared_experts": 0,
    "first_k_dense_replace": 0,
    "shared_intermediate_size": 0,
}
#: the SSM state dtypes a Qwen3.5 config may name (``mamba_ssm_dtype``), and their bytes
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


#: multimodal model types whose text decoder kvbench serves from ``text_config``
MULTIMODAL_TYPES = ("kimi_k25", "qwen3_5_moe")


def text_config(fields: dict[str, Any]) -> dict[str, Any]:
    """A multimodal checkpoint's text decoder fields (its ``text_config``), else ``fields``."""
    text = fields.get("text_config")
    if fields.get("model_type") in MULTIMODAL_TYPES and isinstance(text, dict):
        return dict(text)
    return fields


def _positive(fields: dict[str, Any], name: str, where: str) -> int:
    value = fields.get(name)
    if value is None:
        raise ConfigError(
            f"model.hf_config.{name} is missing{where}: give the value of the model's published config.json"
        )
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    require(ok, f"model.hf_config.{name}", value, f"use a positive integer{where}")
    return value


def _count(fields: dict[str, Any], name: str, where: str) -> int:
    value = fields.get(name, NON_NEGATIVE_DEFAULTS.get(name, 0))
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    require(ok, f"model.hf_config.{name}", value, f"use an integer >= 0{where}")
    return value


def _flag(fields: dict[str, Any], name: str, default: bool, where: str) -> bool:
    value = fields.get(name, default)
    require(isinstance(value, bool), f"model.hf_config.{name}", value, f"use true or false{where}")
    return value


def resolve_fields(fields: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """The generic fields ModelSpec reads (as :func:`kvbench.specs.model.resolve_architecture`
    returns them) plus the family's own, each checked; one-line ConfigError for bad input."""
    arch: dict[str, Any] = {"model_type": model_type}
    for name in _COMMON + REQUIRED[model_type]:
        arch[name] = _positive(fields, name, where)
    for name in NON_NEGATIVE_DEFAULTS:
        arch[name] = _count(fields, name, where)
    arch["tie_word_embeddings"] = _flag(fields, "tie_word_embeddings", False, where)
    arch["attention_bias"] = _flag(fields, "attention_bias", model_type == "gpt_oss", where)
    if model_type in DEEPSEEK_LIKE:
        q_lora = fields.get("q_lora_rank")
        ok = q_lora is None or (isinstance(q_lora, int) and not isinstance(q_lora, bool) and q_lora >= 1)
        require(ok, "model.hf_config.q_lora_rank", q_lora, f"use a positive integer or null{where}")
        arch["q_lora_rank"] = q_lora
        freq = fields.get("moe_layer_freq", 1)
        require(freq == 1, "model.hf_config.moe_layer_freq", freq, f"use 1 (every layer after the dense ones){where}")
        # the attention kernel's head: queries and keys of qk_nope + qk_rope dims (192 for DeepSeek-V3)
        arch["head_dim"] = arch["qk_nope_head_dim"] + arch["qk_rope_head_dim"]
        arch["num_key_value_heads"] = arch["num_attention_heads"]  # MLA: every head reads the latent
    if model_type == "qwen3_moe":
        only = fields.get("mlp_only_layers") or []
        ok = isinstance(only, (list, tuple)) and all(
            isinstance(i, int) and 0 <= i < arch["num_hidden_layers"] for i in only
        )
        require(ok, "model.hf_config.mlp_only_layers", only, f"give layer indices below num_hidden_layers{where}")
        step = fields.get("decoder_sparse_step", 1)
        ok = isinstance(step, int) and not isinstance(step, bool) and step >= 1
        require(ok, "model.hf_config.decoder_sparse_step", step, f"use a positive integer{where}")
        dense = [i in only or (i + 1) % step != 0 for i in range(arch["num_hidden_layers"])]
        arch["num_dense_layers"] = sum(dense)
        if arch["num_dense_layers"]:
            arch["intermediate_size"] = _positive(fields, "intermediate_size", where)
    if model_type == "qwen3_5_moe_text":
        arch["attn_output_gate"] = _flag(fields, "attn_output_gate", True, where)
        dtype = fields.get("mamba_ssm_dtype", "float32")
        require(
            dtype in STATE_DTYPE_BYTES,
            "model.hf_config.mamba_ssm_dtype",
            dtype,
            f"use one of {', '.join(STATE_DTYPE_BYTES)}{where}",
        )
        arch["state_dtype_bytes"] = STATE_DTYPE_BYTES[dtype]
        arch["layer_kinds"] = layer_kinds(fields, model_type, arch["num_hidden_layers"], where)
    if model_type == "minimax_m2":
        arch["use_qk_norm"] = _flag(fields, "use_qk_norm", True, where)
        norm_type = fields.get("qk_norm_type", "per_layer")
        require(norm_type == "per_layer", "model.hf_config.qk_norm_type", norm_type, f"use per_layer{where}")
    if model_type in DEEPSEEK_LIKE:
        dense = arch["first_k_dense_replace"]
        require(
            dense <= arch["num_hidden_layers"],
            "model.hf_config.first_k_dense_replace",
            dense,
            f"use at most num_hidden_layers={arch['num_hidden_layers']}{where}",
        )
        arch["num_dense_layers"] = dense
    heads, kv_heads = arch["num_attention_heads"], arch["num_key_value_heads"]
    require(
        heads % kv_heads == 0,
        "model.hf_config.num_key_value_heads",
        kv_heads,
        f"must divide num_attention_heads={heads}{where}",
    )
    arch.setdefault("num_dense_layers", 0)
    return arch


@dataclass(frozen=True)
class Shapes:
    """A family's parts beyond a dense transformer (each None where the model has none)."""

    moe: MoEShape
    mla: MLAShape | None = None
    linear: LinearStateShape | None = None
    indexer: IndexerShape | None = None
    attention_sinks: bool = False


def shapes(arch: dict[str, Any]) -> Shapes:
    """The shapes of a model resolved by :func:`resolve_fields`."""
    t = arch["model_type"]
    if t in DEEPSEEK_LIKE:
        moe = MoEShape(
            num_experts=arch["n_routed_experts"],
            experts_per_token=arch["num_experts_per_tok"],
            expert_intermediate_size=arch["moe_intermediate_size"],
            num_shared_experts=arch["n_shared_experts"],
            shared_intermediate_size=arch["n_shared_experts"] * arch["moe_intermediate_size"],
            num_dense_layers=arch["num_dense_layers"],
        )
        mla = MLAShape(
            kv_lora_rank=arch["kv_lora_rank"],
            qk_rope_head_dim=arch["qk_rope_head_dim"],
            qk_nope_head_dim=arch["qk_nope_head_dim"],
            v_head_dim=arch["v_head_dim"],
            q_lora_rank=arch["q_lora_rank"],
        )
        indexer = None
        if t == "glm_moe_dsa":
            indexer = IndexerShape(arch["index_head_dim"], arch["index_n_heads"], arch["index_topk"])
        return Shapes(moe, mla=mla, indexer=indexer)
    if t in ("gpt_oss", "minimax_m2"):
        moe = MoEShape(arch["num_local_experts"], arch["num_experts_per_tok"], arch["intermediate_size"])
        return Shapes(moe, attention_sinks=t == "gpt_oss")
    shared = arch.get("shared_expert_intermediate_size", 0)
    moe = MoEShape(
        num_experts=arch["num_experts"],
        experts_per_token=arch["num_experts_per_tok"],
        expert_intermediate_size=arch["moe_intermediate_size"],
        num_shared_experts=1 if shared else 0,
        shared_intermediate_size=shared,
        num_dense_layers=arch["num_dense_layers"],
    )
    if t == "qwen3_5_moe_text":
        linear = LinearStateShape(
            num_key_heads=arch["linear_num_key_heads"],
            num_value_heads=arch["linear_num_value_heads"],
            key_head_dim=arch["linear_key_head_dim"],
            value_head_dim=arch["linear_value_head_dim"],
            conv_kernel_size=arch["linear_conv_kernel_dim"],
            state_dtype_bytes=arch["state_dtype_bytes"],
        )
        return Shapes(moe, linear=linear)
    return Shapes(moe)


def num_linear_layers(arch: dict[str, Any]) -> int:
    return sum(1 for kind, _ in arch.get("layer_kinds", ()) if kind == STATE)


def _gqa_attention(arch: dict[str, Any], q_width_factor: int = 1) -> int:
    """A grouped-query attention layer's projections (q, k, v, o) and their biases."""
    h, heads, kv, d = arch["hidden_size"], arch["num_attention_heads"], arch["num_key_value_heads"], arch["head_dim"]
    params = h * heads * d * q_width_factor + 2 * h * kv * d + heads * d * h
    if arch["attention_bias"]:
        params += heads * d * q_width_factor + 2 * kv * d + h
    return params


def _mla_attention(arch: dict[str, Any], s: Shapes) -> int:
    """An MLA layer (DeepSeek-V3's modeling code): q (compressed or not), the KV latent projection
    and its norm, the up-projection to every head's no-rope key and value, the output; plus a
    sparse model's indexer (wq_b, wk, its LayerNorm, weights_proj)."""
    h, heads, m = arch["hidden_size"], arch["num_attention_heads"], s.mla
    bias = arch["attention_bias"]
    if m.q_lora_rank is None:
        q = h * heads * m.qk_head_dim
    else:
        q = h * m.q_lora_rank + (m.q_lora_rank if bias else 0) + m.q_lora_rank + m.q_lora_rank * heads * m.qk_head_dim
    kv_a = h * m.latent_values_per_token + (m.latent_values_per_token if bias else 0)
    kv = kv_a + m.kv_lora_rank + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    o = heads * m.v_head_dim * h + (h if bias else 0)
    indexer = 0
    if s.indexer is not None:
        i = s.indexer
        q_in = m.q_lora_rank if m.q_lora_rank is not None else h
        indexer = q_in * i.index_n_heads * i.index_head_dim + h * i.index_head_dim + 2 * i.index_head_dim
        indexer += h * i.index_n_heads
    return q + kv + o + indexer


def _linear_attention(arch: dict[str, Any], lin: LinearStateShape) -> int:
    """A gated delta net layer (Qwen3.5's modeling code): the q/k/v, z, b and a input projections,
    the depthwise conv over q, k and v, dt_bias and A_log per value head, the gated norm, the
    output projection."""
    h = arch["hidden_size"]
    key_dim, value_dim = lin.num_key_heads * lin.key_head_dim, lin.num_value_heads * lin.value_head_dim
    conv_dim = 2 * key_dim + value_dim
    proj = h * conv_dim + h * value_dim + 2 * h * lin.num_value_heads
    return proj + conv_dim * lin.conv_kernel_size + 2 * lin.num_value_heads + lin.value_head_dim + value_dim * h


def count_parts(arch: dict[str, Any], s: Shapes) -> ParamCounts:
    """Parameters by part (:class:`ParamCounts`), layer by layer."""
    t, h, n_layers, vocab = arch["model_type"], arch["hidden_size"], arch["num_hidden_layers"], arch["vocab_size"]
    moe = s.moe
    n_moe = n_layers - moe.num_dense_layers
    norms = 2 * h  # input_layernorm, post_attention_layernorm
    expert = 3 * h * moe.expert_intermediate_size  # gate, up, down
    router = n_moe * h * moe.num_experts
    shared = n_moe * 3 * h * moe.shared_intermediate_size
    if t in DEEPSEEK_LIKE:
        attention = n_layers * (_mla_attention(arch, s) + norms)
    elif t == "gpt_oss":
        # biases on q, k, v, o and a learned sink logit per head
        attention = n_layers * (_gqa_attention(arch) + arch["num_attention_heads"] + norms)
        expert += 2 * moe.expert_intermediate_size + h  # gate_up and down biases
        router += n_moe * moe.num_experts  # the router's bias
    elif t == "qwen3_moe":
        attention = n_layers * (_gqa_attention(arch) + 2 * arch["head_dim"] + norms)  # + q_norm, k_norm
    elif t == "minimax_m2":
        qk_norm = (arch["num_attention_heads"] + arch["num_key_value_heads"]) * arch["head_dim"]
        attention = n_layers * (_gqa_attention(arch) + (qk_norm if arch["use_qk_norm"] else 0) + norms)
    elif t == "qwen3_5_moe_text":
        n_linear = num_linear_layers(arch)
        gate = 2 if arch["attn_output_gate"] else 1  # q_proj also yields the output gate
        full = _gqa_attention(arch, gate) + 2 * arch["head_dim"]  # + q_norm, k_norm
        attention = n_layers * norms + n_linear * _linear_attention(arch, s.linear) + (n_layers - n_linear) * full
        router += n_moe * h  # shared_expert_gate: one sigmoid gate per token on the shared expert
    else:
        raise ConfigError(f"model.hf_config.model_type={t!r} has no parameter-count formula")
    return ParamCounts(
        embedding=vocab * h,
        lm_head=0 if arch["tie_word_embeddings"] else vocab * h,
        attention=attention + h,  # + the final norm
        dense_mlp=moe.num_dense_layers * 3 * h * arch.get("intermediate_size", 0),
        shared_experts=shared,
        routed_experts=n_moe * moe.num_experts * expert,
        router=router,
    )


def check_layout(cfg: ModelConfig, parts: Shapes | None) -> None:
    """Refuse, in one line, a layout the model cannot take: experts on a dense model, an expert
    count ep does not divide, linear-attention heads tp does not divide."""
    if parts is None:
        for key in ("ep", "moe_dtype"):
            value = getattr(cfg, key)
            if value not in (1, None):
                raise ConfigError(
                    f"model.{key}={value!r} is invalid: {cfg.name} has no experts; leave it at its default"
                )
        return
    experts = parts.moe.num_experts
    require(
        experts % cfg.ep == 0,
        "model.ep",
        cfg.ep,
        f"must divide the {experts} routed experts of {cfg.name} (each expert-parallel group holds whole experts)",
    )
    if parts.linear is not None:
        lin = parts.linear
        ok = lin.num_key_heads % cfg.tp == 0 and lin.num_value_heads % cfg.tp == 0
        require(
            ok,
            "model.tp",
            cfg.tp,
            f"must divide the {lin.num_key_heads} key and {lin.num_value_heads} value heads of the linear-attention layers",
        )
