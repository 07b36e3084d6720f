"""Fitting the simulator's efficiency terms to a real run's measured step times (the command is
``kvbench calibrate``, :mod:`kvbench.commands.calibrate`).

    kvbench calibrate results/<real run> [more run folders or sweep folders] [--out <folder>]

Each run folder needs its steps table (``steps.parquet`` or ``steps.csv``, written with
``output.steps=true``) holding per-step ``measured_s`` (mode=real), and its ``summary.json`` and
``config.json``. The summary must say the steps were measured on a GPU (``measured_on``,
``"cuda: <GPU name>"``, :mod:`kvbench.exec.real.device`): the fitted terms are fractions of the
hardware config's GPU bandwidth and FLOP/s, and the file is filed under that GPU's name, so a CPU's
timings (``"cpu: ..."``) are refused, as is a run that predates the field (it cannot say where it
ran; re-running it costs minutes).

For every row (a step, or a span of ``num_steps`` quiet steps) the model is the cost model's
(kvbench/exec/costmodel.py) with three kinds of unknowns::

    measured_s - decoding * num_steps * weight_bytes / BW - swap_s - copy_s
        = kv_read_bytes / (BW * e_decode[kernel, layout])      # the calibrated KV read
        + prefill_flops / (peak FLOP/s * e_prefill)             # compute-bound prefill
        + num_steps * step_overhead_s                           # launches, sampling, host work

``decoding`` is 1 for a row with decode sequences. The prefill FLOPs are read back from the
plan's predicted ``prefill_s`` (priced at the run's ``hardware.prefill_flops_efficiency``), so
chunked prefill over cached context is counted as the cost model counts it. Weight reads stay at
full bandwidth and swaps and copies at their predicted times: the fit never moves them.

Solved by linear least squares in (1/e_decode per (kernel, layout), 1/e_prefill, overhead). Each
fitted term must be what a calibration file may hold (efficiencies in [0.001, 1], overhead in
[0, 1] s), else the fit is refused, in words, before anything is written. One file per kernel is
written to ``<out>/<hardware>/<kernel>.json`` (``--out``, default ``results/calibrations``: the
layout ``calibration_dir=<out>`` reads), with the fit's provenance (command, commit, date, the
GPU that measured it) and residuals. The hardware and kernel names come from the runs'
``summary.json``, so they are checked like config names before they become a path, and the file
is written only under ``--out``, which may not lie inside the installed kvbench package (its own
``kvbench/calibrations/`` are reviewed files): never elsewhere. Bad input is one line
(ConfigError), exit 2; an interrupt one line, exit 130/143.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.errors import ConfigError, clip
from kvbench.io.textio import read_json_object
from kvbench.specs.calibration import MIN_EFFICIENCY
from kvbench.specs.names import require_name

#: where ``kvbench calibrate`` writes unless told (``--out``): a calibration folder of the results area
DEFAULT_OUT = Path("results") / "calibrations"
REQUIRED_STEP_COLUMNS = ("measured_s", "num_steps", "num_decode_seqs", "kv_read_bytes", "prefill_s", "swap_s", "copy_s")
#: torch's device type of the GPUs a hardware config describes (NVIDIA's, and AMD's under ROCm):
#: the part of a run's ``measured_on`` before the colon that calibrate fits
GPU_DEVICE_TYPES = ("cuda",)
#: the most fixed cost per step a calibration file may hold (kvbench/specs/calibration.py)
MAX_STEP_OVERHEAD_S = 1.0


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
    #: where the steps were measured: "cuda: <GPU name>" (kvbench.exec.real.device)
    measured_on: str = ""


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
    #: the runs' ``measured_on``, each once: recorded in the calibration file's provenance
    measured_on: tuple[str, ...] = ()


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
    from kvbench.io.atomic import check_complete
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
    # after the checks above (a ConfigError inside them is reworded as an incomplete folder)
    measured_on = _check_measured_on_a_gpu(folder, summary.get("measured_on"), hardware)
    return RunData(
        folder=folder,
        hardware=hardware,
        kernel=kernel,
        layout=layout,
        steps=steps[steps["measured_s"].notna()],
        measured_on=measured_on,
        **numbers,
    )


def _check_measured_on_a_gpu(folder: Path, measured_on, hardware: str) -> str:
    """``measured_on`` when it names a GPU; else a one-line ConfigError that says why a fit would
    mislead and what to run instead. The fitted terms are fractions of the hardware config's GPU
    bandwidth and FLOP/s, filed under that GPU's name: another machine's times would price every
    simulated step on that GPU at that machine's speed."""
    gpu = f"the GPU hardware={hardware} describes (sim runs need no calibration)"
    instead = f"calibrate from mode=real runs on {gpu}"
    if measured_on is None:
        raise ConfigError(
            f"kvbench calibrate: {folder} does not record where its steps were measured (its summary.json has "
            "no measured_on: a kvbench from before that field wrote it, so its times may be a CPU's); "
            f"re-run it with this kvbench on {gpu}"
        )
    if not isinstance(measured_on, str) or ":" not in measured_on:
        raise ConfigError(
            f"kvbench calibrate: {folder / 'summary.json'}: measured_on={clip(repr(measured_on))} is invalid: "
            f'expected "cuda: <GPU name>"; {instead}'
        )
    device_type, _, name = (part.strip() for part in measured_on.partition(":"))
    if device_type in GPU_DEVICE_TYPES:
        return measured_on
    machine = "a CPU" if device_type == "cpu" else f"{device_type!r}, not a CUDA GPU"
    raise ConfigError(
        f"kvbench calibrate: {folder} was measured on {machine} ({clip(name, 100) or 'unnamed'}), while its "
        f"config prices hardware={hardware}: a fit would file these timings as {hardware}'s and price every "
        f"simulated step at this machine's speed; {instead}"
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
    (name,) = hardware
    # what a fit that explains nothing means, and what would give one that does
    instead = (
        f"these times were not measured on the GPU hardware={name} describes, or are too few, too short or too "
        "noisy to fit; calibrate from mode=real runs on that GPU whose batches and contexts make each part "
        "a measurable share of a step"
    )
    decode = {}
    for i, g in enumerate(groups):
        if x[i] <= 0:
            raise ConfigError(
                f"kvbench calibrate: kernel={g[0]} layout={g[1]}: the measured step times do not grow with the "
                f"KV bytes the steps read (the best fit gives reading KV a cost of zero or less, "
                f"1/efficiency={x[i]:.3g}), so there is no decode efficiency to fit: {instead}"
            )
        decode[g] = 1.0 / x[i]
    prefill = None
    if used[-2]:
        if x[-2] <= 0:
            raise ConfigError(
                "kvbench calibrate: the measured step times do not grow with the prefill FLOPs (the best fit gives "
                f"prefill a cost of zero or less, 1/efficiency={x[-2]:.3g}), so there is no prefill efficiency to "
                f"fit: {instead}"
            )
        prefill = 1.0 / x[-2]
    truth = np.concatenate([r.steps["measured_s"].to_numpy(float) for r in runs])
    predicted = a @ x + (truth - y)  # the fitted terms plus the fixed ones
    rel = np.abs(predicted - truth) / np.where(truth > 0, truth, np.inf)
    result = Fit(
        name,
        decode,
        prefill,
        float(x[-1]),
        len(y),
        float(np.median(rel)),
        float(np.quantile(rel, 0.9)),
        tuple(sorted({r.measured_on for r in runs if r.measured_on})),
    )
    check_fit(result)
    return result


def check_fit(result: Fit) -> None:
    """A one-line ConfigError, in words, unless every fitted term is what a calibration file may
    hold (kvbench/specs/calibration.py checks the same bounds when it reads one): called before
    anything is written, so a refused fit leaves no file and no folder."""
    hw = result.hardware
    instead = f"calibrate from mode=real runs on the GPU hardware={hw} describes"
    for (kernel, layout), e in sorted(result.decode_efficiency.items()):
        what = f"kvbench calibrate: kernel={kernel} layout={layout}: efficiency[{layout!r}]={e:.3g} is invalid"
        if not (np.isfinite(e) and e <= 1):
            raise ConfigError(
                f"{what}: the steps read KV faster than hardware={hw}'s hbm_bandwidth_bytes_per_s allows (an "
                f"efficiency above 1): they ran on a faster GPU than {hw}, or that bandwidth is set too low; {instead}"
            )
        if e < MIN_EFFICIENCY:
            raise ConfigError(
                f"{what}: the steps read KV at under {MIN_EFFICIENCY:.1%} of {hw}'s HBM bandwidth, far slower than "
                f"any GPU kernel: these are not {hw}'s timings (another machine, or a failed measurement); {instead}"
            )
    e = result.prefill_flops_efficiency
    if e is not None and not (np.isfinite(e) and MIN_EFFICIENCY <= e <= 1):
        speed = (
            f"at under {MIN_EFFICIENCY:.1%} of {hw}'s dense_flops_per_s"
            if e < MIN_EFFICIENCY
            else f"faster than {hw}'s dense_flops_per_s allows (an efficiency above 1)"
        )
        raise ConfigError(
            f"kvbench calibrate: prefill_flops_efficiency={e:.3g} is invalid: the steps ran prefill {speed}: these "
            f"are not {hw}'s timings, or its FLOP/s is set wrong; {instead}"
        )
    overhead_s = result.step_overhead_s
    if not (np.isfinite(overhead_s) and 0 <= overhead_s <= MAX_STEP_OVERHEAD_S):
        size = "less than nothing" if overhead_s < 0 else f"over {MAX_STEP_OVERHEAD_S:g} s"
        raise ConfigError(
            f"kvbench calibrate: step_overhead_s={overhead_s:.3g} is invalid: the fit gives each step a fixed cost "
            f"of {size}, so KV reads, prefill FLOPs and a fixed cost per step do not explain these times "
            f"(too few or too noisy steps, or not {hw}'s); {instead}"
        )


def write_fit(result: Fit, out_dir: Path, command: str) -> list[Path]:
    """One calibration file per kernel, ``<out_dir>/<hardware>/<kernel>.json`` (``out_dir`` is a
    calibration folder, the layout ``calibration_dir`` reads); nothing is written outside it."""
    from kvbench.output.provenance import kvbench_commit
    from kvbench.specs.calibration import write_calibration

    check_fit(result)  # every term, before the first folder is made
    root = Path(out_dir).resolve()
    _check_outside_the_package(out_dir, root)
    provenance = {"command": command, "commit": kvbench_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    if result.measured_on:
        provenance["measured_on"] = "; ".join(result.measured_on)
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


def _check_outside_the_package(out_dir: Path, root: Path) -> None:
    """Refuse an ``--out`` inside the installed kvbench package: its ``calibrations/`` are the
    reviewed files every run reads by default; a fit goes to a results folder, read with
    ``calibration_dir=<out>``, and is copied into the package by hand when chosen (docs/gpu.md)."""
    package = Path(__file__).resolve().parent
    if root == package or package in root.parents:
        raise ConfigError(
            f"kvbench calibrate: --out {out_dir} is inside the installed kvbench package ({package}): a fit is "
            f"never written there; write it to a results folder (default {DEFAULT_OUT}) and read it with "
            "calibration_dir=<out>"
        )
