"""Calibration files: decode efficiency per (hardware, kernel, block size), measured on a GPU.

A file ``kvbench/calibrations/<hardware>/<kernel>.json`` looks like::

    {
      "hardware": "h100-sxm", "kernel": "triton",
      "measured_on": "NVIDIA H200 ...", "command": "kvbench bench-kernels ...",
      "efficiency": {"contiguous": 0.91, "8": 0.62, "16": 0.78, "32": 0.85, ...},
      "provenance": {"command": "kvbench calibrate ...", "commit": "<git commit>", "date": "..."},
      "prefill_flops_efficiency": 0.55, "step_overhead_s": 4e-05          (optional: kvbench calibrate)
    }

Keys: the folder is the hardware config's name, the file the kernel plugin's name, and each
efficiency entry a layout: a block size in tokens (paged) or ``"contiguous"`` (one block per
sequence). An efficiency applies to the KV bytes the decode kernel reads, never to the weight
reads (other kernels read those): the decode time is ``weight bytes / bandwidth + KV bytes /
(bandwidth * efficiency)`` (kvbench/exec/costmodel.py). ``prefill_flops_efficiency`` (replaces the
hardware config's) and ``step_overhead_s`` (a fixed cost per step) are fitted from a real run by
``kvbench calibrate`` (kvbench/calibrate.py) and read by :func:`load_calibration`.

where each efficiency is the kernel's achieved bytes/s divided by the hardware config's HBM
bandwidth, so that the simulator's decode time ``bytes / (bandwidth * efficiency)`` reproduces the
measurement. A block size between two measured ones is interpolated linearly in log2(block size);
outside the measured range the nearest measurement is used, and the source string says so.

``calibration_dir`` (a top-level option) replaces ``kvbench/calibrations/`` with a folder of the
same layout, e.g. the ``calibrations/`` a ``kvbench bench-kernels`` run wrote. A file that is not
valid JSON, not an object, not a file, or holds an efficiency outside [0.001, 1] is a one-line
ConfigError.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import ConfigError

CALIBRATION_DIR = Path(__file__).resolve().parents[1] / "calibrations"  # kvbench/calibrations/
#: the lowest efficiency a calibration may hold: a kernel reaching under 0.1 % of HBM bandwidth (or
#: of peak FLOP/s) is a failed measurement, and at 1e-300 every step time would overflow to inf
MIN_EFFICIENCY = 1e-3


@dataclass(frozen=True)
class DecodeEfficiency:
    efficiency: float
    #: "uncalibrated", or the calibration file and how the value was read from it
    source: str

    @property
    def calibrated(self) -> bool:
        return self.source != "uncalibrated"


UNCALIBRATED = DecodeEfficiency(1.0, "uncalibrated")


def _read(path: Path) -> dict[str, float]:
    """The file's validated efficiency table."""
    return _read_doc(path)["efficiency"]


def _read_doc(path: Path) -> dict:
    """The file's validated contents: ``efficiency`` and the optional fitted terms. Cached per (path, modification time, size), so a file
    rewritten on disk (by ``kvbench bench-kernels``, or a test) is read again, not served stale."""
    stat = path.stat()
    return _read_cached(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _read_cached(path: Path, mtime_ns: int, size_bytes: int) -> dict:
    from kvbench.io.textio import read_json

    return _validate(read_json(path, "calibration file"), path)


def _validate(doc, path: Path) -> dict:
    """The validated efficiency table and fitted terms of a file's parsed contents ``doc``."""
    if not isinstance(doc, dict):
        raise ConfigError(
            f"calibration file {path} holds a JSON {type(doc).__name__}, not an object with an "
            '"efficiency" table: see kvbench/specs/calibration.py for the format'
        )
    table = doc.get("efficiency", {})
    if not isinstance(table, dict):
        raise ConfigError(
            f"calibration file {path}: efficiency={table!r} is invalid: use an object "
            '{"<block size>": <efficiency>, "contiguous": <efficiency>}'
        )
    for key, value in table.items():
        if not (key == "contiguous" or (key.isdigit() and int(key) >= 1)):
            raise ConfigError(
                f"calibration file {path}: efficiency entry {key!r} is invalid: "
                'use a block size in tokens ("16") or "contiguous"'
            )
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and MIN_EFFICIENCY <= value <= 1):
            raise ConfigError(
                f"calibration file {path}: efficiency[{key!r}]={value!r} is invalid: use a fraction in "
                f"[{MIN_EFFICIENCY:g}, 1], the achieved bandwidth over the hardware config's hbm_bandwidth_bytes_per_s "
                "(above 1: that bandwidth is too low for this GPU; below 0.001: a failed measurement)"
            )
    out: dict = {"efficiency": {key: float(value) for key, value in table.items()}}
    for key, low, high, hint in (
        ("prefill_flops_efficiency", MIN_EFFICIENCY, 1.0, f"a fraction in [{MIN_EFFICIENCY:g}, 1]"),
        ("step_overhead_s", 0.0, 1.0, "seconds in [0, 1]"),
    ):
        if key not in doc:
            continue
        value = doc[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = number and math.isfinite(value) and low <= value <= high
        if not ok:
            raise ConfigError(f"calibration file {path}: {key}={value!r} is invalid: use {hint}")
        out[key] = float(value)
    return out


def _exists(path: Path) -> bool:
    """Whether a calibration file is there; something else under its name (a folder, a FIFO) is a
    ConfigError, not "uncalibrated": the run would silently ignore what the user put there."""
    if path.is_file():
        return True
    if path.exists():
        raise ConfigError(
            f"calibration file {path} is not a file (a folder or a device): replace it with a "
            "<kernel>.json calibration file or remove it"
        )
    return False


def calibration_path(hardware_name: str, kernel_name: str, calibration_dir: Path | str | None = None) -> Path:
    """Where the efficiencies of ``kernel_name`` on ``hardware_name`` are (``calibration_dir``: the
    user's folder; None: kvbench's own)."""
    root = CALIBRATION_DIR if calibration_dir is None else Path(calibration_dir)
    return root / hardware_name / f"{kernel_name}.json"


def calibration_digest(hardware_name: str, kernel_name: str, calibration_dir: Path | str | None = None) -> str:
    """The first 16 hex digits of the SHA-256 of the calibration file a run reads ("" without one):
    recorded with every result, so that a sweep resumed after the file changed re-runs its jobs."""
    import hashlib

    path = calibration_path(hardware_name, kernel_name, calibration_dir)
    if not _exists(path):
        return ""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError as exc:
        raise ConfigError(f"calibration file {path} cannot be read: {exc.strerror or exc}") from None


def load_decode_efficiency(
    hardware_name: str,
    kernel_name: str,
    block_size_tokens: int,
    contiguous: bool = False,
    calibration_dir: Path | str | None = None,
) -> DecodeEfficiency:
    path = calibration_path(hardware_name, kernel_name, calibration_dir)
    if not _exists(path):
        return UNCALIBRATED
    table = _read(path)
    # the source names the file as result rows show it: relative for kvbench's own, in full otherwise
    rel = f"{hardware_name}/{kernel_name}.json" if calibration_dir is None else str(path)
    if contiguous and "contiguous" in table:
        return DecodeEfficiency(table["contiguous"], f"{rel}[contiguous]")
    measured = sorted((int(k), v) for k, v in table.items() if k.isdigit())
    if not measured:
        return UNCALIBRATED
    if str(block_size_tokens) in table:
        return DecodeEfficiency(table[str(block_size_tokens)], f"{rel}[{block_size_tokens}]")
    if block_size_tokens <= measured[0][0]:
        return DecodeEfficiency(measured[0][1], f"{rel}[nearest {measured[0][0]}]")
    if block_size_tokens >= measured[-1][0]:
        return DecodeEfficiency(measured[-1][1], f"{rel}[nearest {measured[-1][0]}]")
    for (b0, e0), (b1, e1) in zip(measured, measured[1:]):
        if b0 < block_size_tokens < b1:
            t = (math.log2(block_size_tokens) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
            return DecodeEfficiency(e0 + t * (e1 - e0), f"{rel}[log2-interpolated {b0}..{b1}]")
    return UNCALIBRATED


@dataclass(frozen=True)
class Calibration:
    """Everything a calibration file says about one (hardware, kernel, layout) point."""

    decode: DecodeEfficiency
    #: the fitted fraction of peak FLOP/s a prefill achieves; None: the hardware config's
    prefill_flops_efficiency: float | None = None
    #: the fitted fixed cost of one step (launches, sampling, Python); 0.0 when not fitted
    step_overhead_s: float = 0.0


def load_fitted_terms(
    hardware_name: str, kernel_name: str, calibration_dir: Path | str | None = None
) -> tuple[float | None, float]:
    """A calibration file's fitted prefill FLOP efficiency (None: not fitted, the hardware config's
    applies) and per-step overhead in seconds (0.0: not fitted); (None, 0.0) without a file."""
    path = calibration_path(hardware_name, kernel_name, calibration_dir)
    if not _exists(path):
        return None, 0.0
    doc = _read_doc(path)
    return doc.get("prefill_flops_efficiency"), doc.get("step_overhead_s", 0.0)


def load_calibration(
    hardware_name: str,
    kernel_name: str,
    block_size_tokens: int,
    contiguous: bool = False,
    calibration_dir: Path | str | None = None,
) -> Calibration:
    """The decode efficiency (as :func:`load_decode_efficiency`) with the file's fitted prefill
    efficiency and per-step overhead, when it has them."""
    decode = load_decode_efficiency(hardware_name, kernel_name, block_size_tokens, contiguous, calibration_dir)
    return Calibration(decode, *load_fitted_terms(hardware_name, kernel_name, calibration_dir))


def write_calibration(
    path: Path,
    hardware_name: str,
    kernel_name: str,
    efficiency: dict[str, float],
    provenance: dict[str, str | None],
    **fitted: float,
) -> Path:
    """Write (or update) a calibration file: entries of ``efficiency`` replace the same layouts in
    an existing file, other layouts are kept; ``provenance`` (command, commit, date) and the
    ``fitted`` terms (prefill_flops_efficiency, step_overhead_s) replace the file's."""
    from kvbench.io.atomic import check_target, write_json
    from kvbench.io.textio import read_json

    # a FIFO there would block the read below, a device or a folder be replaced by the write
    check_target(path, "remove it or write the calibration elsewhere with --out <folder>")
    doc: dict = {"hardware": hardware_name, "kernel": kernel_name, "efficiency": {}}
    if _exists(path):
        old = read_json(path, "calibration file to update")
        if isinstance(old, dict):
            doc.update(old)
            doc["efficiency"] = dict(old.get("efficiency") or {})
    doc["efficiency"].update({str(k): float(v) for k, v in efficiency.items()})
    doc["provenance"] = dict(provenance)
    doc.update({k: float(v) for k, v in fitted.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    _validate(doc, path)  # what is written must be readable: a fit outside (0, 1] fails here, in one line
    write_json(path, doc)
    return path
