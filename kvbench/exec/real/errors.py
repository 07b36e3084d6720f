"""The simulator's per-step prediction error against a real run's measured step times."""

from __future__ import annotations

import numpy as np


def prediction_error(predicted_s, measured_s) -> dict[str, float]:
    """Median and p90 of ``|predicted - measured| / measured`` over steps (NaN without steps)."""
    predicted_s = np.asarray(predicted_s, dtype=np.float64)
    measured_s = np.asarray(measured_s, dtype=np.float64)
    if predicted_s.shape != measured_s.shape:
        raise ValueError(f"{predicted_s.shape[0]} predictions for {measured_s.shape[0]} measured steps")
    if not measured_s.size:
        return {
            "sim_step_error_median": float("nan"),
            "sim_step_error_p90": float("nan"),
        }
    if (measured_s <= 0).any():
        raise ValueError("a measured step time is not positive")
    rel = np.abs(predicted_s - measured_s) / measured_s
    return {
        "sim_step_error_median": float(np.median(rel)),
        "sim_step_error_p90": float(np.quantile(rel, 0.9)),
    }
