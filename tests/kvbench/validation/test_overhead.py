"""The per-step host overhead: fitted where the rows say it, clamped at 0, and held out by group
(the scored group's own rows never reach its h)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvbench.validation import overhead


def _rows(groups: dict[tuple[str, str, str], tuple[float, int]]) -> pd.DataFrame:
    """Rows of each (model, system, backend) group whose measured TPOT is the replay's plus h_true
    per step (4 rows each, base TPOT 10 ms, 1 step per token, TTFT 100 ms over 3 steps)."""
    records = []
    for (model, system, backend), (h_true, n) in groups.items():
        for i in range(n):
            base = 10.0 + i
            records.append(
                {
                    "model_path": model,
                    "system": system,
                    "backend": backend,
                    "backend_version": "1.0",
                    "mode": "agg",
                    "profiled_tpot_ms": base,
                    "profiled_tpot_steps": 1.0,
                    "profiled_ttft_ms": 100.0,
                    "profiled_ttft_steps": 3.0,
                    "silicon_tpot_ms": base + h_true * 1e3,
                    "silicon_ttft_ms": 100.0 + 3 * h_true * 1e3,
                }
            )
    return pd.DataFrame.from_records(records)


def test_fit_h_recovers_the_overhead_and_clamps_at_zero():
    base = np.array([10.0, 12.0, 20.0, 7.0])
    steps = np.array([1.0, 1.0, 1.1, 1.0])
    assert overhead.fit_h(base, steps, base + 0.3 * steps) == pytest.approx(3e-4, abs=1e-9)
    assert overhead.fit_h(base, steps, base * 0.5) == 0.0  # kvbench over-prices: no negative host time
    assert overhead.fit_h(base, steps * np.nan, base) == 0.0


def test_held_out_never_uses_the_scored_group():
    groups = {
        ("a", "h100_sxm", "vllm"): (2e-4, 4),
        ("b", "h200_sxm", "vllm"): (2e-4, 4),
        ("d", "h100_sxm", "trtllm"): (5e-4, 4),
    }
    rows = _rows(groups)
    held = overhead.held_out_h(rows)
    assert held[("a", "h100_sxm", "vllm")] == pytest.approx(2e-4, abs=1e-9)
    assert held[("d", "h100_sxm", "trtllm")] == 0.0  # its framework has no other group
    # make group a's own rows say 3 ms: its held-out h must not move, the others' must
    leaked = rows.copy()
    own = leaked["model_path"] == "a"
    leaked.loc[own, "silicon_tpot_ms"] = leaked.loc[own, "profiled_tpot_ms"] + 3.0
    again = overhead.held_out_h(leaked)
    assert again[("a", "h100_sxm", "vllm")] == held[("a", "h100_sxm", "vllm")]
    assert again[("b", "h200_sxm", "vllm")] == pytest.approx(3e-3, abs=1e-9)  # b is fitted on a alone


def test_add_fitted_writes_held_out_and_in_sample_predictions():
    rows = _rows({("a", "h100_sxm", "vllm"): (2e-4, 4), ("b", "h200_sxm", "vllm"): (2e-4, 4)})
    rows = pd.concat([rows, rows.iloc[[0]].assign(mode="disagg", profiled_tpot_steps=np.nan)], ignore_index=True)
    fits = overhead.add_fitted(rows)
    assert fits["vllm"].step_overhead_s == pytest.approx(2e-4, abs=1e-9) and fits["vllm"].rows == 8
    for clock in (overhead.HELD_OUT, overhead.IN_SAMPLE):
        agg = rows["mode"] == "agg"
        assert np.allclose(rows.loc[agg, f"{clock}_tpot_ms"], rows.loc[agg, "silicon_tpot_ms"])
        assert np.allclose(rows.loc[agg, f"{clock}_ttft_ms"], rows.loc[agg, "silicon_ttft_ms"])
        # a disaggregated row keeps h = 0: its steps are several workers'
        assert rows.loc[~agg, f"{clock}_tpot_ms"].iloc[0] == rows.loc[~agg, "profiled_tpot_ms"].iloc[0]
        assert rows.loc[~agg, f"{clock}_h_s"].iloc[0] == 0.0
    line = overhead.source_line(fits["vllm"], 0.0, 0.1)
    assert "fitted on 8 silicon rows (2 groups) of vllm 1.0" in line and "held-out" in line
