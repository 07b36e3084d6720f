"""Linear attention (gated delta net, Qwen3.5) priced from ``linear_attention/<fw>/<ver>/gdn_perf``.

The table times the two kernels of one gated-delta-net layer on one GPU, each by phase:

- **decode** (``phase=generation``, one new token per sequence): the short convolution's state
  update (``causal_conv1d_update``) and the recurrent delta-rule step
  (``fused_recurrent_gated_delta_rule_packed_decode``), by ``batch_size``. Their cost does not grow
  with the context: the layer reads its fixed state, not a KV cache.
- **prefill** (``phase=context``): the causal convolution (``causal_conv1d_fn``) and the chunked
  delta rule (``chunk_gated_delta_rule``), by ``batch_size`` and ``seq_len``. A chunk of ``c`` new
  tokens after ``p`` cached ones costs the measured prefill of ``c`` tokens: the state carries the
  past, so the work is linear in the new tokens whatever ``p`` is.

Rows are selected by the layer's heads per GPU (``num_k_heads``, ``num_v_heads`` split by tensor
parallelism), head widths and ``d_model``; the layer's projections (in_proj, the b/a gates,
out_proj) are GEMMs the caller prices from the GEMM table.
"""

from __future__ import annotations

import numpy as np

from kvbench.errors import ConfigError
from kvbench.exec.profiled_moe import TokenCurve
from kvbench.specs import profiles

DECODE_KERNELS = ("causal_conv1d_update", "fused_recurrent_gated_delta_rule_packed_decode")
#: the convolution, then the chunked delta rule (vLLM names its FlashInfer build apart)
PREFILL_KERNELS = ("causal_conv1d_fn", ("chunk_gated_delta_rule", "chunk_gated_delta_rule_flashinfer"))


class GDNLayer:
    """One gated-delta-net layer's kernels on one GPU, in seconds."""

    def __init__(self, decode_frames: list, prefill_frames: list, counter) -> None:
        self.decode = [TokenCurve(f, counter, x_column="batch_size") for f in decode_frames]
        self.prefill = [
            TokenCurve(f[f["batch_size"] == f["batch_size"].min()], counter, x_column="seq_len") for f in prefill_frames
        ]

    def decode_s(self, batch: int) -> float:
        return sum(curve.latency_s(batch) for curve in self.decode)

    def chunk_s(self, num_new_tokens: int) -> float:
        return sum(curve.latency_s(num_new_tokens) for curve in self.prefill)


def select_gdn(system: str, framework: str, *, hidden_size: int, linear, tp: int) -> tuple[list, list, str]:
    """The decode and prefill kernels' rows at this layer's shape per GPU (one-line ConfigError)."""
    version = profiles.newest_version(system, "linear_attention", framework, "gdn_perf", "gated delta net")
    frame = profiles.read_table(system, "linear_attention", framework, version, "gdn_perf")
    where = f"{profiles.table_root().label} {system}/linear_attention/{framework}/{version}/gdn_perf"
    shape = dict(
        d_model=hidden_size,
        num_k_heads=linear.num_key_heads // tp,
        num_v_heads=linear.num_value_heads // tp,
        head_k_dim=linear.key_head_dim,
        head_v_dim=linear.value_head_dim,
    )
    mask = np.ones(len(frame), dtype=bool)
    for column, value in shape.items():
        mask &= (frame[column] == value).to_numpy()
    rows = frame[mask]
    if rows.empty:
        measured = sorted({tuple(int(x) for x in r) for r in frame[list(shape)].drop_duplicates().to_numpy()})[:8]
        hint = f" ({profiles.INSTALL_HINT} for the full tables)" if profiles.table_root().excerpt else ""
        raise ConfigError(f"{where} has no rows for {shape}: measured ({', '.join(shape)}) in {measured}{hint}")

    def kernel_rows(phase: str, names) -> object:
        names = names if isinstance(names, tuple) else (names,)
        part = rows[(rows["phase"] == phase) & rows["kernel_source"].isin(names)]
        if part.empty:
            raise ConfigError(f"{where} has no {phase} rows of {' or '.join(names)} at {shape}")
        return part

    decode = [kernel_rows("generation", k) for k in DECODE_KERNELS]
    prefill = [kernel_rows("context", k) for k in PREFILL_KERNELS]
    return decode, prefill, f"gdn {version}"
