"""The ``torch`` kernel: kvbench's reference decode attention (:mod:`kvbench.kernels.reference`)
behind the kernel interface, so that real mode and the kernel benchmark can select it by name."""

from __future__ import annotations

from kvbench import hookimpl
from kvbench.errors.extras import install_hint
from kvbench.kernels.kernel import Kernel
from kvbench.kernels.reference import paged_decode_reference


class TorchKernel(Kernel):
    """``kernel=torch``: the gather-then-softmax reference; runs anywhere torch runs."""

    name = "torch"
    requires_cuda = False

    @classmethod
    def unavailable_reason(cls, device_type: str) -> str | None:
        """Why real mode cannot run this kernel on ``device_type``, or None (torch runs anywhere)."""
        try:
            import torch  # noqa: F401
        except ImportError:
            return f"kernel=torch needs the torch package: {install_hint('kernels')}"
        return None

    def plan_decode(self, query, key_cache, value_cache, block_tables, seq_lens, scale: float | None = None):
        """A zero-argument callable computing the decode (the reference has no metadata to prepare)."""
        return lambda: paged_decode_reference(query, key_cache, value_cache, block_tables, seq_lens, scale)

    def decode(self, query, key_cache, value_cache, block_tables, seq_lens, scale: float | None = None):
        return paged_decode_reference(query, key_cache, value_cache, block_tables, seq_lens, scale)


@hookimpl
def kvbench_register_kernels():
    return [TorchKernel]
