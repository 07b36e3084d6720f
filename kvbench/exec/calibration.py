"""Calibration files: decode efficiency per (hardware, kernel, block size), measured on a GPU.

A file ``kvbench/calibrations/<hardware>/<kernel>.json`` looks like::

    {
      "hardware": "h100-sxm", "kernel": "triton",
      "measured_on": "NVIDIA H200 ...", "command": "kvbench bench-kernels ...",
      "efficiency": {"contiguous": 0.91, "8": 0.62, "16": 0.78, "32": 0.85, ...}
    }

where each efficiency is the kernel's achieved bytes/s divided by the hardware config's HBM
bandwidth, so that the simulator's decode time ``bytes / (bandwidth * efficiency)`` reproduces the
measurement. A block size between two measured ones is interpolated linearly in log2(block size);
outside the measured range the nearest measurement is used, and the source string says so.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

CALIBRATION_DIR = Path(__file__).parent / "calibrations"


@dataclass(frozen=True)
class DecodeEfficiency:
    efficiency: float
    #: "uncalibrated", or the calibration file and how the value was read from it
    source: str

    @property
    def calibrated(self) -> bool:
        return self.source != "uncalibrated"


UNCALIBRATED = DecodeEfficiency(1.0, "uncalibrated")


@functools.lru_cache(maxsize=None)
def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def calibration_path(hardware_name: str, kernel_name: str) -> Path:
    return CALIBRATION_DIR / hardware_name / f"{kernel_name}.json"


def load_decode_efficiency(
    hardware_name: str, kernel_name: str, block_size_tokens: int, contiguous: bool = False
) -> DecodeEfficiency:
    path = calibration_path(hardware_name, kernel_name)
    if not path.is_file():
        return UNCALIBRATED
    table: dict = _read(path).get("efficiency", {})
    rel = f"{hardware_name}/{kernel_name}.json"
    if contiguous and "contiguous" in table:
        return DecodeEfficiency(float(table["contiguous"]), f"{rel}[contiguous]")
    measured = sorted((int(k), float(v)) for k, v in table.items() if k.isdigit())
    if not measured:
        return UNCALIBRATED
    if str(block_size_tokens) in table:
        return DecodeEfficiency(float(table[str(block_size_tokens)]), f"{rel}[{block_size_tokens}]")
    if block_size_tokens <= measured[0][0]:
        return DecodeEfficiency(measured[0][1], f"{rel}[nearest {measured[0][0]}]")
    if block_size_tokens >= measured[-1][0]:
        return DecodeEfficiency(measured[-1][1], f"{rel}[nearest {measured[-1][0]}]")
    for (b0, e0), (b1, e1) in zip(measured, measured[1:]):
        if b0 < block_size_tokens < b1:
            t = (math.log2(block_size_tokens) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
            return DecodeEfficiency(e0 + t * (e1 - e0), f"{rel}[log2-interpolated {b0}..{b1}]")
    return UNCALIBRATED
