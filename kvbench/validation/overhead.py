"""A per-step host overhead per framework, fitted from the silicon rows with the scored group left out.

The profiled clock prices each step's kernels (attention, GEMMs, communication) from measured
tables; a real engine also spends host time every step (scheduling, sampling, launches, the
detokenizer's share) that no kernel table holds. kvbench models it as ``h`` seconds added to
every step (``engine.step_overhead_s``), one ``h`` per framework (the row's ``backend``: vllm,
sglang, trtllm; the sample's versions of one framework are too many and too sparse to fit apart).

Fitting costs no replay: each aggregated replay runs with ``h = 0`` and records the mean engine
steps a request spent before its first token (``s1``) and between its first and last token per
output token (``s2``, :func:`kvbench.validation.client.request_stats`). With the closed-loop
client sending at step ends, ``TTFT(h) = TTFT(0) + h x s1`` and ``TPOT(h) = TPOT(0) + h x s2``
exactly (a test replays with the overhead set and compares). A disaggregated row (its steps are
several workers' and its KV transfer is timed) keeps ``h = 0``.

Criterion: ``h`` minimises the median absolute relative TPOT error over the rows fitted on (TPOT
is the per-step time itself; TTFT then follows from ``s1`` and is scored, not fitted), searched
over :data:`GRID_S` and every row's own zero-error ``h``, clamped at 0 (a negative host time is
no cost: a framework whose TPOT kvbench already over-prices gets 0).

Held-out: the rows of a group (one model on one GPU under one framework, :data:`GROUP`) are
predicted with the ``h`` fitted on the other groups of the same framework only; a framework with
no other group keeps ``h = 0`` for that group. In-sample: one ``h`` per framework from all its
rows. ``kvbench validate`` reports both beside the unfitted (``h = 0``) numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: a group of rows scored together and left out together: one model on one GPU under one framework
GROUP = ("model_path", "system", "backend")
#: the candidates searched besides each row's own zero-error h: 0 to 5 ms in 1 us steps
GRID_S = np.arange(0.0, 5e-3 + 1e-9, 1e-6)
#: the clocks this module adds beside kvbench's profiled one (h = 0)
HELD_OUT, IN_SAMPLE = "heldout", "insample"


@dataclass(frozen=True)
class Fit:
    """One framework's in-sample fit."""

    backend: str
    step_overhead_s: float
    rows: int  #: rows fitted on
    groups: int
    versions: tuple[str, ...]
    tpot_median: float  #: in-sample median absolute relative TPOT error at the fitted h


def fit_h(base_ms: np.ndarray, steps: np.ndarray, measured_ms: np.ndarray) -> float:
    """The h (seconds) >= 0 minimising the median of ``|base + h x steps - measured| / measured``
    (milliseconds in, seconds out); 0 without a usable row."""
    ok = np.isfinite(base_ms) & np.isfinite(steps) & np.isfinite(measured_ms) & (steps > 0) & (measured_ms > 0)
    if not ok.any():
        return 0.0
    base, step, measured = base_ms[ok] / 1e3, steps[ok], measured_ms[ok] / 1e3
    zeros = (measured - base) / step
    candidates = np.unique(np.concatenate((GRID_S, zeros[zeros > 0])))
    best_h, best = 0.0, math.inf
    for chunk in np.array_split(candidates, max(1, len(candidates) // 512)):
        err = np.abs(base[None, :] + chunk[:, None] * step[None, :] - measured[None, :]) / measured[None, :]
        medians = np.median(err, axis=1)
        i = int(np.argmin(medians))
        if medians[i] < best:
            best, best_h = float(medians[i]), float(chunk[i])
    return best_h


def _agg(rows):
    return rows[(rows["mode"] == "agg") & np.isfinite(rows["profiled_tpot_steps"])]


def group_keys(rows) -> list[tuple]:
    return [tuple(k) for k in rows[list(GROUP)].itertuples(index=False, name=None)]


def fit_in_sample(rows) -> dict[str, Fit]:
    """One h per framework from all its aggregated rows with a replay."""
    fits = {}
    agg = _agg(rows)
    for backend, part in agg.groupby("backend", sort=True):
        h = fit_h(*_arrays(part))
        err = _tpot_errors(part, h)
        fits[str(backend)] = Fit(
            str(backend),
            h,
            len(part),
            len(set(group_keys(part))),
            tuple(sorted(str(v) for v in part["backend_version"].dropna().unique())),
            float(np.median(err)) if len(err) else math.nan,
        )
    return fits


def held_out_h(rows) -> dict[tuple, float]:
    """Each group's h, fitted on the other groups of its framework only (0 where it has none)."""
    agg = _agg(rows)
    keys = group_keys(agg)
    backends = agg["backend"].to_numpy()
    out = {}
    for key in dict.fromkeys(keys):
        others = np.array([k != key for k in keys], dtype=bool) & (backends == key[2])
        out[key] = fit_h(*_arrays(agg[others])) if others.any() else 0.0
    return out


def _arrays(part):
    return (
        part["profiled_tpot_ms"].to_numpy(float),
        part["profiled_tpot_steps"].to_numpy(float),
        part["silicon_tpot_ms"].to_numpy(float),
    )


def _tpot_errors(part, h: float) -> np.ndarray:
    base, steps, measured = _arrays(part)
    err = np.abs(base + h * 1e3 * steps - measured) / measured
    return err[np.isfinite(err)]


def apply(rows, h_by_row: np.ndarray, name: str) -> None:
    """Add ``<name>_ttft_ms`` and ``<name>_tpot_ms``: the profiled prediction plus ``h`` per step
    (a row without step counts, a disaggregated one, keeps h = 0), and ``<name>_h_s``."""
    h = np.where(np.isfinite(rows["profiled_tpot_steps"].to_numpy(float)), h_by_row, 0.0)
    rows[f"{name}_h_s"] = h
    for metric in ("ttft", "tpot"):
        steps = np.nan_to_num(rows[f"profiled_{metric}_steps"].to_numpy(float), nan=0.0)
        rows[f"{name}_{metric}_ms"] = rows[f"profiled_{metric}_ms"].to_numpy(float) + h * 1e3 * steps


def add_fitted(rows) -> dict[str, Fit]:
    """The held-out and in-sample predictions of every row (columns of ``rows``), and the in-sample fits."""
    fits = fit_in_sample(rows)
    held = held_out_h(rows)
    keys = group_keys(rows)
    apply(rows, np.array([held.get(k, 0.0) for k in keys], dtype=float), HELD_OUT)
    in_sample = {b: f.step_overhead_s for b, f in fits.items()}
    apply(rows, np.array([in_sample.get(str(b), 0.0) for b in rows["backend"]], dtype=float), IN_SAMPLE)
    return fits


def source_line(fit: Fit, held_out_tpot: float, held_out_ttft: float) -> str:
    return (
        f"{fit.backend}: step_overhead_s = {fit.step_overhead_s * 1e6:.0f} us; source: fitted on {fit.rows} silicon "
        f"rows ({fit.groups} groups) of {fit.backend} {', '.join(fit.versions)}, minimising the median TPOT error "
        f"(in-sample {held_out_pct(fit.tpot_median)}); leave-one-group-out held-out median error "
        f"TPOT {held_out_pct(held_out_tpot)}, TTFT {held_out_pct(held_out_ttft)}"
    )


def held_out_pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 100:.1f} %"
