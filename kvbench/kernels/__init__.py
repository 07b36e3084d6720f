"""Attention-kernel implementations behind the kernel plugins in ``plugins/kernels/``.

Everything here imports torch, triton or flashinfer at module level, so only the plugins'
``decode`` methods and the kernel benchmark import these modules (never the simulator).
"""
