"""ModelSpec: what a transformer costs in KV bytes, weight bytes and FLOPs, from its config.json fields.

``conf/model/<name>.yaml`` carries the config fields of a Hugging Face ``config.json`` (or a path to
a local one). Field names and defaults (``num_key_value_heads``, ``head_dim``,
``tie_word_embeddings``...) mean exactly what they mean to transformers: :data:`FAMILY_DEFAULTS`
copies transformers' defaults for the fields kvbench reads, and a test checks every model in
``conf/model/`` against transformers' ``AutoConfig``. transformers itself is not imported: it
imports torch, which took seconds of a run that only needs a dozen integers.
The parameter count is computed from the architecture, not typed in.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.errors import ConfigError, require
from kvbench.specs import architecture, moe_models
from kvbench.specs.architecture import MODEL_DTYPES, MOE_DTYPES, WEIGHT_DTYPE_BYTES, kind_of
from kvbench.specs.kv_groups import STATE, KVGroup, is_hybrid, kv_groups, layer_kinds
from kvbench.specs.names import require_name

#: bytes per KV-cache element (model.kv_dtype); the weights' precisions are
#: architecture.WEIGHT_DTYPE_BYTES (model.dtype adds fp8_block and nvfp4)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}
#: families whose parameters are counted with the gated-MLP (LLaMA) formula
LLAMA_LIKE = ("llama", "mistral", "qwen3")
#: families counted with Gemma's formula: the gated MLP, four RMSNorms per layer (around attention
#: and around the MLP), tied embeddings; Gemma-3 adds a q_norm and a k_norm over each head
GEMMA_LIKE = ("gemma2", "gemma3_text")
#: the most GPUs one deployment (tp x attention_dp) spans: one NVL72 rack (GB200/GB300), the widest
#: NVLink domain the public measurements were taken on
MAX_GPUS = 72
#: the shape transformers gives both Gemma-2 and Gemma-3's text decoder by default: Gemma-2 2B's
_GEMMA_2B_SHAPE = {
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
}
#: per model type, the defaults of the fields kvbench reads, as in transformers 5.x
#: ``models/<type>/configuration_<type>.py``. None: derived from other fields when absent or null
#: (head_dim = hidden_size // heads, num_key_value_heads = heads, word_embed_proj_dim = hidden_size);
#: a field whose default is not None may not be null (transformers refuses it too). Fields kvbench
#: does not read (rope_scaling, rms_norm_eps...) are passed over: they change no number here.
FAMILY_DEFAULTS: dict[str, dict[str, int | bool | None]] = {
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "head_dim": None,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    },
    # Mistral: 8 KV heads unless told (not "as many as the query heads"), no biases, 128K positions
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
    },
    # Qwen3: LLaMA's shape plus an RMSNorm over each head's queries and keys (q_norm, k_norm), and
    # an explicit head_dim (128) that need not be hidden_size // heads
    "qwen3": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "attention_bias": False,
    },
    # OPT ties the LM head to the embeddings by default, unlike LLaMA
    "opt": {
        "vocab_size": 50272,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "ffn_dim": 3072,
        "max_position_embeddings": 2048,
        "do_layer_norm_before": True,
        "_remove_final_layer_norm": False,
        "word_embed_proj_dim": None,
        "num_attention_heads": 12,
        "enable_bias": True,
        "layer_norm_elementwise_affine": True,
        "tie_word_embeddings": True,
    },
    # Gemma-2 (2B's shape by default): window and full attention layers alternate (kvbench.specs.kv_groups)
    "gemma2": {
        "vocab_size": 256000,
        **_GEMMA_2B_SHAPE,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
    # Gemma-3's text decoder (gemma3_text): five window layers per full one by default
    "gemma3_text": {
        "vocab_size": 262208,
        **_GEMMA_2B_SHAPE,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
}
#: families whose transformers config or attention layer refuses a hidden size that the heads do not
#: divide (Mistral does not: its head_dim may be set apart from hidden_size)
HEADS_DIVIDE_HIDDEN = ("llama", "opt")
#: what a model type outside FAMILY_DEFAULTS must spell out, since kvbench knows no defaults for it
#: (and model.num_params, since it has no parameter-count formula)
GENERIC_SHAPE_FIELDS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "max_position_embeddings")
#: the architecture fields ModelSpec and count_params read (each where the model type has it): all
#: must be positive integers, or a zero-layer model divides by zero and a negative width prints
#: negative memory
ARCHITECTURE_FIELDS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "intermediate_size",
    "ffn_dim",
    "word_embed_proj_dim",
    "vocab_size",
    "max_position_embeddings",
)
#: the longest context a model config may declare: 2**24 = 16.8M tokens, above any released model's
#: (the longest, Llama 4 Scout, has 10M). The positions bound every request's S_max and so the sizes
#: of allocations, so a typo (an extra digit, 1e12) is refused instead of being planned for.
MAX_POSITION_EMBEDDINGS = 2**24


@dataclass
class ModelConfig:
    #: a short name used in result rows
    name: str = "llama2-7b"
    #: path to a local config.json (or a folder holding one); when set it replaces ``hf_config``
    config_path: str | None = None
    #: fields of a transformers config.json, model_type included
    hf_config: dict[str, Any] = field(default_factory=dict)
    #: weight dtype of every weight but the routed experts (float32, float16, bfloat16, float8 =
    #: per-tensor fp8, fp8_block = fp8 with a scale per 128x128 tile, nvfp4), and the KV cache's
    #: unless kv_dtype says otherwise (fp8_block and nvfp4 checkpoints compute in bfloat16: their KV
    #: cache is bfloat16 by default, as vLLM's kv_cache_dtype=auto gives)
    dtype: str = "float16"
    #: KV-cache dtype; null: the weights' dtype. float8 halves the bytes per token of a 16-bit cache,
    #: so every allocator holds twice the tokens in the same budget
    kv_dtype: str | None = None
    #: tensor-parallel GPUs: weights and attention heads split across them (KV heads are replicated
    #: when there are fewer than GPUs, as vLLM does). Every byte count kvbench reports (weights, KV
    #: per token, the KV budget) is per GPU
    tp: int = 1
    #: override the parameter count computed from the architecture
    num_params: int | None = None
    #: expert-parallel GPUs: the routed experts are split, whole, across ep groups of moe_tp = tp x
    #: attention_dp / ep GPUs each (aiconfigurator's convention: tp x attention_dp = moe_tp x moe_ep)
    ep: int = 1
    #: attention data-parallel ranks: tp x attention_dp GPUs in all, each rank of tp GPUs running its
    #: own requests' attention (and holding their KV); the MoE layers see every rank's tokens
    attention_dp: int = 1
    #: the routed experts' weight precision (bfloat16, fp8, fp8_block, nvfp4, mxfp4, int4); null:
    #: model.dtype's
    moe_dtype: str | None = None

    def validate(self) -> None:
        require_name("model.name", self.name)
        require(self.dtype in MODEL_DTYPES, "model.dtype", self.dtype, f"choose one of {', '.join(MODEL_DTYPES)}")
        ok = self.moe_dtype is None or self.moe_dtype in MOE_DTYPES
        require(ok, "model.moe_dtype", self.moe_dtype, f"choose null or one of {', '.join(MOE_DTYPES)}")
        ok = self.kv_dtype is None or self.kv_dtype in DTYPE_BYTES
        require(ok, "model.kv_dtype", self.kv_dtype, f"choose null or one of {', '.join(DTYPE_BYTES)}")
        # (a tensor-parallel group spans at most one NVLink domain: the run's setup checks it
        # against hardware.nvlink_domain_gpus, which only the hardware config knows)
        ok = isinstance(self.tp, int) and not isinstance(self.tp, bool) and 1 <= self.tp <= MAX_GPUS
        require(ok, "model.tp", self.tp, f"use 1 to {MAX_GPUS} GPUs")
        for key in ("ep", "attention_dp"):
            value = getattr(self, key)
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_GPUS
            require(ok, f"model.{key}", value, f"use 1 to {MAX_GPUS} GPUs")
        gpus = self.tp * self.attention_dp
        require(
            gpus <= MAX_GPUS,
            "model.attention_dp",
            self.attention_dp,
            f"model.tp x model.attention_dp must be at most {MAX_GPUS} GPUs",
        )
        require(
            gpus % self.ep == 0,
            "model.ep",
            self.ep,
            f"must divide model.tp x model.attention_dp = {gpus} GPUs (each expert-parallel group is "
            "tp x attention_dp / ep GPUs)",
        )
        require(
            self.num_params is None or self.num_params > 0,
            "model.num_params",
            self.num_params,
            "use a positive count or null",
        )
        require(
            bool(self.config_path) or bool(self.hf_config),
            "model.hf_config",
            self.hf_config,
            "give the config.json fields or model.config_path",
        )


@dataclass(frozen=True)
class ModelSpec:
    """A model as one GPU of its deployment sees it. ``num_heads`` and ``num_kv_heads`` are the whole
    model's; the byte counts below are per GPU. The parts a dense transformer lacks (experts, latent
    attention, linear-attention state, a sparse indexer: :mod:`kvbench.specs.architecture`) are
    None for a model without them, whose numbers are then the ones they always were."""

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    #: one head's width (an MLA model's query/key head: qk_nope_head_dim + qk_rope_head_dim)
    head_dim: int
    #: bytes per weight element (an integer for float32/16/8; fp8_block and nvfp4 count their scales)
    dtype_bytes: float
    num_params: int
    #: the longest sequence the model takes (its ``max_position_embeddings``)
    max_positions: int = 0
    #: bytes per KV-cache element; None: dtype_bytes
    kv_dtype_bytes: int | None = None
    #: tensor-parallel GPUs
    tp: int = 1
    #: the GEMM shapes a profiled cost model prices (0: unknown, the roofline needs none of them)
    hidden_size: int = 0
    #: the MLP's inner width (LLaMA's intermediate_size, OPT's ffn_dim; a MoE model's dense layers')
    intermediate_size: int = 0
    vocab_size: int = 0
    #: a gated MLP (gate and up projections, LLaMA) rather than two plain ones (OPT)
    gated_mlp: bool = True
    #: the KV-cache groups (:mod:`kvbench.specs.kv_groups`) of a model with sliding-window or
    #: linear-attention layers; () for a full-attention model (one full group of every layer)
    kv_groups: tuple[KVGroup, ...] = ()
    #: routed (and shared) experts; None: a dense MLP in every layer
    moe: architecture.MoEShape | None = None
    #: multi-head latent attention: every layer caches one latent per token (not split by tp)
    mla: architecture.MLAShape | None = None
    #: the linear-attention (gated delta net) layers' state shape; which layers: kv_groups' STATE groups
    linear: architecture.LinearStateShape | None = None
    #: a sparse-attention indexer (its fp8 key cache per token and layer)
    indexer: architecture.IndexerShape | None = None
    #: learned per-head attention-sink logits (gpt-oss): no bytes, a different kernel
    attention_sinks: bool = False
    #: expert-parallel groups and attention data-parallel ranks (:class:`ModelConfig`)
    ep: int = 1
    attention_dp: int = 1
    #: the routed experts' precision (a WEIGHT_DTYPE_BYTES name); None for a dense model
    moe_dtype: str | None = None
    #: parameters by part, where the family is counted part by part (the MoE families); None: the
    #: weights are num_params x dtype_bytes split by tp
    param_counts: architecture.ParamCounts | None = None

    @property
    def architecture(self) -> str:  # dense, moe, mla-moe, ... (kvbench.specs.architecture.kind_of)
        return kind_of(self.moe, self.mla, self.linear, self.indexer, self.attention_sinks)

    @property
    def num_gpus(self) -> int:  # in the deployment
        return self.tp * self.attention_dp

    @property
    def moe_tp(self) -> int:  # the GPUs each routed expert is split across
        return self.num_gpus // self.ep

    @property
    def kv_layer_bytes_per_token(self) -> int:
        """K and V of one token in one token-holding layer, on one GPU: 2 x KV heads per GPU x
        head_dim x bytes, or an MLA layer's latent (kv_lora_rank + qk_rope_head_dim values, whole on
        every GPU) plus its indexer key where the model is sparse."""
        if self.mla is not None:
            latent = self.mla.latent_values_per_token * self.kv_element_bytes
            return latent + (0 if self.indexer is None else self.indexer.layer_bytes_per_token)
        return 2 * self.kv_heads_per_gpu * self.head_dim * self.kv_element_bytes

    def kv_group_bytes_per_token(self, group: KVGroup) -> int:
        """KV of one token in the layers of ``group``, on one GPU (0 for a state group)."""
        return 0 if group.kind == STATE else group.num_layers * self.kv_layer_bytes_per_token

    @property
    def kv_element_bytes(self) -> int:
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    @property
    def kv_heads_per_gpu(self) -> int:
        """KV heads one GPU holds: split across the group, replicated when fewer than the GPUs."""
        return max(1, self.num_kv_heads // self.tp)

    @property
    def heads_per_gpu(self) -> int:
        return self.num_heads // self.tp

    @property
    def num_state_layers(self) -> int:  # linear-attention layers: a state per request, no KV per token
        return sum(g.num_layers for g in self.kv_groups if g.kind == STATE)

    @property
    def num_token_layers(self) -> int:  # layers that keep KV per token (full, window, MLA)
        return self.num_layers - self.num_state_layers

    @property
    def kv_bytes_per_token(self) -> int:
        """KV of one token in every token-holding layer, on one GPU: 2 * L * n_kv / tp * d_head *
        bytes for a dense model; L * (latent + indexer key) for an MLA one."""
        return self.num_token_layers * self.kv_layer_bytes_per_token

    @property
    def indexer_bytes_per_token(self) -> int:
        """The sparse indexer's share of kv_bytes_per_token (0 for a dense-attention model)."""
        return 0 if self.indexer is None else self.num_token_layers * self.indexer.layer_bytes_per_token

    @property
    def state_bytes_per_request(self) -> int:
        """Every linear-attention layer's state for one request, on one GPU (0 for models without)."""
        return sum(g.state_bytes for g in self.kv_groups if g.kind == STATE)

    @property
    def moe_dtype_bytes(self) -> float:
        return self.dtype_bytes if self.moe_dtype is None else WEIGHT_DTYPE_BYTES[self.moe_dtype]

    @property
    def weight_bytes(self) -> int:
        """One GPU's share of the weights. A dense model: every matrix split by tp (the norms it
        replicates are a few hundred KB, left out). A model counted by part: attention, dense and
        shared-expert weights, embeddings and LM head split by tp, routed experts across all
        tp x attention_dp GPUs, routers replicated (:meth:`ParamCounts.weight_bytes_per_gpu`)."""
        if self.param_counts is None:
            return int(self.num_params * self.dtype_bytes // self.tp)
        scale = self.num_params / self.param_counts.total  # 1.0 unless model.num_params was typed in
        return self.param_counts.weight_bytes_per_gpu(
            self.dtype_bytes, self.moe_dtype_bytes, self.tp, self.attention_dp, scale
        )

    @property
    def active_params(self) -> int:
        """Parameters one token runs through (num_params for a dense model; a MoE model's shared
        parts plus experts_per_token of its routed experts)."""
        if self.param_counts is None or self.moe is None:
            return self.num_params
        return round(self.param_counts.active(self.moe) * self.num_params / self.param_counts.total)

    def prefill_flops(self, num_tokens: int) -> float:
        """FLOPs to prefill ``num_tokens`` tokens: 2*N*S + 4*L*H*d*S^2 (the lecture's formula), N the
        active parameters and L the attention (token-holding) layers."""
        return (
            2.0 * self.active_params * num_tokens
            + 4.0 * self.num_token_layers * self.num_heads * self.head_dim * num_tokens**2
        )


def _check_architecture(values: dict[str, Any], where: str) -> None:
    """Every architecture field present (not null) is a positive integer (bool excluded), and the
    positions are within MAX_POSITION_EMBEDDINGS. ``where`` says where the value came from."""
    for name in ARCHITECTURE_FIELDS:
        value = values.get(name)
        if value is None:
            continue  # absent for this model type, or derived from other fields
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        require(ok, f"model.hf_config.{name}", value, f"use a positive integer{where}")
    positions = values.get("max_position_embeddings")
    if positions is not None:
        require(
            positions <= MAX_POSITION_EMBEDDINGS,
            "model.hf_config.max_position_embeddings",
            positions,
            f"use at most 2**24 = {MAX_POSITION_EMBEDDINGS:,} tokens (above any released model){where}",
        )


def _read_fields(cfg: ModelConfig) -> tuple[dict[str, Any], str]:
    """The config.json fields (from model.config_path or model.hf_config) and where they came from
    (" (in <path>)" for a file, "" for the YAML), for error messages. A multimodal checkpoint's
    config (Kimi-K2.5's kimi_k25, Qwen3.5's qwen3_5_moe) gives its text decoder's ``text_config``."""
    if not cfg.config_path:
        return moe_models.text_config(dict(cfg.hf_config)), ""
    path = Path(cfg.config_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"model.config_path={cfg.config_path!r} is invalid: no config.json there")
    try:
        fields = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        detail = f"line {exc.lineno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
        raise ConfigError(f"model.config_path={cfg.config_path!r} is not valid JSON: {detail}") from None
    if not isinstance(fields, dict):
        raise ConfigError(
            f"model.config_path={cfg.config_path!r} holds a JSON {type(fields).__name__}, not an "
            "object of config.json fields"
        )
    return moe_models.text_config(fields), f" (in {path})"


def _unknown_type_error(model_type: Any, fields: dict[str, Any], has_num_params: bool, where: str) -> ConfigError:
    """One line for a model type without built-in defaults: what to spell out, or the type meant."""
    guess = difflib.get_close_matches(str(model_type), FAMILY_DEFAULTS, n=1)
    hint = f" (did you mean {guess[0]!r}?)" if guess else ""
    missing = [name for name in GENERIC_SHAPE_FIELDS if fields.get(name) is None]
    needs = [] if has_num_params else ["set model.num_params"]
    if missing:
        needs.append(f"give {', '.join(missing)} in model.hf_config")
    return ConfigError(
        f"model.hf_config.model_type={model_type!r}{where} is not one kvbench knows the defaults of"
        f"{hint}: use one of {', '.join(FAMILY_DEFAULTS)}, or {' and '.join(needs)}"
    )


def resolve_architecture(cfg: ModelConfig) -> dict[str, Any]:
    """The fields ModelSpec and count_params read, defaults and derived values filled in as
    transformers fills them, ``model_type`` included; one-line ConfigError for bad input."""
    fields, where = _read_fields(cfg)
    model_type = fields.get("model_type")
    if not model_type:
        raise ConfigError(f"model.hf_config.model_type is missing{where}: give the transformers model_type, e.g. llama")
    if model_type in moe_models.MOE_FAMILIES:
        return moe_models.resolve_fields(fields, model_type, where)
    defaults = FAMILY_DEFAULTS.get(model_type) if isinstance(model_type, str) else None
    if defaults is None:
        # no defaults known: usable only when every shape field is given and the count is typed in
        if cfg.num_params is None or any(fields.get(name) is None for name in GENERIC_SHAPE_FIELDS):
            raise _unknown_type_error(model_type, fields, cfg.num_params is not None, where)
        defaults = dict.fromkeys(GENERIC_SHAPE_FIELDS + ("num_key_value_heads", "head_dim"))
    _check_architecture(fields, where)
    arch: dict[str, Any] = {"model_type": model_type}
    for name, default in defaults.items():
        value = fields.get(name, default)
        if value is None and default is not None:
            kind = "true or false" if isinstance(default, bool) else "a positive integer"
            raise ConfigError(
                f"model.hf_config.{name}=None is invalid: use {kind}, or leave it out for "
                f"{model_type}'s default ({default}){where}"
            )
        if isinstance(default, bool):
            require(isinstance(value, bool), f"model.hf_config.{name}", value, f"use true or false{where}")
        arch[name] = value
    hidden, n_heads = arch["hidden_size"], arch["num_attention_heads"]
    if arch.get("head_dim") is None:  # null, or not a field of the family (OPT): derived
        require(
            hidden >= n_heads,
            "model.hf_config.hidden_size",
            hidden,
            f"must be at least num_attention_heads={n_heads}{where}",
        )
        arch["head_dim"] = hidden // n_heads
    if model_type in HEADS_DIVIDE_HIDDEN:
        require(
            hidden % n_heads == 0,
            "model.hf_config.num_attention_heads",
            n_heads,
            f"must divide hidden_size={hidden}, as transformers' {model_type} model requires{where}",
        )
    if arch.get("num_key_value_heads") is None:  # null, or not a field of the family (OPT): multi-head
        arch["num_key_value_heads"] = n_heads
    n_kv = arch["num_key_value_heads"]
    require(
        n_heads % n_kv == 0,
        "model.hf_config.num_key_value_heads",
        n_kv,
        f"must divide num_attention_heads={n_heads}{where}",
    )
    if "word_embed_proj_dim" in arch and arch["word_embed_proj_dim"] is None:
        arch["word_embed_proj_dim"] = hidden
    return arch


def count_params(arch: dict[str, Any]) -> int:
    """Parameters of a decoder-only model from its resolved architecture (embeddings and LM head
    included), layer by layer as transformers' modeling code builds it."""
    if arch["model_type"] in moe_models.MOE_FAMILIES:
        return moe_models.count_parts(arch, moe_models.shapes(arch)).total
    h, n_layers, vocab = arch["hidden_size"], arch["num_hidden_layers"], arch["vocab_size"]
    if arch["model_type"] in LLAMA_LIKE:
        n_heads, n_kv, d = arch["num_attention_heads"], arch["num_key_value_heads"], arch["head_dim"]
        ffn = arch["intermediate_size"]
        attn = h * n_heads * d + 2 * h * n_kv * d + n_heads * d * h
        if arch.get("attention_bias", False):  # Mistral has no biases
            attn += n_heads * d + 2 * n_kv * d + h
        mlp = 3 * h * ffn
        if arch.get("mlp_bias", False):
            mlp += 2 * ffn + h  # gate and up project to ffn, down back to h
        per_layer = attn + mlp + 2 * h  # two RMSNorm weights
        if arch["model_type"] == "qwen3":
            per_layer += 2 * d  # q_norm and k_norm: one RMSNorm weight over head_dim each
        head = 0 if arch["tie_word_embeddings"] else vocab * h
        return vocab * h + head + n_layers * per_layer + h  # embeddings, head, layers, final norm
    if arch["model_type"] in GEMMA_LIKE:
        n_heads, n_kv, d = arch["num_attention_heads"], arch["num_key_value_heads"], arch["head_dim"]
        attn = h * n_heads * d + 2 * h * n_kv * d + n_heads * d * h
        if arch["attention_bias"]:
            attn += n_heads * d + 2 * n_kv * d + h
        per_layer = attn + 3 * h * arch["intermediate_size"] + 4 * h  # four RMSNorm weights
        if arch["model_type"] == "gemma3_text":
            per_layer += 2 * d  # q_norm and k_norm
        head = 0 if arch["tie_word_embeddings"] else vocab * h
        return vocab * h + head + n_layers * per_layer + h
    if arch["model_type"] == "opt":
        ffn, proj = arch["ffn_dim"], arch["word_embed_proj_dim"]
        bias = 1 if arch["enable_bias"] else 0
        norm = 2 * h if arch["layer_norm_elementwise_affine"] else 0  # weight and bias, or nothing
        attn = 4 * (h * h + bias * h)  # q, k, v, out
        mlp = (h * ffn + bias * ffn) + (ffn * h + bias * h)  # fc1, fc2
        per_layer = attn + mlp + 2 * norm
        embed = vocab * proj + (arch["max_position_embeddings"] + 2) * h  # OPT offsets positions by 2
        projections = 0 if proj == h else 2 * h * proj
        final_norm = norm if arch["do_layer_norm_before"] and not arch["_remove_final_layer_norm"] else 0
        head = 0 if arch["tie_word_embeddings"] else vocab * proj
        return embed + projections + n_layers * per_layer + final_norm + head
    raise ConfigError(
        f"model.hf_config.model_type={arch['model_type']!r} has no parameter-count formula; "
        f"use one of {', '.join(FAMILY_DEFAULTS)} or set model.num_params"
    )


def model_spec(cfg: ModelConfig) -> ModelSpec:
    """Build the ModelSpec for a validated ModelConfig."""
    arch = resolve_architecture(cfg)
    heads, kv_heads = arch["num_attention_heads"], arch["num_key_value_heads"]
    # vLLM's rule: the query heads split evenly, and the KV heads split evenly or each is replicated
    ok = heads % cfg.tp == 0 and (kv_heads % cfg.tp == 0 or cfg.tp % kv_heads == 0)
    require(
        ok,
        "model.tp",
        cfg.tp,
        f"must divide the {heads} attention heads and divide or be a multiple of the {kv_heads} KV heads",
    )
    parts = moe_models.shapes(arch) if arch["model_type"] in moe_models.MOE_FAMILIES else None
    moe_models.check_layout(cfg, parts)
    dtype_bytes = WEIGHT_DTYPE_BYTES[cfg.dtype]
    # fp8_block and nvfp4 checkpoints compute (and cache KV) in bfloat16 unless kv_dtype says otherwise
    kv_bytes = DTYPE_BYTES[cfg.kv_dtype] if cfg.kv_dtype is not None else (None if cfg.dtype in DTYPE_BYTES else 2)
    counts = None if parts is None else moe_models.count_parts(arch, parts)
    num_params = cfg.num_params or (counts.total if counts is not None else count_params(arch))
    return ModelSpec(
        name=cfg.name,
        num_layers=arch["num_hidden_layers"],
        num_heads=arch["num_attention_heads"],
        num_kv_heads=arch["num_key_value_heads"],
        head_dim=arch["head_dim"],
        dtype_bytes=dtype_bytes,
        num_params=num_params,
        max_positions=arch["max_position_embeddings"],
        kv_dtype_bytes=kv_bytes,
        tp=cfg.tp,
        hidden_size=arch["hidden_size"],
        intermediate_size=arch.get("intermediate_size") or arch.get("ffn_dim") or 0,
        vocab_size=arch.get("vocab_size") or 0,
        gated_mlp=arch["model_type"] in LLAMA_LIKE + GEMMA_LIKE + moe_models.MOE_FAMILIES,
        kv_groups=_hybrid_groups(cfg, arch, parts, architecture.unquantized_bytes(dtype_bytes)),
        moe=None if parts is None else parts.moe,
        mla=None if parts is None else parts.mla,
        linear=None if parts is None else parts.linear,
        indexer=None if parts is None else parts.indexer,
        attention_sinks=parts is not None and parts.attention_sinks,
        ep=cfg.ep,
        attention_dp=cfg.attention_dp,
        moe_dtype=None if parts is None else (cfg.moe_dtype or cfg.dtype),
        param_counts=counts,
    )


def _hybrid_groups(
    cfg: ModelConfig, arch: dict[str, Any], parts: moe_models.Shapes | None, activation_bytes: float
) -> tuple[KVGroup, ...]:
    """The model's KV-cache groups when it has sliding-window or linear-attention layers, else ()
    (full attention). A state group's bytes: its layers' state per request on one GPU."""
    fields, where = _read_fields(cfg)
    kinds = arch.get("layer_kinds") or layer_kinds(fields, arch["model_type"], arch["num_hidden_layers"], where)
    state = 0
    if parts is not None and parts.linear is not None:
        state = parts.linear.layer_state_bytes(cfg.tp, int(activation_bytes))
    groups = kv_groups(kinds, state)
    return groups if is_hybrid(groups) else ()
