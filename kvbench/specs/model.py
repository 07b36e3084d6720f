"""ModelSpec: what a transformer costs in KV bytes, weight bytes and FLOPs, from its transformers config.

``conf/model/<name>.yaml`` carries the config fields of a Hugging Face ``config.json`` (or a path to
a local one); :func:`model_spec` builds the transformers config object from them, so field names and
defaults (``num_key_value_heads``, ``head_dim``, ``tie_word_embeddings``...) mean exactly what they
mean to transformers. The parameter count is computed from the architecture, not typed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.errors import ConfigError, require
from kvbench.specs.names import require_name

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}
#: families whose parameters are counted with the gated-MLP (LLaMA) formula
LLAMA_LIKE = ("llama", "mistral")
#: the architecture fields ModelSpec and count_params read (each where the model type has it): all
#: must be positive integers, or a zero-layer model divides by zero and a negative width prints
#: negative memory
ARCHITECTURE_FIELDS = (
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
    "intermediate_size", "ffn_dim", "word_embed_proj_dim", "vocab_size", "max_position_embeddings",
)  # fmt: skip
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
    #: KV-cache and weight dtype (float32, float16, bfloat16, float8)
    dtype: str = "float16"
    #: override the parameter count computed from the architecture
    num_params: int | None = None

    def validate(self) -> None:
        require_name("model.name", self.name)
        require(self.dtype in DTYPE_BYTES, "model.dtype", self.dtype, f"choose one of {', '.join(DTYPE_BYTES)}")
        require(self.num_params is None or self.num_params > 0, "model.num_params", self.num_params, "use a positive count or null")
        require(bool(self.config_path) or bool(self.hf_config), "model.hf_config", self.hf_config, "give the config.json fields or model.config_path")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    num_params: int
    #: the longest sequence the model takes (its ``max_position_embeddings``)
    max_positions: int = 0

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer: 2 * L * n_kv * d_head * bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def prefill_flops(self, num_tokens: int) -> float:
        """FLOPs to prefill ``num_tokens`` tokens: 2*N*S + 4*L*H*d*S^2 (the lecture's formula)."""
        return 2.0 * self.num_params * num_tokens + 4.0 * self.num_layers * self.num_heads * self.head_dim * num_tokens**2

    def decode_flops_per_token(self, context_tokens: int) -> float:
        """FLOPs to decode one token at ``context_tokens`` of context: 2*N + 4*L*H*d*S."""
        return 2.0 * self.num_params + 4.0 * self.num_layers * self.num_heads * self.head_dim * context_tokens


def _check_architecture(values: dict[str, Any], where: str) -> None:
    """Every architecture field present (not null) is a positive integer (bool excluded), and the
    positions are within MAX_POSITION_EMBEDDINGS. ``where`` says where the value came from."""
    for name in ARCHITECTURE_FIELDS:
        value = values.get(name)
        if value is None:
            continue  # absent for this model type, or left to transformers' default
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        require(ok, f"model.hf_config.{name}", value, f"use a positive integer{where}")
    positions = values.get("max_position_embeddings")
    if positions is not None:
        require(positions <= MAX_POSITION_EMBEDDINGS, "model.hf_config.max_position_embeddings", positions,
                f"use at most 2**24 = {MAX_POSITION_EMBEDDINGS:,} tokens (above any released model){where}")  # fmt: skip


def _load_hf_config(cfg: ModelConfig):
    # transformers is imported here, not at module level: `kvbench --help` should not pay for it
    from transformers import CONFIG_MAPPING, AutoConfig

    where = ""
    if cfg.config_path:
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
            raise ConfigError(f"model.config_path={cfg.config_path!r} holds a JSON {type(fields).__name__}, not an "
                              "object of config.json fields")  # fmt: skip
        where = f" (in {path})"
    else:
        fields = dict(cfg.hf_config)
    model_type = fields.pop("model_type", None)
    if not model_type:
        raise ConfigError(f"model.hf_config.model_type is missing{where}: give the transformers model_type, e.g. llama")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ConfigError(f"model.hf_config.model_type={model_type!r} is invalid{where}: not a transformers model "
                          f"type; use e.g. {', '.join(LLAMA_LIKE + ('opt',))}")  # fmt: skip
    _check_architecture(fields, where)
    try:
        hf = AutoConfig.for_model(model_type, **fields)
    except (TypeError, ValueError, *_strict_dataclass_errors()) as exc:
        # transformers checks field types and consistency (hidden size a multiple of the heads...);
        # its message names the field, on the line of the innermost cause
        cause = exc.__cause__ or exc
        raise ConfigError(f"model.hf_config{where} is invalid for transformers' {model_type!r} config: "
                          f"{str(cause).strip().splitlines()[0]}") from None  # fmt: skip
    # the values the spec reads, defaults included (head_dim is derived from hidden_size)
    _check_architecture({name: getattr(hf, name, None) for name in ARCHITECTURE_FIELDS}, where)
    return hf


def _strict_dataclass_errors() -> tuple[type[Exception], ...]:
    """huggingface_hub's validation errors, which are not TypeError/ValueError (absent in old versions)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def count_params(hf) -> int:
    """Parameters of a decoder-only model from its config (embeddings and LM head included)."""
    h, n_layers, vocab = hf.hidden_size, hf.num_hidden_layers, hf.vocab_size
    if hf.model_type in LLAMA_LIKE:
        n_heads = hf.num_attention_heads
        n_kv = getattr(hf, "num_key_value_heads", None) or n_heads
        d = getattr(hf, "head_dim", None) or h // n_heads
        bias = 1 if getattr(hf, "attention_bias", False) else 0
        attn = h * n_heads * d + 2 * h * n_kv * d + n_heads * d * h + bias * (n_heads * d + 2 * n_kv * d + h)
        mlp = 3 * h * hf.intermediate_size + (3 if getattr(hf, "mlp_bias", False) else 0) * hf.intermediate_size
        per_layer = attn + mlp + 2 * h  # two RMSNorm weights
        embed = vocab * h
        head = 0 if hf.tie_word_embeddings else vocab * h
        return embed + head + n_layers * per_layer + h  # final norm
    if hf.model_type == "opt":
        ffn, proj = hf.ffn_dim, hf.word_embed_proj_dim
        per_layer = 4 * (h * h + h) + (h * ffn + ffn) + (ffn * h + h) + 2 * 2 * h  # qkvo, fc1, fc2, two LayerNorms
        embed = vocab * proj + (hf.max_position_embeddings + 2) * h  # OPT offsets positions by 2
        projections = 0 if proj == h else 2 * h * proj
        final_norm = 2 * h if hf.do_layer_norm_before and not getattr(hf, "_remove_final_layer_norm", False) else 0
        head = 0 if hf.tie_word_embeddings else vocab * proj
        return embed + projections + n_layers * per_layer + final_norm + head
    raise ConfigError(
        f"model.hf_config.model_type={hf.model_type!r} has no parameter-count formula; "
        f"use one of {', '.join(LLAMA_LIKE + ('opt',))} or set model.num_params"
    )


def model_spec(cfg: ModelConfig) -> ModelSpec:
    """Build the ModelSpec for a validated ModelConfig."""
    hf = _load_hf_config(cfg)
    n_heads = hf.num_attention_heads
    n_kv = getattr(hf, "num_key_value_heads", None) or n_heads
    require(n_heads % n_kv == 0, "model.hf_config.num_key_value_heads", n_kv, f"must divide num_attention_heads={n_heads}")
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // n_heads
    require(head_dim >= 1, "model.hf_config.hidden_size", hf.hidden_size, f"must be at least num_attention_heads={n_heads}")
    return ModelSpec(
        name=cfg.name,
        num_layers=hf.num_hidden_layers,
        num_heads=n_heads,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        dtype_bytes=DTYPE_BYTES[cfg.dtype],
        num_params=cfg.num_params or count_params(hf),
        max_positions=int(hf.max_position_embeddings),
    )
