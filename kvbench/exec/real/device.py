"""Where a real run's steps were measured, in words: the summary's ``measured_on``.

``"cuda: NVIDIA H100 80GB HBM3"`` or ``"cpu: AMD EPYC 7763 64-Core Processor"``: the torch device
type, then the chip's name. ``kvbench calibrate`` reads the part before the colon to tell a GPU's
timings from a CPU's (a CPU's would otherwise be fitted and filed under the hardware config's GPU
name); the name is for a reader, recorded as the machine reported it.
"""

from __future__ import annotations

import platform


def measured_on(device) -> str:
    """``"<device type>: <chip name>"`` for a torch device (``device.type`` is enough)."""
    if device.type == "cuda":
        import torch

        return f"cuda: {torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        return f"cpu: {cpu_name()}"
    return f"{device.type}: {device}"


def cpu_name() -> str:
    """The CPU's model name as the OS reports it (Linux: /proc/cpuinfo), else Python's best guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                # x86 says "model name"; some ARM kernels say only "Hardware" or "Model"
                if key.strip() in ("model name", "Hardware", "Model") and value.strip():
                    return " ".join(value.split())
    except OSError:  # not Linux, or /proc not mounted
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
