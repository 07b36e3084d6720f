"""The attention-kernel interface: a cost in ``sim`` mode, a computation in ``real`` mode.

In ``sim`` mode a kernel contributes its decode *efficiency*: the fraction of the hardware's HBM
bandwidth it achieves when decode attention reads a paged cache of a given block size, taken from
a calibration file measured on a GPU (``kvbench/calibrations/<hardware>/<kernel>.json``, written by
the kernel benchmark). Without one the efficiency is 1.0 and every result row says
``uncalibrated``: kvbench never invents an efficiency.

In ``real`` mode :meth:`Kernel.decode` computes one decode step of attention over a paged cache:
query ``[B, H, D]``, key and value caches ``[num_blocks, block_size, H_kv, D]``, block tables
``[B, max_blocks]`` int32 and sequence lengths ``[B]``, returning ``[B, H, D]``. A contiguous cache
is the same call with one block per sequence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from kvbench.specs.calibration import DecodeEfficiency, load_decode_efficiency


class Kernel:
    """A kernel plugin. Subclasses set ``name`` and implement :meth:`decode` for real mode."""

    name: ClassVar[str]
    Config: ClassVar[type | None] = None
    #: True when the kernel can only run on an NVIDIA GPU (real mode on a CPU is refused clearly)
    requires_cuda: ClassVar[bool] = False

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def decode_efficiency(
        self, hardware_name: str, block_size_tokens: int, contiguous: bool, *, calibration_dir: Path | None = None
    ) -> DecodeEfficiency:
        """The calibrated decode efficiency for this kernel on ``hardware_name`` (1.0, uncalibrated, if none),
        read from ``calibration_dir`` (the top-level option) or, when None, kvbench's own calibrations."""
        return load_decode_efficiency(hardware_name, self.name, block_size_tokens, contiguous, calibration_dir)

    @classmethod
    def unavailable_reason(cls, device_type: str) -> str | None:
        """Why real mode cannot run this kernel on ``device_type`` ("cpu", "cuda"), or None.

        The default: a kernel that ``requires_cuda`` needs a CUDA device.
        """
        if cls.requires_cuda and device_type != "cuda":
            return f"kernel={cls.name} needs a CUDA GPU"
        return None

    def plan_decode(self, query, key_cache, value_cache, block_tables, seq_lens, scale: float | None = None):
        """Prepare a decode (metadata, launch grids) and return a zero-argument callable that runs it,
        so that benchmarks time planning apart from the kernel. The default has nothing to prepare."""
        return lambda: self.decode(query, key_cache, value_cache, block_tables, seq_lens, scale)

    def decode(self, query, key_cache, value_cache, block_tables, seq_lens, scale: float | None = None):
        """One decode step of attention over a paged cache (see the module docstring)."""
        raise NotImplementedError(f"kernel {self.name!r} has no real-mode implementation yet")
