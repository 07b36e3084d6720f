"""The README's comparison of the aggregated engine with 1P1D, 2P1D and 1P2D is the committed
output of ``kvbench.studies.disagg_layouts`` (docs/disagg/), never typed in, and the study itself
finds a layout's goodput per GPU by bisection over real runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.studies import disagg_layouts

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_table_is_the_committed_study():
    frame = pd.read_parquet(ROOT / "docs" / "disagg" / "layouts.parquet")
    assert list(frame["layout"]) == [name for name, _, _ in disagg_layouts.LAYOUTS]
    assert disagg_layouts.markdown(frame) in (ROOT / "README.md").read_text()
    assert (ROOT / "docs" / "disagg" / "layouts.png").is_file()


def test_the_study_finds_a_layouts_goodput_per_gpu_by_bisection():
    name, overrides, gpus = disagg_layouts.LAYOUTS[1]
    row = disagg_layouts.layout_row(name, overrides, gpus, num_requests=30)
    assert row["slo_attainment"] >= disagg_layouts.ATTAINMENT
    assert disagg_layouts.LOW_PER_GPU <= row["rate_per_gpu_req_s"] < disagg_layouts.HIGH_PER_GPU
    assert 0 < row["goodput_per_gpu_req_s"] <= row["rate_per_gpu_req_s"] * 1.5
    parts = [row[f"ttft_{p}_mean_ms"] for p in ("prefill_queue", "prefill", "transfer", "first_decode")]
    assert all(p >= 0 for p in parts)
