"""``kvbench calibrate``: fit the simulator's efficiency terms to a real run's measured step times.

    kvbench calibrate results/<real run> [more run folders or sweep folders] [--out <folder>]

Each run folder needs its steps table (``steps.parquet`` or ``steps.csv``, written with
``output.steps=true``) holding per-step ``measured_s`` (mode=real), and its ``summary.json`` and
``config.json``. For every row (a step, or a span of ``num_steps`` quiet steps) the model is the
cost model's (kvbench/exec/costmodel.py) with three kinds of unknowns::

    measured_s - decoding * num_steps * weight_bytes / BW - swap_s - copy_s
        = kv_read_bytes / (BW * e_decode[kernel, layout])      # the calibrated KV read
        + prefill_flops / (peak FLOP/s * e_prefill)             # compute-bound prefill
        + num_steps * step_overhead_s                           # launches, sampling, host work

``decoding`` is 1 for a row with decode sequences. The prefill FLOPs are read back from the
plan's predicted ``prefill_s`` (priced at the run's ``hardware.prefill_flops_efficiency``), so
chunked prefill over cached context is counted as the cost model counts it. Weight reads stay at
full bandwidth and swaps and copies at their predicted times: the fit never moves them.

Solved by linear least squares in (1/e_decode per (kernel, layout), 1/e_prefill, overhead); one
file per kernel is written to ``--out`` (default ``kvbench/calibrations/<hardware>/``), with the
fit's provenance (command, commit, date) and residuals. Bad input is one line (ConfigError).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.errors import ConfigError

REQUIRED_STEP_COLUMNS = ("measured_s", "num_steps", "num_decode_seqs", "kv_read_bytes", "prefill_s", "swap_s", "copy_s")


@dataclass(frozen=True)
class RunData:
    folder: Path
    hardware: str
    kernel: str
    #: the calibration file's efficiency key: a block size in tokens, or "contiguous"
    layout: str
    hbm_bandwidth_bytes_per_s: float
    dense_flops_per_s: float
    prefill_flops_efficiency: float
    weight_bytes: float
    steps: object  # a pandas.DataFrame


@dataclass(frozen=True)
class Fit:
    hardware: str
    #: (kernel, layout) -> fitted fraction of HBM bandwidth on KV reads
    decode_efficiency: dict[tuple[str, str], float]
    prefill_flops_efficiency: float | None
    step_overhead_s: float
    num_rows: int
    #: median and p90 of |predicted - measured| / measured over the rows, with the fitted terms
    relative_error_p50: float
    relative_error_p90: float


def _run_folders(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise ConfigError(f"kvbench calibrate: {folder} is not a folder: give a real run's results folder")
    if (folder / "steps.parquet").is_file() or (folder / "steps.csv").is_file():
        return [folder]
    runs = sorted(p.parent for p in folder.glob("*/steps.parquet")) or sorted(p.parent for p in folder.glob("*/steps.csv"))
    if not runs:
        raise ConfigError(f"kvbench calibrate: {folder} has no steps table (steps.parquet): run mode=real with output.steps=true")
    return runs


def _is_contiguous(allocator_name: str) -> bool:
    try:
        from kvbench.plugins import lookup

        caps = getattr(lookup("allocator", allocator_name), "capabilities", None)
    except (ConfigError, LookupError, ImportError):  # an allocator this install lacks: read as paged
        return False
    return bool(getattr(caps, "contiguous_layout", False))


def load_run(folder: Path) -> RunData:
    import pandas as pd

    steps_path = folder / "steps.parquet"
    steps = pd.read_parquet(steps_path) if steps_path.is_file() else pd.read_csv(folder / "steps.csv")
    if "measured_s" not in steps or steps["measured_s"].isna().all():
        raise ConfigError(f"kvbench calibrate: {folder} has no measured step times (no measured_s in its steps table): "
                          "calibrate from a mode=real run")  # fmt: skip
    missing = [c for c in REQUIRED_STEP_COLUMNS if c not in steps]
    if missing:
        raise ConfigError(f"kvbench calibrate: {folder}'s steps table lacks {', '.join(missing)}: rerun it with this kvbench")
    try:
        summary = json.loads((folder / "summary.json").read_text())
        config = json.loads((folder / "config.json").read_text())
        hw = config["hardware"]
        contiguous = summary.get("layout") == "contiguous" or _is_contiguous(str(config["allocator"]["name"]))
        return RunData(
            folder=folder,
            hardware=str(summary["hardware"]),
            kernel=str(summary["kernel"]),
            layout="contiguous" if contiguous else str(int(summary["block_size_tokens"])),
            hbm_bandwidth_bytes_per_s=float(hw["hbm_bandwidth_bytes_per_s"]),
            dense_flops_per_s=float(hw["dense_flops_per_s"]),
            prefill_flops_efficiency=float(summary.get("prefill_flops_efficiency", hw["prefill_flops_efficiency"])),
            weight_bytes=float(summary["weight_bytes"]),
            steps=steps[steps["measured_s"].notna()],
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"kvbench calibrate: {folder} is not a complete run folder (summary.json, config.json): "
                          f"{type(exc).__name__}: {exc}") from None  # fmt: skip


def fit(runs: list[RunData]) -> Fit:
    """Least-squares fit of the decode efficiency per (kernel, layout), the prefill FLOP efficiency
    and the per-step overhead over every measured row of ``runs`` (all on one hardware)."""
    hardware = {r.hardware for r in runs}
    if len(hardware) != 1:
        raise ConfigError(f"kvbench calibrate: the runs are on several hardware configs ({', '.join(sorted(hardware))}): "
                          "calibrate one hardware at a time")  # fmt: skip
    groups = sorted({(r.kernel, r.layout) for r in runs})
    columns, targets = [], []
    for r in runs:
        s, bw = r.steps, r.hbm_bandwidth_bytes_per_s
        n = s["num_steps"].to_numpy(float)
        decoding = (s["num_decode_seqs"].to_numpy(float) > 0).astype(float)
        kv_s = s["kv_read_bytes"].to_numpy(float) / bw  # KV read time at full bandwidth
        flops_s = s["prefill_s"].to_numpy(float) * r.prefill_flops_efficiency  # prefill FLOPs / peak FLOP/s
        fixed_s = decoding * n * r.weight_bytes / bw + s["swap_s"].to_numpy(float) + s["copy_s"].to_numpy(float)
        block = np.zeros((len(s), len(groups) + 2))
        block[:, groups.index((r.kernel, r.layout))] = kv_s
        block[:, -2] = flops_s
        block[:, -1] = n
        columns.append(block)
        targets.append(s["measured_s"].to_numpy(float) - fixed_s)
    a, y = np.concatenate(columns), np.concatenate(targets)
    used = np.abs(a).sum(axis=0) > 0  # a run without prefill rows cannot fit the prefill term
    for i, g in enumerate(groups):
        if not used[i]:
            raise ConfigError(f"kvbench calibrate: kernel={g[0]} layout={g[1]} has no decode step that read KV: nothing to fit")
    if not used[-1]:
        raise ConfigError("kvbench calibrate: no measured steps")
    # scale columns to unit norm so seconds and step counts condition alike
    scale = np.where(used, np.linalg.norm(a, axis=0), 1.0)
    design = a[:, used] / scale[used]
    if np.linalg.matrix_rank(design) < design.shape[1]:
        raise ConfigError("kvbench calibrate: the steps cannot separate KV read time from per-step overhead "
                          "(too few distinct steps, or all read the same KV): calibrate from runs with growing contexts or several batches")  # fmt: skip
    solution, *_ = np.linalg.lstsq(design, y, rcond=None)
    x = np.zeros(a.shape[1])
    x[used] = solution / scale[used]
    decode = {}
    for i, g in enumerate(groups):
        if x[i] <= 0:
            raise ConfigError(f"kvbench calibrate: kernel={g[0]} layout={g[1]}: the fit gives KV reads no time "
                              f"(1/efficiency={x[i]:.3g}): the measured times do not grow with KV read")  # fmt: skip
        decode[g] = 1.0 / x[i]
    prefill = None
    if used[-2]:
        if x[-2] <= 0:
            raise ConfigError(f"kvbench calibrate: the fit gives prefill no time (1/efficiency={x[-2]:.3g})")
        prefill = 1.0 / x[-2]
    truth = np.concatenate([r.steps["measured_s"].to_numpy(float) for r in runs])
    predicted = a @ x + (truth - y)  # the fitted terms plus the fixed ones
    rel = np.abs(predicted - truth) / np.where(truth > 0, truth, np.inf)
    return Fit(hardware.pop(), decode, prefill, float(x[-1]), len(y), float(np.median(rel)), float(np.quantile(rel, 0.9)))


def write_fit(result: Fit, out_dir: Path, command: str) -> list[Path]:
    """One calibration file per kernel in ``out_dir`` (a ``<calibrations>/<hardware>/`` folder)."""
    from kvbench.app.provenance import kvbench_commit
    from kvbench.exec.calibration import write_calibration

    provenance = {"command": command, "commit": kvbench_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    fitted = {"step_overhead_s": result.step_overhead_s}
    if result.prefill_flops_efficiency is not None:
        fitted["prefill_flops_efficiency"] = result.prefill_flops_efficiency
    written = []
    for kernel in sorted({k for k, _ in result.decode_efficiency}):
        table = {layout: e for (k, layout), e in result.decode_efficiency.items() if k == kernel}
        path = write_calibration(out_dir / f"{kernel}.json", result.hardware, kernel, table,
                                 {**provenance, "fit_rows": result.num_rows,
                                  "fit_relative_error_p50": result.relative_error_p50,
                                  "fit_relative_error_p90": result.relative_error_p90}, **fitted)  # fmt: skip
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    args_in = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="kvbench calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="real run folders (or sweep folders of them)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for <kernel>.json (default: kvbench/calibrations/<hardware>/)")  # fmt: skip
    args = parser.parse_args(args_in)
    try:
        runs = [load_run(f) for folder in args.runs for f in _run_folders(folder)]
        result = fit(runs)
        from kvbench.exec.calibration import CALIBRATION_DIR

        out_dir = args.out if args.out is not None else CALIBRATION_DIR / result.hardware
        written = write_fit(result, out_dir, shlex.join(["kvbench", "calibrate", *args_in]))
    except ConfigError as exc:
        print(f"kvbench calibrate: error: {exc}".replace("kvbench calibrate: error: kvbench calibrate: ", "kvbench calibrate: error: "),
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2) from None
    for (kernel, layout), e in sorted(result.decode_efficiency.items()):
        print(f"{result.hardware} {kernel} [{layout}]: decode efficiency {e:.4f}")
    if result.prefill_flops_efficiency is not None:
        print(f"prefill FLOP efficiency {result.prefill_flops_efficiency:.4f}")
    print(f"step overhead {result.step_overhead_s * 1e6:.2f} us; fit over {result.num_rows} rows, "
          f"relative error p50 {result.relative_error_p50:.2%} p90 {result.relative_error_p90:.2%}")
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
