"""``mode=real``: the scheduler's step plans run on a transformers model whose KV cache lives in
tensors placed by the allocator and read by the kernel plugin (see :mod:`.executor`)."""

from kvbench.exec.real.errors import prediction_error
from kvbench.exec.real.executor import RealExecutor

__all__ = ["RealExecutor", "prediction_error"]
