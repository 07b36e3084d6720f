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

More GPUs than measured, inside one NVLink domain. The comm tables of GB200 and GB300 measure
collectives over 2 and 4 GPUs only (one compute tray), though their NVL72 racks join 72 GPUs in one
NVLink-switch domain. A collective over ``n`` GPUs that the table never measured is priced by a
stand-in (:func:`rows_at_gpus`), for the framework's all-reduce and NCCL's collectives alike,
only when the ``n`` GPUs fit in one NVLink domain of the system
(:func:`kvbench.specs.profiles.nvlink_domain_gpus`: ``num_gpus_per_rack`` where the package's
``<system>.yaml`` joins a rack's nodes by NVLink, else ``num_gpus_per_node``) and a smaller count
``m`` is measured. The rule is NCCL's bus-bandwidth model (nccl-tests ``doc/PERFORMANCE.md``): a
collective of ``S`` bytes over ``n`` GPUs takes ``S x factor(n) / busBw``, with ``factor(n) =
2(n-1)/n`` for all-reduce and ``(n-1)/n`` for all_gather, reduce_scatter and alltoall. Within one
NVLink-switch domain every GPU keeps its own full link to the switch, so busBw at ``n`` is taken
equal to busBw measured at the largest measured count ``m < n``: ``t_n(S) = t_m(S) x factor(n) /
factor(m)`` at the same message (the ``m``-GPU row looked up as any other, then scaled; 4 -> 8
GPUs: x 7/6 for every op). Nothing is fitted to measured rows of ``n`` GPUs. The model is
bandwidth's: a small message's fixed latency is scaled with the rest, and a ring over ``n`` GPUs
has ``n - 1`` steps where the measured ``m`` had ``m - 1``, which the model leaves out. Where
GB300's tables did measure 8 and 16 GPUs (vLLM 0.27.0's all-reduce), the rule applied to their
4-GPU rows meets them within 0.8-1.25x at the four largest messages and falls short of them
(below 0.75x, down to 0.2x at 16 GPUs) at the eight smallest, where latency binds and crossing
trays costs more (``tests/kvbench/exec/test_profiled_comm.py`` computes both): a stand-in prices
small decode all-reduces low. SGLang 0.5.14's measured 8-GPU all-reduce on GB300 is further still
above the rule at small messages (its own rows, not a stand-in, price it there). A stand-in
is named in the run's source label and every lookup in it is counted as an extrapolation
(``profile_extrapolated_lookups``), as a MoE layout stand-in is (:mod:`kvbench.exec.profiled_moe`).
More GPUs than one NVLink domain, or no smaller count measured, stays a one-line ConfigError.
"""

from __future__ import annotations

from kvbench.errors import ConfigError
from kvbench.exec.profiled_moe import TokenCurve
from kvbench.specs import profiles

#: ``attrs`` key of a frame whose rows stand in for a GPU count the table never measured
STAND_IN = "collective_gpus_stand_in"
#: the all-reduce's name in NCCL's tables (every other collective moves (n-1)/n of its bytes per GPU)
ALL_REDUCE = "all_reduce"


def bus_factor(op_name: str, num_gpus: int) -> float:
    """NCCL's bus-bandwidth factor of ``op_name`` over ``num_gpus`` GPUs (nccl-tests PERFORMANCE.md):
    busBw = algBw x factor, 2(n-1)/n for all-reduce, (n-1)/n for all_gather, reduce_scatter, alltoall."""
    share = (num_gpus - 1) / num_gpus
    return 2.0 * share if op_name == ALL_REDUCE else share


def rows_at_gpus(rows, op_name: str, num_gpus: int, system: str, what: str, set_by: str):
    """The rows of ``rows`` (one collective, every measured GPU count) over ``num_gpus`` GPUs, and
    the words the run's label adds ("" when measured). Where the table never measured ``num_gpus``
    GPUs, the largest measured count below it stands in, its latency times ``bus_factor(n) /
    bus_factor(m)``, when the ``num_gpus`` GPUs fit in one NVLink domain (module docstring); else
    a one-line ConfigError naming what was measured (``what``: the table and the collective;
    ``set_by``: the settings that chose the count)."""
    part = rows[rows["num_gpus"] == num_gpus]
    if not part.empty:
        return part, ""
    measured = sorted(int(g) for g in rows["num_gpus"].unique())
    smaller = [m for m in measured if m < num_gpus]
    domain = profiles.nvlink_domain_gpus(system)
    hint = f" ({profiles.INSTALL_HINT} for the full tables)" if profiles.table_root().excerpt else ""
    if not smaller:
        raise ConfigError(f"{what} over {num_gpus} GPUs ({set_by}): measured {measured}{hint}")
    if domain is None or num_gpus > domain:
        raise ConfigError(
            f"{what} over {num_gpus} GPUs ({set_by}): measured {measured}, and {num_gpus} GPUs exceed one NVLink domain "
            f"of {system} ({domain} GPUs), beyond which kvbench prices no stand-in"
        )
    m = smaller[-1]
    scale = bus_factor(op_name, num_gpus) / bus_factor(op_name, m)
    part = rows[rows["num_gpus"] == m].assign(latency=lambda f: f["latency"] * scale)
    part.attrs[STAND_IN] = True
    # no comma: a run's source label is a comma-separated list of tables
    return part, (
        f" ({num_gpus} GPUs never measured: the {m}-GPU rows x {scale:.4g} stand in by NCCL's bus bandwidth "
        f"in one NVLink domain of {domain}; counted)"
    )


class CollectiveCurve(TokenCurve):
    """One collective's latency in seconds by its message size in elements (fp16/bf16 values);
    rows standing in for an unmeasured GPU count (:func:`rows_at_gpus`) count every lookup."""

    def __init__(self, frame, counter) -> None:
        self.stand_in = bool(frame.attrs.get(STAND_IN))
        super().__init__(frame, counter, x_column="message_size")

    def latency_s(self, num_elements: float) -> float:
        if self.stand_in and num_elements > 0:
            self.counter.count += 1
        return super().latency_s(num_elements)


def select_nccl(system: str, op_name: str, num_gpus: int):
    """The newest NCCL table's rows for ``op_name`` over ``num_gpus`` GPUs (one-line ConfigError)."""
    versions = profiles.versions(system, "comm", "nccl", "nccl_perf")
    if not versions:
        hint = f" ({profiles.INSTALL_HINT} for the full tables)" if profiles.table_root().excerpt else ""
        raise ConfigError(f"{profiles.table_root().label} has no NCCL table measured on {system}{hint}")
    frame = profiles.read_table(system, "comm", "nccl", versions[-1], "nccl_perf")
    rows = frame[(frame["op_name"] == op_name) & (frame["nccl_dtype"] == "half")]
    what = f"{profiles.table_root().label} {system}/comm/nccl/{versions[-1]} has no {op_name}"
    part, stand_in = rows_at_gpus(rows, op_name, num_gpus, system, what, "model.tp x model.attention_dp")
    return part, f"nccl {versions[-1]}{stand_in}"
