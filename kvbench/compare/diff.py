"""Metric by metric: each matched pair's numeric summary columns against their tolerances.

Each row of the result is one (job, metric) with a verdict:

    same     exactly equal (NaN equals NaN)
    within   differs, within its tolerance
    ignored  differs, and its tolerance is ``ignore``
    beyond   differs beyond its tolerance (fails the comparison)
    new      only HEAD has the metric (a metric added: passes)
    missing  only BASE has it (a metric removed: fails unless its tolerance is ``ignore``)
"""

from __future__ import annotations

import math
from numbers import Number
from typing import Any

import numpy as np
import pandas as pd

from kvbench.compare.load import Job
from kvbench.compare.tolerance import Rule, same_value, tolerance_for

FAILING = ("beyond", "missing")
COLUMNS = (
    "job",
    "base_job",
    "head_job",
    "metric",
    "base",
    "head",
    "change_abs",
    "change_rel",
    "tolerance",
    "verdict",
    "passed",
)


def _numeric(value: Any) -> bool:
    # a bool is a number here: a flag flipping is a change worth reporting
    return isinstance(value, (Number, np.bool_)) and not isinstance(value, complex)


def metric_columns(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """Numeric columns of either row, BASE's order first; strings (labels, provenance) are no metric."""
    columns = [c for c, v in base.items() if _numeric(v)]
    return columns + [c for c, v in head.items() if _numeric(v) and c not in columns]


def _changes(base: Any, head: Any) -> tuple[float, float]:
    try:
        b, h = float(base), float(head)
    except (TypeError, ValueError):
        return math.nan, math.nan
    if math.isnan(b) or math.isnan(h) or math.isinf(b) or math.isinf(h):
        return (0.0, 0.0) if b == h else (math.nan, math.nan)
    change = h - b
    # relative to a zero base there is no finite change: inf keeps the sign, the plot clips it
    rel = change / abs(b) if b else (0.0 if change == 0 else math.copysign(math.inf, change))
    return change, rel


def compare_pair(base: Job, head: Job, rules: list[Rule]) -> list[dict[str, Any]]:
    rows = []
    for metric in metric_columns(base.summary, head.summary):
        tolerance = tolerance_for(metric, rules)
        b, h = base.summary.get(metric, math.nan), head.summary.get(metric, math.nan)
        if metric not in head.summary:
            verdict = "ignored" if tolerance.kind == "ignore" else "missing"
        elif metric not in base.summary:
            verdict = "new"
        elif same_value(b, h):
            verdict = "same"
        elif tolerance.kind == "ignore":
            verdict = "ignored"
        else:
            verdict = "within" if tolerance.accepts(b, h) else "beyond"
        change_abs, change_rel = _changes(b, h)
        rows.append(
            {
                "job": base.label,
                "base_job": str(base.folder),
                "head_job": str(head.folder),
                "metric": metric,
                "base": b,
                "head": h,
                "change_abs": change_abs,
                "change_rel": change_rel,
                "tolerance": str(tolerance),
                "verdict": verdict,
                "passed": verdict not in FAILING,
            }
        )
    return rows


def compare_jobs(pairs: list[tuple[Job, Job]], rules: list[Rule]) -> pd.DataFrame:
    """One row per (matched job, metric), in BASE's job order."""
    rows = [row for base, head in pairs for row in compare_pair(base, head, rules)]
    # object columns: a float64 column would turn byte counts into floats and print them so
    return pd.DataFrame(
        {c: pd.Series([r[c] for r in rows], dtype=object if c in ("base", "head") else None) for c in COLUMNS}
    )


def unused_patterns(frame: pd.DataFrame, rules: list[Rule]) -> list[Rule]:
    """The user's rules (not the shipped ones) whose glob matches no compared metric: likely a typo."""
    metrics = set(frame["metric"])
    return [rule for rule in rules if not any(rule.matches(m) for m in metrics)]
