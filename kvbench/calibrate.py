"""Fitting the simulator's efficiency terms to a real run's measured step times (the command is
``kvbench calibrate``, :mod:`kvbench.commands.calibrate`).

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
file per kernel is written to ``<out>/<hardware>/<kernel>.json`` (``--out``, default
``results/calibrations``: the layout ``calibration_dir=<out>`` reads), with the fit's provenance
(command, commit, date) and residuals. The hardware and kernel names come from the runs'
``summary.json``, so they are checked like config names before they become a path, and the file
is written only under ``--out``: never into the installed package, never elsewhere. Bad input is
one line (ConfigError), exit 2; an interrupt one line, exit 130/143.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.errors import ConfigError
from kvbench.specs.names import require_name
from kvbench.textio import read_json_object

#: where ``kvbench calibrate`` writes unless told (``--out``): a calibration folder of the results area
DEFAULT_OUT = Path("results") / "calibrations"
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


def run_folders(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise ConfigError(f"kvbench calibrate: {folder} is not a folder: give a real run's results folder")
    if (folder / "steps.parquet").is_file() or (folder / "steps.csv").is_file():
        return [folder]
    runs = sorted(p.parent for p in folder.glob("*/steps.parquet")) or sorted(
        p.parent for p in folder.glob("*/steps.csv")
    )
    if not runs:
        raise ConfigError(
            f"kvbench calibrate: {folder} has no steps table (steps.parquet): run mode=real with output.steps=true"
        )
    return runs


def _is_contiguous(allocator_name: str) -> bool:
    try:
        from kvbench.plugins import lookup

        caps = getattr(lookup("allocator", allocator_name), "capabilities", None)
    except (ConfigError, LookupError, ImportError):  # an allocator this install lacks: read as paged
        return False
    return bool(getattr(caps, "contiguous_layout", False))


def _read_steps(folder: Path):
    import pandas as pd

    steps_path = folder / "steps.parquet"
    path = steps_path if steps_path.is_file() else folder / "steps.csv"
    try:
        return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow's and pandas' errors for a damaged table share no base
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(
            f"kvbench calibrate: {path} cannot be read as a table ({type(exc).__name__}: {detail}); re-run the real run"
        ) from None


def load_run(folder: Path) -> RunData:
    from kvbench.atomic import check_complete
    from kvbench.output.results import RESULT_FILES

    problem = check_complete(folder, RESULT_FILES)
    if problem is not None:  # an interrupted or altered run: its steps may be half a run
        raise ConfigError(f"kvbench calibrate: {folder} is not a complete run: {problem}; re-run it")
    steps = _read_steps(folder)
    if "measured_s" not in steps or steps["measured_s"].isna().all():
        raise ConfigError(
            f"kvbench calibrate: {folder} has no measured step times (no measured_s in its steps table): "
            "calibrate from a mode=real run"
        )
    missing = [c for c in REQUIRED_STEP_COLUMNS if c not in steps]
    if missing:
        raise ConfigError(
            f"kvbench calibrate: {folder}'s steps table lacks {', '.join(missing)}: rerun it with this kvbench"
        )
    summary = read_json_object(folder / "summary.json", "kvbench calibrate: run summary")
    config = read_json_object(folder / "config.json", "kvbench calibrate: run config")
    try:
        hw = config["hardware"]
        # both become parts of the calibration file's path: checked as config names are
        hardware, kernel = summary["hardware"], summary["kernel"]
        require_name(f"{folder / 'summary.json'}: hardware", hardware)
        require_name(f"{folder / 'summary.json'}: kernel", kernel)
        contiguous = summary.get("layout") == "contiguous" or _is_contiguous(str(config["allocator"]["name"]))
        numbers = {
            "hbm_bandwidth_bytes_per_s": float(hw["hbm_bandwidth_bytes_per_s"]),
            "dense_flops_per_s": float(hw["dense_flops_per_s"]),
            "prefill_flops_efficiency": float(summary.get("prefill_flops_efficiency", hw["prefill_flops_efficiency"])),
            "weight_bytes": float(summary["weight_bytes"]),
        }
        bad = [key for key, value in numbers.items() if not (np.isfinite(value) and value > 0)]
        if bad:
            raise ConfigError(f"{bad[0]}={numbers[bad[0]]!r} is not a positive number")
        layout = "contiguous" if contiguous else str(int(summary["block_size_tokens"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        raise ConfigError(
            f"kvbench calibrate: {folder} is not a complete run folder (summary.json, config.json): {detail}"
        ) from None
    return RunData(
        folder=folder,
        hardware=hardware,
        kernel=kernel,
        layout=layout,
        steps=steps[steps["measured_s"].notna()],
        **numbers,
    )


def fit(runs: list[RunData]) -> Fit:
    """Least-squares fit of the decode efficiency per (kernel, layout), the prefill FLOP efficiency
    and the per-step overhead over every measured row of ``runs`` (all on one hardware)."""
    hardware = {r.hardware for r in runs}
    if len(hardware) != 1:
        raise ConfigError(
            f"kvbench calibrate: the runs are on several hardware configs ({', '.join(sorted(hardware))}): "
            "calibrate one hardware at a time"
        )
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
    if not (np.isfinite(a).all() and np.isfinite(y).all()):
        raise ConfigError(
            "kvbench calibrate: a steps table holds a number that is not finite (nan or inf) in "
            f"{', '.join(REQUIRED_STEP_COLUMNS)}: re-run the real run"
        )
    used = np.abs(a).sum(axis=0) > 0  # a run without prefill rows cannot fit the prefill term
    for i, g in enumerate(groups):
        if not used[i]:
            raise ConfigError(
                f"kvbench calibrate: kernel={g[0]} layout={g[1]} has no decode step that read KV: nothing to fit"
            )
    if not used[-1]:
        raise ConfigError("kvbench calibrate: no measured steps")
    # scale columns to unit norm so seconds and step counts condition alike
    scale = np.where(used, np.linalg.norm(a, axis=0), 1.0)
    design = a[:, used] / scale[used]
    if np.linalg.matrix_rank(design) < design.shape[1]:
        raise ConfigError(
            "kvbench calibrate: the steps cannot separate KV read time from per-step overhead "
            "(too few distinct steps, or all read the same KV): calibrate from runs with growing contexts or several batches"
        )
    solution, *_ = np.linalg.lstsq(design, y, rcond=None)
    x = np.zeros(a.shape[1])
    x[used] = solution / scale[used]
    decode = {}
    for i, g in enumerate(groups):
        if x[i] <= 0:
            raise ConfigError(
                f"kvbench calibrate: kernel={g[0]} layout={g[1]}: the fit gives KV reads no time "
                f"(1/efficiency={x[i]:.3g}): the measured times do not grow with KV read"
            )
        decode[g] = 1.0 / x[i]
    prefill = None
    if used[-2]:
        if x[-2] <= 0:
            raise ConfigError(f"kvbench calibrate: the fit gives prefill no time (1/efficiency={x[-2]:.3g})")
        prefill = 1.0 / x[-2]
    truth = np.concatenate([r.steps["measured_s"].to_numpy(float) for r in runs])
    predicted = a @ x + (truth - y)  # the fitted terms plus the fixed ones
    rel = np.abs(predicted - truth) / np.where(truth > 0, truth, np.inf)
    return Fit(
        hardware.pop(), decode, prefill, float(x[-1]), len(y), float(np.median(rel)), float(np.quantile(rel, 0.9))
    )


def write_fit(result: Fit, out_dir: Path, command: str) -> list[Path]:
    """One calibration file per kernel, ``<out_dir>/<hardware>/<kernel>.json`` (``out_dir`` is a
    calibration folder, the layout ``calibration_dir`` reads); nothing is written outside it."""
    from kvbench.provenance import kvbench_commit
    from kvbench.specs.calibration import write_calibration

    root = Path(out_dir).resolve()
    provenance = {"command": command, "commit": kvbench_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    fitted = {"step_overhead_s": result.step_overhead_s}
    if result.prefill_flops_efficiency is not None:
        fitted["prefill_flops_efficiency"] = result.prefill_flops_efficiency
    written = []
    for kernel in sorted({k for k, _ in result.decode_efficiency}):
        require_name("kernel", kernel)
        require_name("hardware", result.hardware)
        path = root / result.hardware / f"{kernel}.json"
        if root not in path.resolve().parents:  # a name that is safe but a symlink inside --out that leads out
            raise ConfigError(f"kvbench calibrate: {path} resolves outside --out {out_dir}: remove the link")
        table = {layout: e for (k, layout), e in result.decode_efficiency.items() if k == kernel}
        write_calibration(
            path,
            result.hardware,
            kernel,
            table,
            {
                **provenance,
                "fit_rows": result.num_rows,
                "fit_relative_error_p50": result.relative_error_p50,
                "fit_relative_error_p90": result.relative_error_p90,
            },
            **fitted,
        )
        written.append(path)
    return written
