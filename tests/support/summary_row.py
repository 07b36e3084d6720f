"""A summary row holding every kind of value a run's summary does, for the tests of the code that
must type and write each kind as pandas would (kvbench.io.table, kvbench.io.numeric_csv)."""

from __future__ import annotations

import math

import numpy as np

#: text, text the csv module must quote, a missing value, a flag, a count, a float, NaN, numpy scalars
SUMMARY_ROW = {
    "allocator": "paged",
    "workload": 'trace "a, b"\nsecond line',
    "calibration": None,
    "event_driven": True,
    "num_requests": 7,
    "duration_s": 1.25,
    "tpot_p50_s": math.nan,
    "kv_budget_bytes": np.int64(62_500_000_000),
    "utilization_mean": np.float64(0.5),
}
