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
int4 -> ``int4_wo`` (weight-only int4, Kimi-K2.5). A precision the tables never measured for the
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


class MoEGrid(TokenCurve):
    """One MoE layer's routed experts on one GPU, in seconds, by the tokens entering the layer
    across the MoE group (every attention-DP rank's tokens). Rows of TRT-LLM's min-latency twin
    beside the default kernel's price the layers of at most MIN_LATENCY_MAX_TOKENS tokens."""

    def __init__(self, frame, counter) -> None:
        twin = frame["kernel_source"] == MIN_LATENCY_SOURCE
        self.low_latency = None
        if twin.any() and not twin.all():
            self.low_latency = TokenCurve(frame[twin], counter)
            frame = frame[~twin]
        super().__init__(frame, counter)

    def latency_s(self, tokens: float) -> float:
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
    dtype and distribution, with its label; a one-line ConfigError naming what was measured."""
    root = profiles.table_root()
    versions = profiles.versions(system, "moe", framework, "moe_perf")
    if not versions:
        hint = f" ({profiles.INSTALL_HINT} for the full tables)" if root.excerpt else ""
        raise ConfigError(f"{root.label} has no MoE table measured with {framework} on {system}{hint}")
    table_dtype = moe_table_dtype(moe_dtype)
    shape = dict(hidden_size=hidden_size, inter_size=inter_size, topk=topk, num_experts=num_experts)
    layout = dict(moe_tp_size=moe_tp, moe_ep_size=moe_ep, distribution=distribution)
    dtypes_measured: set[str] = set()
    layouts_measured: set[tuple] = set()
    for version in reversed(versions):
        frame = profiles.read_table(system, "moe", framework, version, "moe_perf")
        dtypes_measured |= set(frame["moe_dtype"].unique())
        mask = np.ones(len(frame), dtype=bool)
        for column, value in {**shape, "moe_dtype": table_dtype}.items():
            mask &= (frame[column] == value).to_numpy()
        same_shape = frame[mask]
        layouts_measured |= {
            (int(t), int(e)) for t, e in same_shape[["moe_tp_size", "moe_ep_size"]].drop_duplicates().to_numpy()
        }
        rows = same_shape
        for column, value in layout.items():
            rows = rows[rows[column] == value]
        if not rows.empty:
            source = _pick_kernel(rows, framework)
            chosen = rows["kernel_source"] == source
            twin = (rows["kernel_source"] == MIN_LATENCY_SOURCE) & (source != MIN_LATENCY_SOURCE)
            label = f"moe {source} {table_dtype} {distribution} {version}"
            if twin.any():
                label += f" (<= {MIN_LATENCY_MAX_TOKENS} tokens: {MIN_LATENCY_SOURCE})"
            return rows[chosen | twin], label
    where = f"{root.label} {system}/moe/{framework}"
    hint = f" ({profiles.INSTALL_HINT} for the full tables)" if root.excerpt else ""
    if table_dtype not in dtypes_measured:
        raise ConfigError(
            f"{where} never measured MoE experts in moe_dtype={table_dtype} (model.moe_dtype={moe_dtype}): "
            f"measured {', '.join(sorted(dtypes_measured))}{hint}"
        )
    shape_text = ", ".join(f"{k}={v}" for k, v in shape.items())
    if not layouts_measured:
        raise ConfigError(f"{where} has no {table_dtype} MoE rows for {shape_text}{hint}")
    raise ConfigError(
        f"{where} has no {table_dtype} MoE rows for {shape_text} at moe_tp={moe_tp}, moe_ep={moe_ep} "
        f"({distribution}): measured (moe_tp, moe_ep) in {sorted(layouts_measured)}{hint}"
    )
