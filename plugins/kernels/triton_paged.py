"""``kernel=triton``: kvbench's own flash-decoding paged kernel (source in :mod:`kvbench.kernels.triton_decode`).

Where it runs (``requires_cuda = False``, because of the second line):

- on a CUDA GPU, compiled;
- on CPU only through Triton's interpreter, in a process started with ``TRITON_INTERPRET=1``
  (seconds per call: for tests and tiny real-mode runs);
- anywhere else ``decode`` refuses with one line (a :class:`~kvbench.errors.ConfigError`) instead
  of Triton's own driver errors.

In ``sim`` mode it only supplies its calibrated efficiency, and importing this module costs nothing:
torch and triton are imported inside the methods.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from kvbench import hookimpl
from kvbench.errors import ConfigError, require
from kvbench.errors.extras import install_hint
from kvbench.kernels.kernel import Kernel


@dataclass
class TritonConfig:
    #: tokens each program loads per loop step; independent of the cache's block size
    #: (a power of two >= 16, since tl.dot needs K >= 16)
    tile_tokens: int = 64
    #: programs per (sequence, KV head), merged by log-sum-exp; 0 = enough for ~4 programs per SM
    num_splits: int = 0
    #: with num_splits=0, no split shorter than this (each split costs a partial write and a merge read)
    min_tokens_per_split: int = 128
    #: warps per program of the split kernel
    num_warps: int = 8
    #: software-pipelining depth of the split kernel's loop
    num_stages: int = 2

    def validate(self) -> None:
        t = self.tile_tokens
        require(t >= 16 and t & (t - 1) == 0, "kernel.tile_tokens", t, "use a power of two >= 16")
        require(self.num_splits >= 0, "kernel.num_splits", self.num_splits, "use 0 (auto) or a positive integer")
        require(self.min_tokens_per_split >= 1, "kernel.min_tokens_per_split", self.min_tokens_per_split, "use >= 1")
        require(self.num_warps in (1, 2, 4, 8, 16), "kernel.num_warps", self.num_warps, "use 1, 2, 4, 8 or 16")
        require(self.num_stages >= 1, "kernel.num_stages", self.num_stages, "use an integer >= 1")


class TritonKernel(Kernel):
    """Paged decode attention in Triton: split-K over programs, log-sum-exp merge, GQA grouping."""

    name = "triton"
    Config = TritonConfig
    requires_cuda = False  # it also runs on CPU through Triton's interpreter (TRITON_INTERPRET=1)

    @classmethod
    def unavailable_reason(cls, device_type: str) -> str | None:
        """Why real mode cannot run this kernel on ``device_type`` ("cuda" or "cpu"), or None if it can."""
        try:
            import triton  # noqa: F401
        except ImportError:
            return f"kernel=triton needs the triton package: {install_hint('kernels')}"
        if device_type == "cuda":
            return None
        from kvbench.kernels.triton_decode import interpreter_active

        if interpreter_active():
            return None
        if os.environ.get("TRITON_INTERPRET") == "1":
            return (
                "kernel=triton on CPU: TRITON_INTERPRET=1 was set after triton was imported; "
                "set it before starting Python"
            )
        return (
            f"kernel=triton in real mode needs a CUDA GPU (tensors are on {device_type}); on CPU it runs "
            "only through Triton's interpreter: start Python with TRITON_INTERPRET=1 (slow, for tests)"
        )

    def _options(self) -> dict:
        # the config's fields are plan_launch's keywords, one to one
        return dataclasses.asdict(self.config or TritonConfig())

    def plan_decode(self, query, key_cache, value_cache, block_tables, seq_lens, scale: float | None = None):
        """Check inputs, pick the split and allocate buffers; return a zero-argument callable that launches.

        Lets the kernel benchmark time the metadata preparation apart from the kernel itself.
        """
        reason = self.unavailable_reason(query.device.type)
        if reason:
            raise ConfigError(reason)
        from kvbench.kernels import triton_decode

        plan = triton_decode.plan_launch(
            query,
            key_cache,
            value_cache,
            block_tables,
            seq_lens,
            scale,
            interpret=triton_decode.interpreter_active(),
            **self._options(),
        )
        triton_decode.kernels(plan.interpret)  # build the kernel objects now, not inside the timed call
        return lambda: triton_decode.launch(plan)

    def decode(self, query, key_cache, value_cache, block_tables, seq_lens, scale: float | None = None):
        return self.plan_decode(query, key_cache, value_cache, block_tables, seq_lens, scale)()


@hookimpl
def kvbench_register_kernels():
    return [TritonKernel]
