"""The parts of a 2026 model that a dense transformer lacks: experts, latent attention, linear
attention state, a sparse-attention indexer, and the precision each part's weights are kept in.

Each shape is a frozen dataclass read from the model's published ``config.json`` fields by
:mod:`kvbench.specs.moe_models`; :class:`kvbench.specs.model.ModelSpec` holds one of each (None for
a model without that part), so a dense model's numbers are the ones it always had. Every byte
count here is per GPU where it says so, else for the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass

#: bytes per weight element, scales included, by precision name. ``float8`` is per-tensor fp8 (one
#: scale per matrix, nothing per element); ``fp8`` is the same for the routed experts' precision
#: names (aiconfigurator's ``moe_quant_mode``). ``fp8_block``: DeepSeek's fp8 with one fp32 scale
#: per 128x128 tile; ``nvfp4``: 4-bit e2m1 with one fp8 (e4m3) scale per 16 elements; ``mxfp4``:
#: OCP microscaling, 4-bit with one e8m0 (1-byte) scale per 32; ``int4``: Kimi-K2.5's
#: compressed-tensors packing, 4-bit integers with one bf16 scale per group of 32. The per-tensor
#: global scales of nvfp4 (a few fp32 per matrix) are left out.
WEIGHT_DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8": 1,
    "fp8": 1,
    "fp8_block": 1 + 4 / 128**2,
    "nvfp4": 0.5 + 1 / 16,
    "mxfp4": 0.5 + 1 / 32,
    "int4": 0.5 + 2 / 32,
}
#: what ``model.dtype`` (every weight but the routed experts) may be
MODEL_DTYPES = ("float32", "float16", "bfloat16", "float8", "fp8_block", "nvfp4")
#: what ``model.moe_dtype`` (the routed experts' weights) may be
MOE_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4", "mxfp4", "int4")
#: the bytes of the tensors every quantized checkpoint here keeps in 16 bits (the embeddings, the
#: LM head, the router): DeepSeek's fp8, gpt-oss's mxfp4, Kimi-K2.5's int4 and NVIDIA's nvfp4
#: checkpoints all leave them unquantized; a 32-bit model keeps them in 32 bits
UNQUANTIZED_MIN_BYTES = 2


def unquantized_bytes(dtype_bytes: float) -> float:
    """Bytes per element of the tensors a quantized checkpoint leaves in 16 bits (the embeddings,
    LM head, router, and the activations a conv state is kept in): 2 for any weight precision
    below 16 bits, else the weights' own."""
    return dtype_bytes if dtype_bytes >= UNQUANTIZED_MIN_BYTES else UNQUANTIZED_MIN_BYTES


@dataclass(frozen=True)
class MoEShape:
    """A mixture-of-experts MLP: each token goes to ``experts_per_token`` of ``num_experts`` routed
    experts (plus every shared expert), in every layer but the ``num_dense_layers`` dense ones."""

    #: routed experts per MoE layer (DeepSeek's n_routed_experts, Qwen's num_experts, gpt-oss's
    #: num_local_experts)
    num_experts: int
    #: routed experts each token goes to (top-k: num_experts_per_tok)
    experts_per_token: int
    #: one routed expert's FFN width (moe_intermediate_size; MiniMax-M2's intermediate_size)
    expert_intermediate_size: int
    #: shared experts every token goes to (0 if none)
    num_shared_experts: int = 0
    #: the shared expert(s)' total FFN width (0 if none)
    shared_intermediate_size: int = 0
    #: layers with a dense MLP of the model's intermediate_size instead of experts (DeepSeek's
    #: first_k_dense_replace leading layers; Qwen3-MoE's mlp_only_layers)
    num_dense_layers: int = 0


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values are cached as one compressed
    latent of ``kv_lora_rank`` values plus ``qk_rope_head_dim`` rotary key values per token and
    layer, shared by every head. KV per token per MLA layer = (kv_lora_rank + qk_rope_head_dim) x
    KV bytes, NOT split by tensor parallelism: every TP rank keeps the whole latent, as vLLM and
    SGLang do (attention data parallelism splits it only through which requests a rank holds)."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    #: the queries' compression rank; None: queries projected directly (no q_a/q_b pair)
    q_lora_rank: int | None = None

    @property
    def latent_values_per_token(self) -> int:
        """Values cached per token and layer: kv_lora_rank + qk_rope_head_dim (576 for DeepSeek-V3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        """One head's query/key width: the no-rope part plus the rope part (192 for DeepSeek-V3)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class LinearStateShape:
    """A gated delta net layer (Qwen3-Next / Qwen3.5's linear attention): a fixed state per request
    instead of a KV cache. The shapes are vLLM's mamba state shapes for its GatedDeltaNet layer
    (``MambaStateShapeCalculator.gated_delta_net_state_shape``): a recurrent state of
    num_value_heads x key_head_dim x value_head_dim in the SSM state dtype, and a convolution state
    of (conv_kernel_size - 1) x (2 x num_key_heads x key_head_dim + num_value_heads x value_head_dim)
    in the activations' dtype; both split by tensor parallelism with the heads."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_size: int
    #: bytes per element of the recurrent state (Qwen3.5's mamba_ssm_dtype: float32, 4)
    state_dtype_bytes: int

    def recurrent_state_bytes(self, tp: int) -> int:
        """One layer's recurrent state for one request on one of ``tp`` GPUs."""
        return self.num_value_heads // tp * self.key_head_dim * self.value_head_dim * self.state_dtype_bytes

    def conv_state_bytes(self, tp: int, activation_bytes: int) -> int:
        """One layer's convolution state (the last conv_kernel_size - 1 inputs of the short conv
        over q, k and v) for one request on one of ``tp`` GPUs."""
        conv_dim = 2 * self.num_key_heads // tp * self.key_head_dim + self.num_value_heads // tp * self.value_head_dim
        return (self.conv_kernel_size - 1) * conv_dim * activation_bytes

    def layer_state_bytes(self, tp: int, activation_bytes: int) -> int:
        """One linear layer's whole state for one request on one GPU."""
        return self.recurrent_state_bytes(tp) + self.conv_state_bytes(tp, activation_bytes)


#: values of an fp8 indexer key that share one fp32 scale (vLLM's indexer cache layout)
INDEXER_SCALE_GROUP = 128
#: bytes of one indexer key value (fp8) and of one scale (fp32)
INDEXER_VALUE_BYTES = 1
INDEXER_SCALE_BYTES = 4


@dataclass(frozen=True)
class IndexerShape:
    """DeepSeek-V3.2 / GLM-5 sparse attention: a lightning indexer scores every cached token with
    ``index_n_heads`` small heads and the attention reads only the ``index_topk`` best. It caches
    one key of ``index_head_dim`` values per token and layer, in fp8 with one fp32 scale per 128
    values (vLLM's indexer cache): index_head_dim + index_head_dim // 128 x 4 bytes, whatever the
    KV cache's dtype, NOT split by tensor parallelism (one key head)."""

    index_head_dim: int
    index_n_heads: int
    index_topk: int

    @property
    def layer_bytes_per_token(self) -> int:
        """Indexer cache bytes of one token in one layer (132 for GLM-5's 128-value keys)."""
        scales = self.index_head_dim // INDEXER_SCALE_GROUP
        return self.index_head_dim * INDEXER_VALUE_BYTES + scales * INDEXER_SCALE_BYTES


@dataclass(frozen=True)
class ParamCounts:
    """A model's parameters by part (the whole model, every layer), as its modeling code builds
    them; what each GPU holds of each part depends on the layout (:meth:`weight_bytes_per_gpu`)."""

    #: input embeddings (vocab x hidden)
    embedding: int
    #: the LM head (0 when tied to the embeddings)
    lm_head: int
    #: every layer's attention (projections, their norms and biases, sinks, a sparse indexer, a
    #: linear-attention layer's projections and conv), the per-layer norms and the final norm
    attention: int
    #: the dense MLPs of the dense layers
    dense_mlp: int
    #: the shared experts of every MoE layer
    shared_experts: int
    #: every routed expert of every MoE layer
    routed_experts: int
    #: the routers (gate weights and biases), replicated on every GPU (vLLM's ReplicatedLinear)
    router: int

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.lm_head
            + self.attention
            + self.dense_mlp
            + self.shared_experts
            + self.routed_experts
            + self.router
        )

    def active(self, moe: MoEShape | None) -> int:
        """Parameters one token runs through: all but the routed experts it is not sent to (the
        embeddings counted, as the published "active" sizes count them)."""
        if moe is None:
            return self.total
        per_expert = self.routed_experts // moe.num_experts
        return self.total - self.routed_experts + per_expert * moe.experts_per_token

    def weight_bytes_per_gpu(
        self, dtype_bytes: float, moe_dtype_bytes: float, tp: int, attention_dp: int, scale: float = 1.0
    ) -> int:
        """One GPU's share of the weights under ``tp`` x ``attention_dp`` GPUs: attention, dense
        MLPs, shared experts, embeddings and LM head split by tp (each attention-DP rank holds its
        own copy), routed experts split across all tp x attention_dp GPUs (ep x moe_tp of them),
        routers replicated. Embeddings, LM head and routers in 16 bits where the rest is quantized
        (:func:`unquantized_bytes`). ``scale`` multiplies every part (a typed-in model.num_params).
        A float sum, rounded once."""
        kept = unquantized_bytes(dtype_bytes)
        num_bytes = (
            (self.embedding + self.lm_head) * kept / tp
            + (self.attention + self.dense_mlp + self.shared_experts) * dtype_bytes / tp
            + self.routed_experts * moe_dtype_bytes / (tp * attention_dp)
            + self.router * kept
        )
        return round(num_bytes * scale)
