"""kvbench.validation.tpot_tail: the groups above a TPOT threshold, placed between their bounds."""

from __future__ import annotations

import pandas as pd
import pytest
from silicon_rows import DENSE_ROW as ROW

from kvbench.validation import bounds, tpot_tail


def _rows() -> pd.DataFrame:
    """Two groups of two rows: TRT-LLM (kvbench 50 % high) and vLLM (kvbench 1 % high)."""
    rows = []
    for backend, factor in (("trtllm", 1.5), ("vllm", 1.01)):
        for i, batch in enumerate((8.0, 32.0)):
            rows.append(
                {
                    **ROW,
                    "id": f"{backend}{i}",
                    "backend": backend,
                    "batch_size": batch,
                    "architecture": "dense",
                    "silicon_tpot_ms": 10.0,
                    "profiled_tpot_ms": 10.0 * factor,
                    "profiled_status": "ok",
                }
            )
    return pd.DataFrame(rows)


def test_only_groups_above_the_threshold_are_placed():
    per_row, table = tpot_tail.tail(_rows(), 0.2)
    assert list(table["backend"]) == ["trtllm"] and int(table["rows"].iloc[0]) == 2
    assert table["tpot_ape_median"].iloc[0] == pytest.approx(0.5)
    counts = table[["below_lockstep", "between", "above_steady"]].iloc[0].sum()
    assert counts == 2  # each row is in exactly one place
    for _, r in per_row.iterrows():
        b = bounds.StepBounds(r["lockstep_ms"], r["steady_ms"], 0)
        assert r["where"] == bounds.classify(r["silicon_tpot_ms"], b)
        assert r["measured_position"] == pytest.approx((10.0 - b.decode_ms) / (b.mixed_ms - b.decode_ms))
        # no GEMM is faster than reading its weights at full bandwidth
        assert r["gemm_ms"] >= r["weight_read_ms"] > 0 and r["floor_ms"] > r["weight_read_ms"]


def test_no_group_above_the_threshold_is_one_line():
    with pytest.raises(tpot_tail.ConfigError, match="lower --threshold"):
        tpot_tail.tail(_rows(), 0.9)


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert tpot_tail.main(["--rows", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "o")]) == 2
    assert "is not a file" in capsys.readouterr().err
    rows = tmp_path / "rows.csv"
    _rows().to_csv(rows, index=False)
    assert tpot_tail.main(["--rows", str(rows), "--out", str(tmp_path / "o"), "--threshold", "-1"]) == 2
    (tmp_path / "file").write_text("x")
    assert tpot_tail.main(["--rows", str(rows), "--out", str(tmp_path / "file")]) == 2
    assert not (tmp_path / "o").exists()


def test_the_study_writes_its_tables_and_figure(tmp_path, capsys):
    rows = tmp_path / "rows.csv"
    _rows().to_csv(rows, index=False)
    assert tpot_tail.main(["--rows", str(rows), "--out", str(tmp_path / "o")]) == 0
    names = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert names == ["tail.png", "tail_groups.csv", "tail_groups.parquet", "tail_rows.csv", "tail_rows.parquet"]
    assert "| meta-llama/Llama-3.1-8B-Instruct | h100_sxm | trtllm | 2 |" in capsys.readouterr().out
