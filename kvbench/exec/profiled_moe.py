"""Mixture-of-experts layers priced from measured tables (``moe/<framework>/<version>/moe_perf``).

The table times one MoE layer's routed experts (the fused grouped GEMMs with their gating
activation, as the framework's MoE kernel runs them) on one GPU, by ``num_tokens``: the tokens
that enter the MoE layer across the whole MoE group, before routing. Each row fixes the model's
shape (``hidden_size``, the expert's full ``inter_size``, ``topk``, ``num_experts``), the layout
(``moe_tp_size`` splits each expert's FFN, ``moe_ep_size`` splits the experts) and how the router
spreads tokens over experts (``distribution``: ``balanced`` or ``power_law_<alpha>``, the token
imbalance the kernel was measured under: the busiest GPU sets the layer's time).

kvbench prices with the distribution aiconfigurator's own estimator uses by default
(``workload_distribution = "power_law"`` with the model family's alpha): ``power_law_1.01`` for the
DeepSeek family (MLA models: DeepSeek-V3/R1, Kimi-K2.5, GLM-5) and ``power_law_1.2`` for every
other MoE (Qwen3, Qwen3.5, gpt-oss, MiniMax). Between measured token counts the latency is linear;
beyond the largest it grows in proportion to the tokens (counted as an extrapolation); below the
smallest (1 token) it is the smallest's.

Under attention data parallelism the MoE layer sees the tokens of every attention-DP rank (the
framework gathers them before the experts), so callers pass ``tokens_per_rank * attention_dp``.

TRT-LLM's low-latency NVFP4 MoE. Where the table also measured TRT-LLM's min-latency kernel
(``moe_torch_flow_min_latency``, NVFP4 on Blackwell) for the same shape, layout and distribution,
a layer of at most :data:`MIN_LATENCY_MAX_TOKENS` tokens is priced from it and a larger one from
the default kernel: the framework switches to that path for small batches, and aiconfigurator's
estimator prices TRT-LLM's NVFP4 MoE the same way (its per-op breakdown of DeepSeek-R1 on B200,
TP8: the min-latency rows up to 128 tokens, the cutlass rows from 129). At decode this is 2.5-3.5x
less than the cutlass rows (0.060 against 0.154 ms per layer at 16 tokens).

Precision (``model.moe_dtype``) maps onto the table's ``moe_dtype``: bfloat16, fp8, fp8_block and
nvfp4 by name, mxfp4 -> ``w4a16_mxfp4`` (MXFP4 weights, bf16 activations, as gpt-oss is served),
int4 -> ``int4_wo`` (weight-only int4, Kimi-K2.5); on Blackwell TRT-LLM runs mxfp4 experts on
MXFP8 activations (``w4a8_mxfp4_mxfp8``, :data:`BLACKWELL_MOE_TABLE_DTYPES`). A precision the tables never measured for the
GPU and framework is one line naming what was measured.
"""

from __future__ import annotations

import numpy as np

from kvbench.errors import ConfigError
from kvbench.specs import profiles

#: kvbench's routed-expert precision (``model.moe_dtype``) -> the MoE table's ``moe_dtype``
MOE_TABLE_DTYPES = {
    "bfloat16": "bfloat16",
    "fp8": "fp8",
    "fp8_block": "fp8_block",
    "nvfp4": "nvfp4",
    "mxfp4": "w4a16_mxfp4",
    "int4": "int4_wo",
}
#: where a framework runs a precision's experts on other activations by default: TRT-LLM's gpt-oss
#: deployment guide (1.2.0rc2.post2 and later) names its TRTLLM MoE backend, the default on
#: B200/GB200/B300/GB300, with MXFP8 activations on the MXFP4 experts (Hopper's TRITON backend keeps
#: bf16 activations, w4a16_mxfp4). At 32 tokens on B200 w4a8 takes 0.136 ms a layer, w4a16 0.567.
BLACKWELL_MOE_TABLE_DTYPES = {"trtllm": {"mxfp4": "w4a8_mxfp4_mxfp8"}}
BLACKWELL_SYSTEMS = ("b200_sxm", "b300_sxm", "gb200", "gb300")
#: TRT-LLM's low-latency MoE kernel, and the largest token count it serves (module docstring)
MIN_LATENCY_SOURCE = "moe_torch_flow_min_latency"
MIN_LATENCY_MAX_TOKENS = 128
#: aiconfigurator's default token imbalance per model family (its DeepSeek-family models use
#: alpha 1.01, its generic MoE model 1.2)
MLA_FAMILY_DISTRIBUTION = "power_law_1.01"
DEFAULT_DISTRIBUTION = "power_law_1.2"


def moe_distribution(is_mla_family: bool) -> str:
    return MLA_FAMILY_DISTRIBUTION if is_mla_family else DEFAULT_DISTRIBUTION


def moe_table_dtype(moe_dtype: str) -> str:
    found = MOE_TABLE_DTYPES.get(moe_dtype)
    if found is None:
        raise ConfigError(
            f"model.moe_dtype={moe_dtype!r} is not a routed-expert precision: one of {', '.join(MOE_TABLE_DTYPES)}"
        )
    return found


class TokenCurve:
    """Latency in seconds by a token count, for one measured shape: linear between measured
    counts, the smallest's below them, in proportion to the tokens beyond the largest (counted)."""

    def __init__(self, frame, counter, x_column: str = "num_tokens", scale_s: float = 1e-3) -> None:
        row = frame.groupby(x_column)["latency"].median().sort_index()
        self.x = row.index.to_numpy(np.float64)
        self.lat_s = row.to_numpy(np.float64) * scale_s
        self.counter = counter

    def latency_s(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        if tokens > self.x[-1]:
            self.counter.count += 1
            return float(self.lat_s[-1] * tokens / self.x[-1])
        return float(np.interp(tokens, self.x, self.lat_s))


#: ``attrs`` key of a ``select_moe`` frame that stands in for a layout the table never measured
STAND_IN = "moe_layout_stand_in"


class MoEGrid(TokenCurve):
    """One MoE layer's routed experts on one GPU, in seconds, by the tokens entering the layer
    across the MoE group (every attention-DP rank's tokens). Rows of TRT-LLM's min-latency twin
    beside the default kernel's price the layers of at most MIN_LATENCY_MAX_TOKENS tokens. Rows
    that stand in for an unmeasured layout (:func:`select_moe`) count every lookup as an
    extrapolation."""

    def __init__(self, frame, counter, x_column: str = "num_tokens", scale_s: float = 1e-3) -> None:
        self.stand_in = bool(frame.attrs.get(STAND_IN))
        twin = frame["kernel_source"] == MIN_LATENCY_SOURCE
        self.low_latency = None
        if twin.any() and not twin.all():
            self.low_latency = TokenCurve(frame[twin], counter, x_column, scale_s)
            frame = frame[~twin]
        super().__init__(frame, counter, x_column, scale_s)

    def latency_s(self, tokens: float) -> float:
        if self.stand_in and tokens > 0:
            self.counter.count += 1
        if self.low_latency is not None and 0 < tokens <= MIN_LATENCY_MAX_TOKENS:
            return self.low_latency.latency_s(tokens)
        return super().latency_s(tokens)


#: the MoE kernel each framework runs by default, in order of preference, where a table measured
#: several for the same shape and dtype (any other measured kernel is taken when these are absent)
PREFERRED_MOE_KERNELS = {
    "sglang": ("sglang_fused_moe_triton", "sglang_flashinfer_trtllm_moe", "sglang_marlin_moe"),
    "vllm": (
        "vllm_fp8moe_triton_tritonexperts",
        "vllm_unquantizedfusedmoe_triton_tritonexperts",
        "vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic",
        "vllm_fused_moe",
    ),
    "trtllm": ("moe_torch_flow_cutlass", "deepgemm", "moe_torch_flow"),
}


def _pick_kernel(frame, framework: str) -> str:
    present = frame["kernel_source"].value_counts()
    for source in PREFERRED_MOE_KERNELS.get(framework, ()):
        if source in present.index:
            return source
    # otherwise the kernel measured over the most points, then by name (deterministic);
    # TRT-LLM's min-latency twin is never the default kernel (MoEGrid prices small layers from it)
    ranked = sorted(present.items(), key=lambda kv: (kv[0].endswith("_min_latency"), -kv[1], kv[0]))
    return ranked[0][0]


def select_moe(
    system: str,
    framework: str,
    *,
    hidden_size: int,
    inter_size: int,
    topk: int,
    num_experts: int,
    moe_tp: int,
    moe_ep: int,
    moe_dtype: str,
    distribution: str,
):
    """The rows of the newest ``moe_perf`` version that measured this MoE shape, layout, table
    dtype and distribution, with its label; a one-line ConfigError naming what was measured.

    A layout (moe_tp, moe_ep) the tables never measured for the shape is priced by a stand-in with
    the same work per GPU, named in the label and counted at every lookup (:class:`MoEGrid`):

    1. the same per-GPU GEMMs measured as another shape: each expert at ``inter_size / moe_tp``
       with ``moe_tp=1`` and the same ``moe_ep`` (one GPU then runs exactly what a moe_tp slice
       runs); else
    2. the measured layout of the same shape whose per-GPU work (``inter_size x num_experts /
       (moe_tp x moe_ep)`` weights, and the FLOPs of its tokens) is nearest, same ``moe_ep`` first
       (expert parallelism also changes the token imbalance between GPUs, tensor parallelism does
       not), its latency scaled by the ratio of per-GPU work ``moe_tp' x moe_ep' / (moe_tp x
       moe_ep)``: both the weight bytes a decode step reads and the FLOPs of a prefill divide by it.

    aiconfigurator's own estimator has no such stand-in: its MoE lookup is keyed by the exact
    layout and raises ``PerfDataNotAvailableError`` (gpt-oss-120b on TRT-LLM at moe_tp 2-8, where
    the tables measured moe_tp 1 only)."""
    root = profiles.table_root()
    versions = profiles.versions(system, "moe", framework, "moe_perf")
    if not versions:
        hint = f" ({profiles.INSTALL_HINT} for the full tables)" if root.excerpt else ""
        raise ConfigError(f"{root.label} has no MoE table measured with {framework} on {system}{hint}")
    table_dtype = moe_table_dtype(moe_dtype)
    if system in BLACKWELL_SYSTEMS:
        table_dtype = BLACKWELL_MOE_TABLE_DTYPES.get(framework, {}).get(moe_dtype, table_dtype)
    shape = dict(hidden_size=hidden_size, inter_size=inter_size, topk=topk, num_experts=num_experts)
    layout = dict(moe_tp_size=moe_tp, moe_ep_size=moe_ep, distribution=distribution)
    dtypes_measured: set[str] = set()
    layouts_measured: set[tuple] = set()
    frames = {v: profiles.read_table(system, "moe", framework, v, "moe_perf") for v in reversed(versions)}
    for version, frame in frames.items():
        dtypes_measured |= set(frame["moe_dtype"].unique())
        same_shape = _match(frame, **shape, moe_dtype=table_dtype)
        layouts_measured |= {
            (int(t), int(e)) for t, e in same_shape[["moe_tp_size", "moe_ep_size"]].drop_duplicates().to_numpy()
        }
        rows = _match(same_shape, **layout)
        if not rows.empty:
            return _kernel_rows(rows, framework, f"moe {{source}} {table_dtype} {distribution} {version}")
    where = f"{root.label} {system}/moe/{framework}"
    hint = f" ({profiles.INSTALL_HINT} for the full tables)" if root.excerpt else ""
    if table_dtype not in dtypes_measured:
        raise ConfigError(
            f"{where} never measured MoE experts in moe_dtype={table_dtype} (model.moe_dtype={moe_dtype}): "
            f"measured {', '.join(sorted(dtypes_measured))}{hint}"
        )
    if moe_tp > 1 and inter_size % moe_tp == 0:  # 1. the same per-GPU expert GEMMs, measured at moe_tp=1
        sliced = dict(shape, inter_size=inter_size // moe_tp)
        for version, frame in frames.items():
            rows = _match(frame, **sliced, moe_dtype=table_dtype, moe_tp_size=1, moe_ep_size=moe_ep)
            rows = _match(rows, distribution=distribution)
            if not rows.empty:
                text = f"inter_size={inter_size // moe_tp} at layout 1x{moe_ep}"
                return _stand_in(rows, framework, table_dtype, distribution, version, moe_tp, moe_ep, text, 1.0)
    for version, frame in frames.items():  # 2. the nearest measured per-GPU work, scaled
        same = _match(frame, **shape, moe_dtype=table_dtype, distribution=distribution)
        measured = {(int(t), int(e)) for t, e in same[["moe_tp_size", "moe_ep_size"]].drop_duplicates().to_numpy()}
        if not measured:
            continue
        work = moe_tp * moe_ep
        t, e = min(measured, key=lambda te: (te[1] != moe_ep, abs(np.log(te[0] * te[1] / work)), te))
        rows = _match(same, moe_tp_size=t, moe_ep_size=e)
        text = f"layout {t}x{e} scaled by {t * e}/{work}"
        return _stand_in(rows, framework, table_dtype, distribution, version, moe_tp, moe_ep, text, t * e / work)
    shape_text = ", ".join(f"{k}={v}" for k, v in shape.items())
    if not layouts_measured:
        raise ConfigError(f"{where} has no {table_dtype} MoE rows for {shape_text}{hint}")
    raise ConfigError(
        f"{where} has no {table_dtype} MoE rows for {shape_text} in distribution {distribution}: "
        f"measured (moe_tp, moe_ep) in {sorted(layouts_measured)}{hint}"
    )


def _match(frame, **columns):
    mask = np.ones(len(frame), dtype=bool)
    for column, value in columns.items():
        mask &= (frame[column] == value).to_numpy()
    return frame[mask]


def _kernel_rows(rows, framework: str, label: str):
    """The chosen kernel's rows (and TRT-LLM's min-latency twin's, which MoEGrid prices small
    layers from), with the label naming them."""
    source = _pick_kernel(rows, framework)
    chosen = rows["kernel_source"] == source
    twin = (rows["kernel_source"] == MIN_LATENCY_SOURCE) & (source != MIN_LATENCY_SOURCE)
    label = label.format(source=source)
    if twin.any():
        label += f" (<= {MIN_LATENCY_MAX_TOKENS} tokens: {MIN_LATENCY_SOURCE})"
    return rows[chosen | twin], label


def _stand_in(rows, framework, table_dtype, distribution, version, moe_tp, moe_ep, text, scale):
    """Rows standing in for (moe_tp, moe_ep), their latency times ``scale``, marked for MoEGrid."""
    rows, label = _kernel_rows(rows, framework, f"moe {{source}} {table_dtype} {distribution} {version}")
    if scale != 1.0:
        rows = rows.assign(latency=rows["latency"] * scale)
    rows.attrs[STAND_IN] = True
    # no comma: a run's source label is a comma-separated list of tables
    return rows, f"{label} (moe_tp x moe_ep layout {moe_tp}x{moe_ep} never measured: {text} stands in; counted)"
