"""The model of a real run: a transformers ``LlamaForCausalLM`` built from its config with weights
seeded from the run's seed (nothing downloaded), and kvbench's own forward over its modules, so
that K/V go into kvbench's cache (:mod:`.cache`) instead of transformers' own."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kvbench.errors import ConfigError
from kvbench.kernels.layout import DTYPES

#: transformers config.json fields kvbench's model config may carry that are not LlamaConfig arguments
_NOT_CONFIG = {"model_type"}


def build_model(hf_config: dict, dtype_name: str, seed: int, device: str = "cpu"):
    """``LlamaForCausalLM`` with weights drawn under ``torch.manual_seed(seed)``, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if hf_config.get("model_type") != "llama":
        raise ConfigError(
            f"mode=real runs Llama models only, got model.hf_config.model_type={hf_config.get('model_type')!r}"
        )
    if dtype_name not in DTYPES:
        raise ConfigError(f"model.dtype={dtype_name!r} is invalid for mode=real: choose one of {', '.join(DTYPES)}")
    config = LlamaConfig(**{k: v for k, v in hf_config.items() if k not in _NOT_CONFIG})
    # the reference forward and generate() must agree with ours: plain eager attention
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model.to(device=device, dtype=DTYPES[dtype_name]).eval()


def has_weights(folder) -> bool:
    """Whether a model folder holds weights (safetensors, or PyTorch pickles, which are refused)."""
    from pathlib import Path

    folder = Path(folder)
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))


def load_model(folder, dtype_name: str, device: str = "cpu"):
    """``LlamaForCausalLM`` with the real weights of a local folder (``save_pretrained``'s layout:
    config.json and safetensors), never downloading anything, in eval mode.

    Only safetensors are read: a PyTorch ``.bin`` is a pickle, which can run code when loaded,
    and whether transformers unpickles it safely depends on its and torch's versions. A folder with
    only ``.bin`` files is refused in one line; damaged weights are one line too."""
    from pathlib import Path

    from transformers import LlamaForCausalLM

    if dtype_name not in DTYPES:
        raise ConfigError(f"model.dtype={dtype_name!r} is invalid for mode=real: choose one of {', '.join(DTYPES)}")
    if not any(Path(folder).glob("*.safetensors")):
        raise ConfigError(
            f"model.config_path={str(folder)!r} holds only pickled PyTorch weights (pytorch_model*.bin), "
            "which kvbench does not load (a pickle can run code): save the model with safetensors, "
            "e.g. model.save_pretrained(folder, safe_serialization=True)"
        )
    try:
        model = LlamaForCausalLM.from_pretrained(
            str(folder),
            torch_dtype=DTYPES[dtype_name],
            local_files_only=True,
            attn_implementation="eager",
            use_safetensors=True,
        )
    except Exception as exc:  # noqa: BLE001 - safetensors', torch's and transformers' errors share no base
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"model.config_path={str(folder)!r}: its weights cannot be loaded ({type(exc).__name__}: "
            f"{detail[:200]}); re-save them with save_pretrained"
        ) from None
    if model.config.model_type != "llama":
        raise ConfigError(f"mode=real runs Llama models only, got {model.config.model_type!r} in {folder}")
    return model.to(device=device).eval()


class LlamaRunner:
    """kvbench's forward over a ``LlamaForCausalLM``'s weights, reading and writing a :class:`KVCache`."""

    def __init__(self, model, cache, kernel) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self.model = model
        self.cache = cache
        self.kernel = kernel
        self._rope = apply_rotary_pos_emb
        cfg = model.config
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.device = next(model.parameters()).device

    def _qkv(self, attn, x, position_ids):
        """q ``[b, H, n, D]``, k and v ``[b, H_kv, n, D]`` with RoPE applied (the model's own rotary embedding)."""
        b, n, _ = x.shape
        q = attn.q_proj(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.model.model.rotary_emb(v, position_ids)
        q, k = self._rope(q, k, cos, sin)
        return q, k, v

    @torch.inference_mode()
    def prefill(self, token_ids: list[int], context_tokens: int, table: list[int]) -> torch.Tensor:
        """Compute ``token_ids`` at positions ``context_tokens..`` of one sequence, over its first
        ``context_tokens`` positions read back from the cache (chunked prefill); returns the last
        position's logits ``[vocab]``."""
        n = len(token_ids)
        total = context_tokens + n
        positions = torch.arange(context_tokens, total, device=self.device)
        ids = torch.tensor(token_ids, device=self.device)[None]
        inner = self.model.model
        h = inner.embed_tokens(ids)
        # query i (position context + i) sees key j iff j <= context + i
        mask = torch.arange(total, device=self.device)[None, :] <= positions[:, None]
        groups = self.num_heads // self.num_kv_heads
        for layer_index, layer in enumerate(inner.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, layer.input_layernorm(h), positions[None])
            self.cache.write(
                layer_index,
                table,
                context_tokens,
                k[0].transpose(0, 1),
                v[0].transpose(0, 1),
            )
            keys, values = self.cache.read(layer_index, table, total)  # [total, H_kv, D]
            keys = keys.transpose(0, 1).repeat_interleave(groups, dim=0)[None]
            values = values.transpose(0, 1).repeat_interleave(groups, dim=0)[None]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
            h = h + attn.o_proj(out.transpose(1, 2).reshape(1, n, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(inner.norm(h[:, -1]))[0]

    @torch.inference_mode()
    def decode(self, token_ids: list[int], context_tokens: list[int], tables: list[list[int]]) -> torch.Tensor:
        """One token per sequence at position ``context_tokens[b]``, attention through the kernel
        plugin over the paged cache; returns logits ``[B, vocab]``."""
        batch = len(token_ids)
        positions = torch.tensor(context_tokens, device=self.device)[:, None]
        ids = torch.tensor(token_ids, device=self.device)[:, None]
        seq_lens = torch.tensor([c + 1 for c in context_tokens], dtype=torch.int32, device=self.device)
        width = max(map(len, tables))
        # padding entries point at block 0; the kernel contract forbids reading through them
        block_tables = torch.tensor(
            [t + [0] * (width - len(t)) for t in tables],
            dtype=torch.int32,
            device=self.device,
        )
        inner = self.model.model
        h = inner.embed_tokens(ids)
        for layer_index, layer in enumerate(inner.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, layer.input_layernorm(h), positions)
            for b in range(batch):
                self.cache.write(
                    layer_index,
                    tables[b],
                    context_tokens[b],
                    k[b].transpose(0, 1),
                    v[b].transpose(0, 1),
                )
            key_cache, value_cache = self.cache.layer(layer_index)
            out = self.kernel.decode(q[:, :, 0], key_cache, value_cache, block_tables, seq_lens, self.scale)
            h = h + attn.o_proj(out.reshape(batch, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(inner.norm(h[:, -1]))
