"""The profiled clock for the layer kinds a dense transformer lacks: experts, latent and sparse
attention, sliding windows, linear attention, and attention data parallelism.

A model with experts, MLA or linear-attention layers (``ModelSpec.moe``, ``.mla``, ``.linear``) is
priced layer kind by layer kind, each from its own measured table:

- **attention** per layer kind: full GQA layers from the dense attention tables (as
  :mod:`kvbench.exec.profiled`); sliding-window layers from the same tables' rows measured at their
  window (``window_size``: the kernel reads at most the window, so past it decode is flat and a
  prefill chunk costs the windowed prefill of its end minus that of its start; gpt-oss's attention
  sinks are not a column of the tables: its window and full layers are priced by the measured
  window/full kernels of its head shape); MLA and sparse (DSA) layers from
  :mod:`kvbench.exec.profiled_mla`; gated-delta-net layers from :mod:`kvbench.exec.profiled_linear`.
- **projections** of attention layers whose table times the kernel alone: QKV and output GEMMs of
  GQA layers, the MLA projections and absorbed BMMs where the framework has no module table, and
  a gated-delta-net layer's in/gate/out projections, all from the GEMM table in ``model.dtype``.
- **MLP**: dense layers (``moe.num_dense_layers``, DeepSeek's first three) as gate-up and down GEMMs;
  a MoE layer as its router GEMM (bf16, hidden -> num_experts), its shared experts as GEMMs split
  by tp, and its routed experts from :mod:`kvbench.exec.profiled_moe` in ``model.moe_dtype``.
- **communication**: under tp, an all-reduce after each attention and each MLP (as dense); under
  attention data parallelism each MoE layer all-gathers every rank's tokens and reduce-scatters
  the result (:mod:`kvbench.exec.profiled_comm`) instead of its all-reduce.

**Attention data parallelism.** The simulated engine is ONE attention-DP rank: requests are split
round-robin between ranks (SGLang's default ``load_balance_method``), and under kvbench's
closed-loop client the ranks are symmetric, so every rank runs a batch like this one. The rank's
attention, projections, dense MLPs and shared experts run at its own batch on its ``tp`` GPUs;
each MoE layer's routed experts see the tokens of all ``attention_dp`` ranks, so they are priced at
``attention_dp`` times the rank's tokens (the MoE table's ``num_tokens`` is the tokens entering
the layer across the MoE group).

Not priced: MTP (speculative) layers, Qwen3.5's attention output gate (its QKV GEMM is priced
without the gate's extra query width), wide-EP DeepEP all-to-all (see profiled_comm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.errors import ConfigError
from kvbench.exec import profiled_comm, profiled_linear, profiled_mla, profiled_moe
from kvbench.specs import profiles
from kvbench.specs.kv_groups import FULL, STATE, WINDOW

#: kvbench's model.dtype -> the GEMM table's gemm_dtype (model.dtype float8 is per-tensor fp8)
GEMM_TABLE_DTYPES = {
    "float32": "bfloat16",
    "float16": "bfloat16",
    "bfloat16": "bfloat16",
    "float8": "fp8",
    "fp8_block": "fp8_block",
    "nvfp4": "nvfp4",
}


def needs_arch(model) -> bool:
    """Whether a model is priced layer kind by layer kind (experts, MLA or linear attention)."""
    return model.moe is not None or model.mla is not None or model.linear is not None


@dataclass(frozen=True)
class LayerCounts:
    """How many layers of each kind the model has (attention kind, and MLP kind)."""

    full: int
    window: dict  #: window tokens -> layers
    linear: int
    mla: int
    dense_mlp: int
    moe_mlp: int


def layer_counts(model) -> LayerCounts:
    full = linear = 0
    window: dict[int, int] = {}
    if model.kv_groups:
        for g in model.kv_groups:
            if g.kind == FULL:
                full += g.num_layers
            elif g.kind == WINDOW:
                window[g.window_tokens] = window.get(g.window_tokens, 0) + g.num_layers
            elif g.kind == STATE:
                linear += g.num_layers
    else:
        full = model.num_layers
    mla = 0
    if model.mla is not None:  # every token-holding layer of an MLA model is an MLA layer
        mla, full = full, 0
    dense = model.num_layers if model.moe is None else model.moe.num_dense_layers
    return LayerCounts(full, window, linear, mla, dense, model.num_layers - dense)


def window_decode_grid(frame, kv_bytes_per_token_layer: float, counter, window_tokens: int):
    """A window layer's decode attention: the rows measured at its window, flat past the longest
    measured length of each batch size once that length reaches the window (the kernel reads W
    tokens however long the sequence), extrapolated and counted as dense rows are otherwise."""
    from kvbench.exec.profiled import DecodeAttentionGrid

    class WindowDecodeGrid(DecodeAttentionGrid):
        def _row(self, i: int, s: np.ndarray) -> np.ndarray:
            xs, lat = self.rows[i]
            if xs[-1] >= window_tokens:
                return np.interp(s, xs, lat)  # np.interp holds the last value past the end
            return super()._row(i, s)

    return WindowDecodeGrid(frame, kv_bytes_per_token_layer, counter)


class WindowPrefillCurve:
    """A window layer's prefill: the chunk costs the windowed prefill of its end minus its start's."""

    def __init__(self, curve) -> None:
        self.curve = curve

    def chunk_s(self, num_new_tokens: int, num_context_tokens: int) -> float:
        start = self.curve.full_s(num_context_tokens) if num_context_tokens else 0.0
        return max(0.0, self.curve.full_s(num_new_tokens + num_context_tokens) - start)


def attention_rows(kernel, system: str, version: str, model, kv_dtype: str, window: int):
    """Decode and prefill rows of the dense attention tables at the model's head shape and window."""
    from kvbench.exec.profiled import _only

    sources = (kernel.sources[system], kernel.prefill_source(system))
    where = f"{profiles.table_root().label} {system}/attention/{kernel.framework}/{version}"
    shape = dict(
        num_heads=model.heads_per_gpu,
        num_key_value_heads=model.kv_heads_per_gpu,
        head_dim=model.head_dim,
        kv_cache_dtype=kv_dtype,
        window_size=window,
    )
    out = []
    for source, table, what in (
        (sources[0], "generation_attention_perf", "decode attention"),
        (sources[1], "context_attention_perf", "prefill attention"),
    ):
        frame = profiles.read_table(system, "attention", kernel.framework, version, table)
        out.append(_only(frame, what, where, kernel_source=source, **shape))
    return out


class ArchTables:
    """Every grid that prices one step of a model with experts, MLA or linear attention."""

    def __init__(self, kernel, system: str, model, gemm_dtype: str, kv_dtype: str, counter, gemm, lm_head_gemm) -> None:
        from kvbench.exec.profiled import PrefillAttentionCurve

        fw = kernel.framework
        self.framework = fw
        self.counts = layer_counts(model)
        self.labels: list[str] = []
        self.gemm, self.lm_head_gemm = gemm, lm_head_gemm
        attn_version = profiles.newest_version(system, "attention", fw, "generation_attention_perf", "decode attention")
        self.window: dict[int, tuple] = {}
        for w in self.counts.window:
            dec, pre = attention_rows(kernel, system, attn_version, model, kv_dtype, w)
            kv_layer = 2 * model.kv_heads_per_gpu * model.head_dim * model.kv_element_bytes
            self.window[w] = (
                window_decode_grid(dec, kv_layer, counter, w),
                WindowPrefillCurve(PrefillAttentionCurve(pre, counter)),
            )
            self.labels.append(f"window {w}")
        self.mla = self.mla_bmm = None
        self.mla_gemms: tuple[list, list] = ([], [])
        if self.counts.mla:
            self._load_mla(system, fw, model, gemm_dtype, kv_dtype, counter)
        self.gdn = None
        if self.counts.linear:
            dec, pre, label = profiled_linear.select_gdn(
                system, fw, hidden_size=model.hidden_size, linear=model.linear, tp=model.tp
            )
            self.gdn = profiled_linear.GDNLayer(dec, pre, counter)
            self.labels.append(label)
        self.moe = None
        if model.moe is not None and self.counts.moe_mlp:
            rows, label = profiled_moe.select_moe(
                system,
                fw,
                hidden_size=model.hidden_size,
                inter_size=model.moe.expert_intermediate_size,
                topk=model.moe.experts_per_token,
                num_experts=model.moe.num_experts,
                moe_tp=model.moe_tp,
                moe_ep=model.ep,
                moe_dtype=model.moe_dtype,
                distribution=profiled_moe.moe_distribution(model.mla is not None),
            )
            self.moe = profiled_moe.MoEGrid(rows, counter)
            self.labels.append(label)
        self.gather = self.scatter = None
        if model.attention_dp > 1 and self.moe is not None:
            gather, label = profiled_comm.select_nccl(system, "all_gather", model.num_gpus)
            scatter, _ = profiled_comm.select_nccl(system, "reduce_scatter", model.num_gpus)
            self.gather = profiled_comm.CollectiveCurve(gather, counter)
            self.scatter = profiled_comm.CollectiveCurve(scatter, counter)
            self.labels.append(label)

    def _load_mla(self, system: str, fw: str, model, gemm_dtype: str, kv_dtype: str, counter) -> None:
        from kvbench.exec.profiled import DecodeAttentionGrid, PrefillAttentionCurve

        heads = model.heads_per_gpu
        rows = None
        if model.indexer is not None:
            rows = profiled_mla.select_module(
                system,
                fw,
                "sparse_attention",
                ("dsa_generation_module_perf", "dsa_context_module_perf"),
                heads_per_gpu=heads,
                gemm_type=gemm_dtype,
                kv_dtype=kv_dtype,
                architecture=profiled_mla.dsa_architecture(model.mla, model.indexer, model.hidden_size),
            )
            if rows is None:
                raise ConfigError(
                    f"{profiles.table_root().label} has no sparse-attention module table of {fw} on {system}"
                )
        elif profiled_mla.module_matches(model.mla) and model.hidden_size == profiled_mla.MODULE_SHAPE["hidden_size"]:
            rows = profiled_mla.select_module(
                system,
                fw,
                "mla",
                ("mla_generation_module_perf", "mla_context_module_perf"),
                heads_per_gpu=heads,
                gemm_type=gemm_dtype,
                kv_dtype=kv_dtype,
            )
        if rows is None:
            rows = profiled_mla.select_kernel_rows(system, fw, heads_per_gpu=heads, kv_dtype=kv_dtype)
            bmm_dtype = "bfloat16" if gemm_dtype == "bfloat16" else "fp8"
            pre, post, label = profiled_mla.select_bmm(system, fw, heads_per_gpu=heads, bmm_dtype=bmm_dtype)
            self.mla_bmm = (profiled_moe.TokenCurve(pre, counter), profiled_moe.TokenCurve(post, counter))
            self.mla_gemms = profiled_mla.granular_gemm_shapes(model.mla, model.num_heads, model.hidden_size, model.tp)
            self.labels.append(label)
        latent_bytes = model.kv_layer_bytes_per_token
        self.mla = (
            DecodeAttentionGrid(rows.decode, latent_bytes, counter),
            PrefillAttentionCurve(rows.prefill, counter),
        )
        self.labels.append(rows.label)


class ArchPricer:
    """One attention-DP rank's step, priced layer kind by layer kind (module docstring)."""

    def __init__(self, model, tables, arch: ArchTables) -> None:
        self.model, self.tables, self.arch = model, tables, arch
        m, c = model, arch.counts
        tp, d, h = m.tp, m.head_dim, m.hidden_size
        gqa_layers = c.full + sum(c.window.values())
        shapes: list[tuple[int, int, int]] = []  # (layers, n, k) of the token-bound GEMMs
        if gqa_layers:
            shapes += [
                (gqa_layers, (m.heads_per_gpu + 2 * m.kv_heads_per_gpu) * d, h),
                (gqa_layers, h, m.heads_per_gpu * d),
            ]
        shapes += [(c.mla, n, k) for n, k in arch.mla_gemms[0]]
        if c.linear:
            lin = m.linear
            in_proj = (2 * lin.num_key_heads * lin.key_head_dim + 2 * lin.num_value_heads * lin.value_head_dim) // tp
            shapes += [(c.linear, in_proj, h), (c.linear, 2 * lin.num_value_heads // tp, h)]
            shapes += [(c.linear, h, lin.num_value_heads * lin.value_head_dim // tp)]
        if c.dense_mlp:
            ffn = m.intermediate_size // tp
            shapes += [(c.dense_mlp, (2 if m.gated_mlp else 1) * ffn, h), (c.dense_mlp, h, ffn)]
        self.gemm_shapes = [s for s in shapes if s[0]]
        self.shared_shapes: list[tuple[int, int, int]] = []  # the shared experts' gate-up and down
        if m.moe is not None and m.moe.shared_intermediate_size and c.moe_mlp:
            shared = m.moe.shared_intermediate_size // tp
            self.shared_shapes = [(c.moe_mlp, 2 * shared, h), (c.moe_mlp, h, shared)]
        #: TRT-LLM runs a MoE layer's shared experts on an auxiliary CUDA stream beside its routed
        #: experts in CUDA-graph (decode-only) steps (``maybe_execute_in_parallel`` in its DeepSeek,
        #: Qwen3-MoE and Llama-4 MoE modules), so such a step pays the longer of the two; a step with
        #: a prefill chunk, and the other engines, pay both in turn
        self.overlap_shared_experts = arch.framework == "trtllm"
        # the prefill-only kv up-projection of a kernel-table MLA layer (decode absorbs it in a BMM)
        decode_mla, prefill_mla = arch.mla_gemms
        self.prefill_only_gemms = [(c.mla, n, k) for n, k in prefill_mla if (n, k) not in decode_mla and c.mla]
        self._cache: dict[tuple[int, bool], float] = {}

    def per_token_s(self, m_tokens: int, decode_only: bool = False) -> float:
        """Everything the step's tokens cost whatever their context: GEMMs, BMMs, routed experts,
        collectives and elementwise kernels, for the rank's ``m_tokens`` (cached by count), in a
        step of decodes only or not (TRT-LLM overlaps shared and routed experts in the former)."""
        key = (m_tokens, decode_only)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        m, t, a, c = self.model, self.tables, self.arch, self.arch.counts
        total = sum(layers * t.gemm.latency_s(m_tokens, n, k) for layers, n, k in self.gemm_shapes)
        shared_s = sum(layers * t.gemm.latency_s(m_tokens, n, k) for layers, n, k in self.shared_shapes)
        if a.mla_bmm is not None:
            total += c.mla * sum(curve.latency_s(m_tokens) for curve in a.mla_bmm)
        act_bytes = m_tokens * m.hidden_size * 2
        act_elements = m_tokens * m.hidden_size  # a collective's message, in the comm tables' unit
        routed_s = 0.0
        if a.moe is not None:
            router_s = t.lm_head_gemm.latency_s(m_tokens, m.moe.num_experts, m.hidden_size)
            total += c.moe_mlp * router_s
            routed_s = c.moe_mlp * a.moe.latency_s(m_tokens * m.attention_dp)
        overlap = decode_only and self.overlap_shared_experts
        total += max(shared_s, routed_s) if overlap else shared_s + routed_s
        if t.allreduce is not None:  # after every attention, after every MLP not gathered below
            mlp_allreduces = c.dense_mlp + (c.moe_mlp if a.gather is None else 0)
            total += (m.num_layers + mlp_allreduces) * t.allreduce.latency_s(act_elements)
        if a.gather is not None:
            all_elements = act_elements * m.attention_dp
            total += c.moe_mlp * (a.gather.latency_s(all_elements) + a.scatter.latency_s(all_elements))
        # two residual-add RMSNorms per layer; SiLU-and-multiply of the dense and shared MLPs
        ffn_values = c.dense_mlp * m.intermediate_size
        if m.moe is not None:
            ffn_values += c.moe_mlp * m.moe.shared_intermediate_size
        mem_bytes = m.num_layers * 2 * 4 * act_bytes + 3 * m_tokens * ffn_values // m.tp * 2
        total += mem_bytes / t.mem_bytes_per_s + 3 * m.num_layers * t.mem_op_latency_s
        self._cache[key] = total
        return total

    def prefill_tokens_s(self, prefill_tokens: int) -> float:
        """GEMMs only a prefill runs (a kernel-table MLA layer's kv up-projection)."""
        return sum(
            layers * self.tables.gemm.latency_s(prefill_tokens, n, k) for layers, n, k in self.prefill_only_gemms
        )

    def decode_attention_s(self, batch: int, mean_context_tokens: np.ndarray) -> np.ndarray:
        """Every layer's decode attention (or state update) for ``batch`` sequences."""
        t, a, c = self.tables, self.arch, self.arch.counts
        s = np.asarray(mean_context_tokens, dtype=np.float64)
        total = np.zeros_like(s)
        if c.full:
            total = total + c.full * t.decode.latency_s(batch, s)
        for w, layers in c.window.items():
            total = total + layers * a.window[w][0].latency_s(batch, s)
        if c.mla:
            total = total + c.mla * a.mla[0].latency_s(batch, s)
        if c.linear:
            total = total + c.linear * a.gdn.decode_s(batch)
        return total

    def chunk_attention_s(self, num_new_tokens: int, num_context_tokens: int) -> float:
        t, a, c = self.tables, self.arch, self.arch.counts
        total = 0.0
        if c.full:
            total += c.full * t.prefill.chunk_s(num_new_tokens, num_context_tokens)
        for w, layers in c.window.items():
            total += layers * a.window[w][1].chunk_s(num_new_tokens, num_context_tokens)
        if c.mla:
            total += c.mla * a.mla[1].chunk_s(num_new_tokens, num_context_tokens)
        if c.linear:
            total += c.linear * a.gdn.chunk_s(num_new_tokens)
        return total
