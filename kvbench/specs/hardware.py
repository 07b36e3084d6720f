"""HardwareSpec: the GPU constants the cost model needs, and the KV budget they leave."""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import ConfigError, require
from kvbench.specs.names import require_name


@dataclass
class HardwareSpec:
    #: a short name ([A-Za-z0-9][A-Za-z0-9._-]*, at most 64 characters); also selects the folder
    #: <calibration_dir>/<name>/ (kvbench/calibrations/<name>/ by default) of kernel efficiencies
    name: str = "h100-sxm"
    hbm_bytes: float = 80e9
    hbm_bandwidth_bytes_per_s: float = 3.35e12
    #: dense bf16 tensor-core peak
    dense_flops_per_s: float = 989e12
    #: fraction of the peak a prefill achieves (compute-bound)
    prefill_flops_efficiency: float = 0.5
    #: host <-> device link, for swapping
    host_link_bytes_per_s: float = 64e9
    #: fixed cost of one host <-> device copy (a cudaMemcpyAsync and its PCIe round trip); a
    #: swap pays it once per block moved, as vLLM copies block by block
    host_transfer_overhead_s: float = 10e-6
    #: host memory set aside for swapped-out KV (vLLM's swap_space, 4 GiB by default)
    host_swap_bytes: float = 4 * 2**30
    #: the KV-cache budget in bytes; when null it is hbm_bytes * memory_fraction - weight bytes
    kv_budget_bytes: float | None = None
    #: vLLM's gpu_memory_utilization, used only when kv_budget_bytes is null
    memory_fraction: float = 0.9
    #: the links a disaggregated run (deployment=disagg) moves KV over, per GPU and one direction:
    #: NVLink to a GPU of the same NVLink domain, the network (InfiniBand/RoCE, a NIC per GPU)
    #: beyond it. The defaults are an H100 SXM node's (aiconfigurator-core's systems/h100_sxm.yaml:
    #: intra_node_bw, inter_node_bw, p2p_latency, num_gpus_per_node)
    nvlink_bytes_per_s: float = 450e9
    #: one transfer's fixed cost over NVLink (set-up and the last byte's flight)
    nvlink_latency_s: float = 10e-6
    #: GPUs one NVLink domain joins: an HGX node's 8, a GB200 NVL72 rack's 72
    nvlink_domain_gpus: int = 8
    network_bytes_per_s: float = 50e9
    #: one transfer's fixed cost over the network
    network_latency_s: float = 10e-6

    def validate(self) -> None:
        require_name("hardware.name", self.name)  # a folder name: calibrations/<name>/
        require(self.hbm_bytes > 0, "hardware.hbm_bytes", self.hbm_bytes, "use a positive number")
        # at least one byte (FLOP) per second: slower rates overflow the simulated times to inf
        rates = ("hbm_bandwidth_bytes_per_s", "dense_flops_per_s", "host_link_bytes_per_s")
        for key in (*rates, "nvlink_bytes_per_s", "network_bytes_per_s"):
            require(getattr(self, key) >= 1, f"hardware.{key}", getattr(self, key), "use a rate >= 1 per second")
        for key in ("nvlink_latency_s", "network_latency_s"):
            require(0 <= getattr(self, key) <= 1, f"hardware.{key}", getattr(self, key), "use seconds in [0, 1]")
        require(
            self.nvlink_domain_gpus >= 1,
            "hardware.nvlink_domain_gpus",
            self.nvlink_domain_gpus,
            "use a positive number of GPUs (1: no NVLink between GPUs)",
        )
        require(self.host_swap_bytes >= 0, "hardware.host_swap_bytes", self.host_swap_bytes, "use a number >= 0")
        # PCIe's is ~10 us; a second per copy is no host link, and a swap pays it once per block
        require(
            0 <= self.host_transfer_overhead_s <= 1,
            "hardware.host_transfer_overhead_s",
            self.host_transfer_overhead_s,
            "use seconds in [0, 1]",
        )
        # byte counts become int64 columns of the results (kv_budget_bytes, swap_pool_peak_bytes)
        for key in ("hbm_bytes", "host_swap_bytes", "kv_budget_bytes"):
            value = getattr(self, key)
            require(value is None or value < 2**63, f"hardware.{key}", value, "use fewer than 2**63 bytes (int64)")
        require(
            0 < self.prefill_flops_efficiency <= 1,
            "hardware.prefill_flops_efficiency",
            self.prefill_flops_efficiency,
            "use a fraction in (0, 1]",
        )
        require(
            self.achieved_prefill_flops_per_s >= 1,
            "hardware.prefill_flops_efficiency",
            self.prefill_flops_efficiency,
            "hardware.dense_flops_per_s * prefill_flops_efficiency must be >= 1 FLOP/s",
        )
        require(
            0 < self.memory_fraction <= 1, "hardware.memory_fraction", self.memory_fraction, "use a fraction in (0, 1]"
        )
        require(
            self.kv_budget_bytes is None or self.kv_budget_bytes > 0,
            "hardware.kv_budget_bytes",
            self.kv_budget_bytes,
            "use a positive number of bytes or null to derive it",
        )

    @property
    def achieved_prefill_flops_per_s(self) -> float:
        return self.dense_flops_per_s * self.prefill_flops_efficiency

    def kv_budget(self, weight_bytes: int) -> int:
        """KV bytes available: explicit, or HBM * memory_fraction minus the weights. Either way the
        weights and the KV budget must fit in HBM together."""
        if self.kv_budget_bytes is not None:
            if self.kv_budget_bytes + weight_bytes > self.hbm_bytes:
                raise ConfigError(
                    f"hardware.kv_budget_bytes={self.kv_budget_bytes:.4g} plus {weight_bytes / 1e9:.1f} GB of weights "
                    f"exceed hardware.hbm_bytes={self.hbm_bytes:.4g} ({self.name}): lower the KV budget, set it to "
                    "null to derive it, or pick a larger GPU"
                )
            return int(self.kv_budget_bytes)
        budget = int(self.hbm_bytes * self.memory_fraction) - int(weight_bytes)
        if budget <= 0:
            raise ConfigError(
                f"hardware.memory_fraction={self.memory_fraction!r} leaves no KV budget: "
                f"{self.hbm_bytes * self.memory_fraction / 1e9:.1f} GB usable < {weight_bytes / 1e9:.1f} GB of weights"
            )
        return budget
