"""The simulated GPU: how long one engine step takes (the lecture's roofline cost model).

- decode: every step re-reads all weights plus the KV of every decoding sequence, so it is
  memory-bound: ``(weight bytes + KV bytes read) / (HBM bandwidth * kernel efficiency)``;
- prefill: compute-bound: ``(2*N*S + 4*L*H*d*S^2) / (peak FLOP/s * achieved fraction)`` per prompt.

A step that both prefills and decodes (iteration-level batching without chunked prefill) is
charged the sum: the cost model does not assume the two overlap, which is why one long prefill
stalls every decode in its batch (lecture section 10.6).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.specs.hardware import HardwareSpec
from kvbench.specs.model import ModelSpec


@dataclass(frozen=True)
class CostModel:
    model: ModelSpec
    hardware: HardwareSpec
    #: fraction of HBM bandwidth the decode kernel achieves (1.0 when uncalibrated)
    decode_efficiency: float = 1.0

    def __post_init__(self) -> None:
        # hoisted constants: step_time_s runs once per simulated step
        object.__setattr__(self, "_linear_flops", 2.0 * self.model.num_params)
        object.__setattr__(
            self, "_quadratic_flops", 4.0 * self.model.num_layers * self.model.num_heads * self.model.head_dim
        )
        object.__setattr__(self, "_flops_per_s", self.hardware.achieved_prefill_flops_per_s)
        object.__setattr__(
            self, "_bytes_per_s", self.hardware.hbm_bandwidth_bytes_per_s * self.decode_efficiency
        )

    def prefill_time_s(self, num_tokens: int) -> float:
        """Compute time to prefill one sequence of ``num_tokens`` context tokens."""
        return (self._linear_flops * num_tokens + self._quadratic_flops * num_tokens * num_tokens) / self._flops_per_s

    def decode_time_s(self, kv_read_tokens: int) -> float:
        """Time of one decode step whose sequences hold ``kv_read_tokens`` KV slots in total."""
        return (self.model.weight_bytes + kv_read_tokens * self.model.kv_bytes_per_token) / self._bytes_per_s

    def step_time_s(self, prefill_time_s: float, num_decode_seqs: int, kv_read_tokens: int) -> float:
        """One engine step: its prefills' compute plus, if any sequence decodes, one decode pass."""
        decode_s = self.decode_time_s(kv_read_tokens) if num_decode_seqs else 0.0
        return prefill_time_s + decode_s
