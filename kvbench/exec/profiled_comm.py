"""Collectives beyond the tensor-parallel all-reduce, priced from ``comm/nccl/<ver>/nccl_perf``.

Under attention data parallelism each rank's attention runs on its own requests, but a MoE layer
needs every rank's tokens: the framework all-gathers the ranks' hidden states over the
``tp x attention_dp`` GPUs of the MoE group before the experts and reduce-scatters the experts'
output back after them (SGLang's and vLLM's DP-attention MoE path without a DeepEP all-to-all
backend). kvbench prices the two from NCCL's measured ``all_gather`` and ``reduce_scatter`` of fp16
(``nccl_dtype=half``) at the group's GPU count, by the message the collective moves (all
ranks' tokens x hidden values; the table's ``message_size`` counts elements, as aiconfigurator's
estimator reads it): linear between measured sizes and in proportion beyond the largest
(counted). The framework-specific ``moe_a2a_perf`` tables (DeepEP dispatch/combine) were measured
only at ``ep_size=8`` on one node for wide-EP deployments, which kvbench does not model.
"""

from __future__ import annotations

from kvbench.errors import ConfigError
from kvbench.exec.profiled_moe import TokenCurve
from kvbench.specs import profiles


class CollectiveCurve(TokenCurve):
    """One collective's latency in seconds by its message size in elements (fp16/bf16 values)."""

    def __init__(self, frame, counter) -> None:
        super().__init__(frame, counter, x_column="message_size")


def select_nccl(system: str, op_name: str, num_gpus: int):
    """The newest NCCL table's rows for ``op_name`` over ``num_gpus`` GPUs (one-line ConfigError)."""
    versions = profiles.versions(system, "comm", "nccl", "nccl_perf")
    if not versions:
        hint = f" ({profiles.INSTALL_HINT} for the full tables)" if profiles.table_root().excerpt else ""
        raise ConfigError(f"{profiles.table_root().label} has no NCCL table measured on {system}{hint}")
    frame = profiles.read_table(system, "comm", "nccl", versions[-1], "nccl_perf")
    rows = frame[(frame["op_name"] == op_name) & (frame["nccl_dtype"] == "half")]
    part = rows[rows["num_gpus"] == num_gpus]
    if part.empty:
        measured = sorted(int(g) for g in rows["num_gpus"].unique())
        raise ConfigError(
            f"{profiles.table_root().label} {system}/comm/nccl/{versions[-1]} has no {op_name} over {num_gpus} GPUs "
            f"(model.tp x model.attention_dp): measured {measured}"
        )
    return part, f"nccl {versions[-1]}"
