"""The README's paragraph on the reproduced papers quotes kvbench's numbers: each must be what the
committed ``paper/`` (itself checked against ``kvbench paper`` by tests/test_paper.py) says."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def paragraph() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("### Reproducing the lecture and the vLLM paper")
    return " ".join(text[start : text.index("###", start + 4)].split())


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    frames = [pd.read_csv(ROOT / "paper" / "data" / f"{name}.csv") for name in ("lecture", "vllm_paper")]
    return pd.concat(frames).set_index("key")


# README text -> (row key, column, decimals): the number quoted is that cell, rounded
QUOTED = {
    "165 rows": ("lecture", None, 0),
    "60 rows": ("vllm_paper", None, 0),
    "allocator's 29 sequences": ("lecture.naive_concurrency", "formula_value", 0),
    "the {} ms swap": ("lecture.s10_5_swap_round_trip_ms", "formula_value", 0),
    "{} ms recompute": ("lecture.s10_5_recompute_ms", "formula_value", 0),
    "({}x for 8 branches": ("lecture.s10_4_fanout8_ratio", "formula_value", 1),
    "{}x for 16 off 8K": ("lecture.s10_4_fanout16_ratio", "formula_value", 1),
    "makes it {} GB": ("lecture.seq_kv_gb", "formula_value", 3),
    "15.2 % ({} %)": ("lecture.naive_utilization_4k", "formula_value", 1),
    "23.5 ms ({} ms)": ("lecture.s10_6_tpot_b199_ms", "formula_value", 1),
    "20 ms TPOT ({};": ("lecture.s10_6_slo_batch", "formula_value", 0),
    "step takes {} ms": ("lecture.b164_gets_both", "formula_value", 1),
    "holds {} in 62.5 GB": ("lecture.packed_concurrency", "formula_value", 0),
    "paging gains {}x": ("lecture.mem_paged_over_naive", "formula_value", 1),
    "slots fit: {} %": ("lecture.naive_utilization_32k", "formula_value", 1),
    "equation gives {})": ("lecture.ex4_break_even_length_32gbs", "formula_value", 0),
    "kvbench: {} %": ("lecture.table_b64_waste_pct", "formula_value", 1),
    "and {} %)": ("lecture.table_b256_waste_pct", "formula_value", 1),
    "Orca (Max)'s batch of {}": ("vllm.fig13_sharegpt_orca_max", "formula_value", 0),
    "Table 1's {}K": ("vllm.table1_opt13b_max_slots", "formula_value", 1),
    "and {}K slots": ("vllm.table1_opt175b_max_slots", "formula_value", 1),
}


@pytest.mark.parametrize("phrase", sorted(QUOTED))
def test_each_number_quoted_is_the_papers(phrase, paragraph, rows):
    key, column, decimals = QUOTED[phrase]
    if column is None:  # a row count
        value = int(
            (rows.index.str.startswith("lecture.") if key == "lecture" else rows.index.str.startswith("vllm.")).sum()
        )
    else:
        value = float(rows.loc[key, column])
    shown = f"{value:,.{decimals}f}"
    expected = phrase.format(shown) if "{}" in phrase else phrase
    if "{}" not in phrase:
        assert re.search(rf"\b{value:,.{decimals}f}\b", phrase), f"{phrase!r} does not quote {shown}"
    assert expected in paragraph, f"README quotes {phrase!r}, but paper/ gives {shown}: update the README"


def test_numbers_quoted_from_kvbench_specs(paragraph):
    from kvbench.studies.paper import configs

    gqa8 = configs.built(["model.hf_config.num_key_value_heads=8"]).model
    mha = configs.built().model
    assert (
        f"keeps the MHA model's {mha.num_params / 1e9:.2f}e9 parameters (GQA-8 has {gqa8.num_params / 1e9:.2f}e9)"
        in paragraph
    )
    kv66 = configs.model("opt-66b").kv_bytes_per_token
    assert f"9.7K slots need {9700 * kv66 / 2**30:.1f} GiB" in paragraph
    layers = configs.model("opt-13b").num_layers
    assert f"({2 * layers} copies per block for OPT-13B)" in paragraph
