"""The simulated GPU: what each piece of a step costs (the lecture's roofline cost model).

The roofline is kvbench's default clock; :mod:`kvbench.exec.profiled` prices the same pieces from
public kernel measurements instead (picked by choosing a measured kernel). Under tensor
parallelism (``model.tp``) every term is one GPU's share; the roofline prices no all-reduce.

- decode: every step re-reads all weights plus the KV of every decoding sequence, so it is
  memory-bound: ``weight bytes / HBM bandwidth + KV bytes read / (HBM bandwidth * kernel
  efficiency)`` (the attention kernel's calibrated efficiency applies to the KV it reads, not to
  the weight matrices, which other kernels read). A model with sliding-window layers reads, per
  KV-cache group, the tokens that group attends to: a window group of W tokens reads ``min(n, W)``
  of a sequence's ``n`` (:meth:`CostModel.windowed_decode_times_s`; the roofline only: a profiled
  clock looks attention up by the whole context). Prefill is priced as full attention;
- prefill: compute-bound. A chunk of ``c`` new tokens over ``p`` tokens already cached costs
  ``(2*N*c + 4*L*H*d*c*(p + c)) / (peak FLOP/s * achieved fraction)``: every new query row attends
  to every key up to the end of its chunk. With ``p = 0`` and ``c = S`` this is the lecture's
  ``2*N*S + 4*L*H*d*S^2``; a prompt split into chunks costs less attention than one chunk,
  because rows of an early chunk never see the keys of a later one;
- swap: ``bytes / host link bandwidth + one per-transfer overhead per copy`` each way (vLLM copies
  block by block, so small blocks pay the overhead more often);
- copy on the device (copy-on-write, a contiguous fork): read and write, ``2 * bytes / HBM bandwidth``.

A step's time is the sum of its parts: the cost model does not assume that prefill, decode and
transfers overlap, which is why one long prefill stalls every decode in its batch (lecture 10.6).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.core.kv import Transfer
from kvbench.specs.hardware import HardwareSpec
from kvbench.specs.kv_groups import WINDOW
from kvbench.specs.model import ModelSpec


@dataclass(frozen=True)
class CostModel:
    model: ModelSpec
    hardware: HardwareSpec
    #: fraction of HBM bandwidth the decode kernel achieves on the KV it reads (1.0 when uncalibrated)
    decode_efficiency: float = 1.0
    #: a calibration's fitted prefill fraction of peak FLOP/s; None: the hardware config's
    prefill_flops_efficiency: float | None = None
    #: a calibration's fitted fixed cost per step (kernel launches, sampling, host work); the
    #: executor adds it once per step (:meth:`step_overhead_total_s`), 0.0 when uncalibrated
    step_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        # hoisted constants: these run once per simulated step
        # per GPU: tensor parallelism splits the weights and the heads (the roofline prices no all-reduce)
        m = self.model
        object.__setattr__(self, "_kv_bytes_per_token", m.kv_bytes_per_token)  # (a property of three)
        # a mixture-of-experts token runs through its active parameters only, and a linear-attention
        # layer has no quadratic term (both equal num_params and num_layers for a dense model)
        object.__setattr__(self, "_linear_flops", 2.0 * m.active_params / m.tp)
        object.__setattr__(self, "_quadratic_flops", 4.0 * m.num_token_layers * m.heads_per_gpu * m.head_dim)
        flops_per_s = (
            self.hardware.achieved_prefill_flops_per_s
            if self.prefill_flops_efficiency is None
            else self.hardware.dense_flops_per_s * self.prefill_flops_efficiency
        )
        object.__setattr__(self, "_flops_per_s", flops_per_s)
        object.__setattr__(self, "_weights_s", self.model.weight_bytes / self.hardware.hbm_bandwidth_bytes_per_s)
        object.__setattr__(self, "_kv_bytes_per_s", self.hardware.hbm_bandwidth_bytes_per_s * self.decode_efficiency)
        # (window tokens, that group's bytes per token) of each window group: what a decode does
        # not read of a sequence longer than the window; () for a full-attention model
        windows = tuple((g.window_tokens, m.kv_group_bytes_per_token(g)) for g in m.kv_groups if g.kind == WINDOW)
        object.__setattr__(self, "window_groups", windows if type(self) is CostModel else ())
        # the same, groups of one window size together (Gemma-3's five window groups read alike):
        # integer bytes, so subtracting their sum is subtracting each
        by_window: dict[int, int] = {}
        for window_tokens, group_bytes_per_token in self.window_groups:
            by_window[window_tokens] = by_window.get(window_tokens, 0) + group_bytes_per_token
        object.__setattr__(self, "_window_reads", tuple(by_window.items()))

    # --- compute -------------------------------------------------------------------------------------

    def prefill_chunk_time_s(self, num_new_tokens: int, num_context_tokens: int = 0) -> float:
        """Compute time of ``num_new_tokens`` new tokens over ``num_context_tokens`` cached ones."""
        c = num_new_tokens
        return (self._linear_flops * c + self._quadratic_flops * c * (num_context_tokens + c)) / self._flops_per_s

    def prefill_time_s(self, num_tokens: int) -> float:
        """Compute time to prefill ``num_tokens`` tokens in one chunk (nothing cached)."""
        return self.prefill_chunk_time_s(num_tokens, 0)

    def step_times_s(
        self, chunks: Sequence[tuple[int, int]], num_decodes: int, kv_read_tokens: int
    ) -> tuple[tuple[float, ...], float]:
        """One step's parts: each prefill chunk's ``(new, context)`` tokens priced alone, and the
        decode pass (the roofline adds them; a profiled model shares the GEMMs out instead)."""
        chunk_times_s = tuple(self.prefill_chunk_time_s(c, p) for c, p in chunks) if chunks else ()
        return chunk_times_s, self.decode_time_s(kv_read_tokens) if num_decodes else 0.0

    def decode_time_s(self, kv_read_tokens: int) -> float:
        """Time of one decode step whose sequences hold ``kv_read_tokens`` KV slots in total."""
        return self._weights_s + kv_read_tokens * self._kv_bytes_per_token / self._kv_bytes_per_s

    def decode_times_s(self, first_kv_read_tokens: int, num_decodes: int, num_steps: int) -> np.ndarray:
        """``num_steps`` consecutive decode steps of the same ``num_decodes`` sequences: each step
        reads one more slot per sequence. Element k equals ``decode_time_s`` of step k exactly."""
        kv = self._kv_bytes_per_token
        if num_decodes == 0:
            return np.full(num_steps, self.decode_time_s(first_kv_read_tokens))
        # the bytes each step reads, (first + n * k) x kv, as one integer progression
        kv_read_bytes = np.arange(
            first_kv_read_tokens * kv, (first_kv_read_tokens + num_decodes * num_steps) * kv, num_decodes * kv, np.int64
        )
        times_s = kv_read_bytes / self._kv_bytes_per_s
        times_s += self._weights_s  # w + bytes / bandwidth: the order decode_time_s adds them in
        return times_s

    def decode_times_list_s(self, first_kv_read_tokens: int, num_decodes: int, num_steps: int) -> list[float]:
        """:meth:`decode_times_s` in plain floats, the same bits step by step (the same integer
        bytes, divided, then the weights added): for the few steps of a short run, where building
        numpy arrays costs more than the arithmetic."""
        kv = self._kv_bytes_per_token
        bytes_per_s, weights_s = self._kv_bytes_per_s, self._weights_s
        kv_read_bytes, step_bytes = first_kv_read_tokens * kv, num_decodes * kv
        if kv_read_bytes + step_bytes * num_steps <= 2**53:
            # NOTE: up to 2^53 every integer is exactly a float, and so is the sum of two: the
            # progression carried in floats divides the same values, without converting an
            # integer of several digits each step
            kv_read_bytes, step_bytes = float(kv_read_bytes), float(step_bytes)
        times_s = []
        for _ in range(num_steps):
            times_s.append(kv_read_bytes / bytes_per_s + weights_s)
            kv_read_bytes += step_bytes
        return times_s

    def windowed_decode_times_s(self, read_tokens: Sequence[int], num_steps: int) -> np.ndarray:
        """Decode steps of sequences whose first step reads ``read_tokens`` tokens each (each step
        one more) on a model with window groups: each window group reads at most its W tokens of a
        sequence. Element k is step k's time; one step priced alone gives the same bits."""
        reads = np.asarray(read_tokens, dtype=np.int64)
        steps = np.arange(num_steps, dtype=np.int64)
        kv = self.model.kv_bytes_per_token
        kv_read_bytes = kv * (int(reads.sum()) + len(reads) * steps)
        for window_tokens, bytes_per_token in self._window_reads:
            kv_read_bytes = kv_read_bytes - bytes_per_token * _tokens_beyond(reads, window_tokens, num_steps)
        times_s = kv_read_bytes / self._kv_bytes_per_s
        times_s += self._weights_s
        return times_s

    def windowed_decode_times_list_s(self, read_tokens: Sequence[int], num_steps: int) -> list[float]:
        """:meth:`windowed_decode_times_s` in plain floats, the same bits (the same integer bytes,
        divided, then the weights added): for a single step or a short run."""
        kv = self.model.kv_bytes_per_token
        num_reads, total_tokens = len(read_tokens), sum(read_tokens)
        unread = [
            (bytes_per_token, _tokens_beyond_list(read_tokens, w, num_steps))
            for w, bytes_per_token in self._window_reads
        ]
        bytes_per_s, weights_s = self._kv_bytes_per_s, self._weights_s
        times_s = []
        for step in range(num_steps):
            kv_read_bytes = kv * (total_tokens + num_reads * step)
            for bytes_per_token, beyond in unread:
                kv_read_bytes -= bytes_per_token * beyond[step]
            times_s.append(kv_read_bytes / bytes_per_s + weights_s)
        return times_s

    def decode_kv_time_s(self, kv_read_bytes: float) -> float:
        """The attention kernel's part of a decode step: reading ``kv_read_bytes`` of KV at the
        calibrated fraction of HBM bandwidth (what a calibration's efficiency scales, alone)."""
        return kv_read_bytes / self._kv_bytes_per_s

    @property
    def weights_time_s(self) -> float:
        """The weight-read part of one decode step, at full HBM bandwidth (never calibrated)."""
        return self._weights_s

    @property
    def prefill_flops_per_s(self) -> float:
        """The FLOP/s a prefill achieves here: the calibration's fit, else the hardware config's."""
        return self._flops_per_s

    def step_overhead_total_s(self, num_steps: int) -> float:
        return num_steps * self.step_overhead_s

    # --- moving KV -----------------------------------------------------------------------------------

    def transfer_time_s(self, transfer: Transfer) -> float:
        """One direction of a swap."""
        hw = self.hardware
        return transfer.num_bytes / hw.host_link_bytes_per_s + transfer.num_runs * hw.host_transfer_overhead_s

    def swap_round_trip_s(self, transfer: Transfer) -> float:
        """Out to host memory and back: what a swap preemption costs in total."""
        return 2.0 * self.transfer_time_s(transfer)

    def copy_time_s(self, num_bytes: int) -> float:
        """A device-to-device copy: every byte read once and written once."""
        return 2.0 * num_bytes / self.hardware.hbm_bandwidth_bytes_per_s

    # --- swap versus recompute ---------------------------------------------------------------------

    def swap_break_even_kv_tokens(self, block_size_tokens: int | None) -> float:
        """KV tokens above which swapping a preempted sequence out and back costs less than
        recomputing its prefill (lecture 10.5, Exercise 4), in closed form.

        With ``S`` KV tokens, recompute costs ``(2N*S + q*S^2) / F`` (``q = 4*L*H*d``) and a swap
        round trip ``2 * (S * kv / W + runs * o)``, with one run per block of ``block_size_tokens``
        (taken as ``S / B``: whole blocks are what is moved) or a single run for a contiguous
        sequence (``block_size_tokens=None``). Recompute grows quadratically and a swap linearly,
        so they cross once: below the break-even recompute is cheaper, above it swapping is.
        0 means swapping is cheaper at every length.
        """
        hw, kv = self.hardware, self.model.kv_bytes_per_token
        quadratic = self._quadratic_flops / self._flops_per_s  # s per token^2
        linear_recompute = self._linear_flops / self._flops_per_s  # s per token
        linear_swap = 2.0 * kv / hw.host_link_bytes_per_s
        if block_size_tokens is None:
            # q S^2 + (b_r - b_s) S - 2 o = 0: one positive root (the fixed overhead favours recompute at S -> 0)
            b = linear_recompute - linear_swap
            c = -2.0 * hw.host_transfer_overhead_s
            return (-b + math.sqrt(b * b - 4.0 * quadratic * c)) / (2.0 * quadratic)
        linear_swap += 2.0 * hw.host_transfer_overhead_s / block_size_tokens
        return max(0.0, (linear_swap - linear_recompute) / quadratic)


def _tokens_beyond(reads: np.ndarray, window_tokens: int, num_steps: int) -> np.ndarray:
    """Per step k < ``num_steps``, the tokens the sequences hold beyond a window (what its group does
    not read): sum over sequences of ``max(0, read + k - W)``, in O(sequences + steps). A sequence
    ``d = read - W`` past the window adds ``d + k`` from step ``max(0, -d)`` on (0 at that step)."""
    past = reads - window_tokens
    start = np.maximum(-past, 0)
    counted = start < num_steps
    per_start = np.zeros(num_steps, dtype=np.int64)
    past_per_start = np.zeros(num_steps, dtype=np.int64)
    np.add.at(per_start, start[counted], 1)
    np.add.at(past_per_start, start[counted], past[counted])
    return np.cumsum(past_per_start) + np.cumsum(per_start) * np.arange(num_steps, dtype=np.int64)


def _tokens_beyond_list(reads: Sequence[int], window_tokens: int, num_steps: int) -> list[int]:
    """:func:`_tokens_beyond` in plain integers."""
    num_counted = past_sum = 0
    entering: dict[int, tuple[int, int]] = {}  # step -> (sequences that start counting, their d)
    for read in reads:
        past = read - window_tokens
        if past >= 0:
            num_counted += 1
            past_sum += past
        elif -past < num_steps:
            count, total = entering.get(-past, (0, 0))
            entering[-past] = (count + 1, total + past)
    beyond = []
    for step in range(num_steps):
        if step in entering:
            count, total = entering[step]
            num_counted += count
            past_sum += total
        beyond.append(past_sum + num_counted * step)
    return beyond
