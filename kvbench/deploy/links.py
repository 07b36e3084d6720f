"""The KV link of a disaggregated deployment: how long one request's KV cache takes to move from
its prefill worker to its decode worker, and the order transfers over one link run in.

Where the numbers come from: aiconfigurator-core's measured ``comm`` tables (the NCCL ones kvbench
reads for tensor and expert parallelism) hold all_gather, all_reduce, alltoall and reduce_scatter
among the GPUs of one node, and no point-to-point (send/recv) operation, so they do not price a
one-way transfer between two workers. The link's bandwidth and latency are therefore the hardware
config's (``hardware.nvlink_*`` and ``hardware.network_*``, each sourced in conf/hardware/), or
``deployment.link_bytes_per_s`` / ``deployment.link_latency_s`` where given; ``source`` says which.

Bytes under tensor parallelism: the ``kv_bytes`` a link is given are those the prefill worker's
ledger holds for the request, and kvbench counts every byte per GPU (``ModelSpec.kv_bytes_per_token``
is one GPU's share of a token). Each of the prefill worker's GPUs sends its own shard over its own
link at the same time (NVLink ports and NICs are per GPU), so the transfer takes
``kv_bytes / per-GPU bandwidth``, not ``kv_bytes x tp / bandwidth``. When the decode worker has fewer
tensor-parallel GPUs than the prefill worker, each of its GPUs receives ``prefill_tp / decode_tp``
shards through its one link, and the transfer takes that many times longer (:func:`link_for`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.deploy.config import DeploymentConfig
from kvbench.deploy.interfaces import Transfer
from kvbench.errors import ConfigError
from kvbench.specs.hardware import HardwareSpec

KINDS = ("nvlink", "network")


@dataclass
class FifoKvLink:
    """One prefill worker's KV link (a :class:`kvbench.deploy.interfaces.KvLink`): transfers run
    one after another in the order they are scheduled, each occupying the wire for
    ``kv_bytes / bytes_per_s``; ``latency_s`` is added to when its last byte lands and does not
    hold the wire (the next transfer's bytes may follow at once, as RDMA writes pipeline).

    ``overlap``: ``after_prefill`` starts a transfer once its prompt is computed, the decode side
    has reserved its blocks (``ready_s``) and the wire is free; ``layerwise`` sends each layer's
    KV as the prefill computes it, the prefill's layers taken as evenly spaced over
    ``[prefill_start_s, prefill_end_s]``: layer k of L can leave from
    ``prefill_start_s + k (prefill_end_s - prefill_start_s) / L``, once ``ready_s`` has passed and
    the previous bytes have left."""

    #: bandwidth for the ledger's (per-GPU) bytes: see the module's note on tensor parallelism
    bytes_per_s: float
    latency_s: float
    #: where bytes_per_s and latency_s come from
    source: str
    overlap: str = "after_prefill"
    #: nvlink or network
    kind: str = "nvlink"
    #: when the wire is free: the last scheduled transfer's last byte has left
    free_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bytes_per_s) and self.bytes_per_s > 0):
            raise ConfigError(
                f"the {self.kind} KV link's bandwidth is {self.bytes_per_s!r} bytes/s ({self.source}): a link with "
                "zero bandwidth never delivers the KV; give it a positive rate"
            )
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(
                f"the {self.kind} KV link's latency is {self.latency_s!r} s ({self.source}): use seconds >= 0"
            )
        if self.overlap not in ("after_prefill", "layerwise"):
            raise ConfigError(
                f"deployment.transfer={self.overlap!r} is invalid: choose one of after_prefill, layerwise"
            )

    def schedule(
        self, kv_bytes: int, *, ready_s: float, prefill_start_s: float, prefill_end_s: float, num_layers: int
    ) -> Transfer:
        if kv_bytes < 0 or num_layers < 1 or prefill_end_s < prefill_start_s:
            raise ValueError(
                f"a transfer needs kv_bytes >= 0, num_layers >= 1 and prefill_start_s <= prefill_end_s "
                f"(got {kv_bytes}, {num_layers}, [{prefill_start_s}, {prefill_end_s}])"
            )
        earliest_s = max(ready_s, self.free_s)
        if self.overlap == "after_prefill":
            start_s = max(earliest_s, prefill_end_s)
            wire_end_s = start_s + kv_bytes / self.bytes_per_s
        else:
            layer_wire_s = kv_bytes / num_layers / self.bytes_per_s
            layer_compute_s = (prefill_end_s - prefill_start_s) / num_layers
            start_s = wire_end_s = None
            for layer in range(1, num_layers + 1):
                # the layer leaves once computed, and after the bytes before it (its own and earlier transfers')
                computed_s = prefill_start_s + layer * layer_compute_s
                leave_s = max(computed_s, earliest_s if wire_end_s is None else wire_end_s)
                start_s = leave_s if start_s is None else start_s
                wire_end_s = leave_s + layer_wire_s
        self.free_s = wire_end_s
        return Transfer(start_s=start_s, end_s=wire_end_s + self.latency_s, kv_bytes=int(kv_bytes))


def link_kind(hardware: HardwareSpec, deployment: DeploymentConfig, *, prefill_gpus: int, decode_gpus: int) -> str:
    """``deployment.link``, or for ``auto``: nvlink when the prefill and the decode worker fit in
    one NVLink domain together (``prefill_gpus + decode_gpus <= hardware.nvlink_domain_gpus``), else
    network (they sit in different nodes, or racks)."""
    if deployment.link != "auto":
        return deployment.link
    return "nvlink" if prefill_gpus + decode_gpus <= hardware.nvlink_domain_gpus else "network"


def link_for(
    hardware: HardwareSpec,
    deployment: DeploymentConfig,
    *,
    prefill_gpus: int,
    decode_gpus: int,
    prefill_tp: int = 1,
    decode_tp: int = 1,
) -> FifoKvLink:
    """A prefill worker's KV link to the decode workers: its kind (:func:`link_kind`), its per-GPU
    bandwidth and latency (``deployment.link_*``, else the hardware config's for that kind), and the
    deployment's transfer overlap. ``*_gpus`` are each worker's GPUs (tp x attention_dp), ``*_tp``
    its tensor-parallel GPUs: with fewer on the decode side, each decode GPU receives
    ``prefill_tp / decode_tp`` shards through one link, which divides the bandwidth by that."""
    kind = link_kind(hardware, deployment, prefill_gpus=prefill_gpus, decode_gpus=decode_gpus)
    if deployment.link_bytes_per_s is not None:
        per_gpu_bytes_per_s, bandwidth_source = deployment.link_bytes_per_s, "deployment.link_bytes_per_s"
    else:
        per_gpu_bytes_per_s = getattr(hardware, f"{kind}_bytes_per_s")
        bandwidth_source = f"hardware config {kind}_bytes_per_s ({hardware.name})"
    if deployment.link_latency_s is not None:
        latency_s, latency_source = deployment.link_latency_s, "deployment.link_latency_s"
    else:
        latency_s = getattr(hardware, f"{kind}_latency_s")
        latency_source = f"hardware config {kind}_latency_s ({hardware.name})"
    shards_per_receiver = max(1.0, prefill_tp / decode_tp)
    return FifoKvLink(
        bytes_per_s=per_gpu_bytes_per_s / shards_per_receiver,
        latency_s=latency_s,
        source=(
            f"{kind}: {per_gpu_bytes_per_s:.4g} B/s per GPU from {bandwidth_source}, {latency_s:.3g} s from "
            f"{latency_source} (no measured point-to-point table)"
        ),
        overlap=deployment.transfer,
        kind=kind,
    )
