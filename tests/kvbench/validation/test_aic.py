"""kvbench.validation.aic: aiconfigurator-core's own estimate for real silicon_sample.csv rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

pytest.importorskip("aiconfigurator_core")

from kvbench.validation import aic  # noqa: E402

#: one admitted row each: (model_path, system, backend, tp_size), picked from the package's sample
PICKS = (
    ("meta-llama/Llama-3.1-8B-Instruct", "h100_sxm", "trtllm", 1),  # precision NaN -> bf16
    ("Qwen/Qwen3-32B", "h100_sxm", "vllm", 2),  # precision NaN -> bf16, tp > 1
    ("meta-llama/Llama-3.1-8B-Instruct", "h200_sxm", "sglang", 1),  # gemm fp8_block
    ("meta-llama/Llama-3.1-70B", "h200_sxm", "trtllm", 2),  # gemm fp8, backend_version NaN
)


@pytest.fixture(scope="module")
def sample() -> pd.DataFrame:
    return pd.read_csv(aic.silicon_sample_path())


@pytest.fixture(scope="module")
def real_rows(sample) -> pd.DataFrame:
    agg = sample[(sample["mode"] == "agg") & (sample["pp_size"] == 1)]
    picked = []
    for model, system, backend, tp in PICKS:
        match = agg[
            (agg["model_path"] == model)
            & (agg["system"] == system)
            & (agg["backend"] == backend)
            & (agg["tp_size"] == tp)
            & (agg["batch_size"] <= 64)
            & (agg["isl"] <= 4096)
        ]
        assert not match.empty, f"the sample has no agg row for {model} {system} {backend} tp={tp}"
        picked.append(match.iloc[[0]])
    return pd.concat(picked)


@pytest.fixture(scope="module")
def estimated(real_rows) -> pd.DataFrame:
    return aic.estimate_rows(real_rows)


def test_aic_is_available_here():
    assert aic.aic_available() is None


def test_real_rows_get_finite_positive_predictions(real_rows, estimated):
    assert list(estimated.index) == list(real_rows.index)
    assert set(aic.OUTPUT_COLUMNS) <= set(estimated.columns)
    assert (estimated["aic_status"] == "ok").all(), estimated["aic_status"].to_dict()
    for column in ("aic_ttft_ms", "aic_tpot_ms"):
        values = estimated[column]
        assert values.dtype == float
        assert values.map(math.isfinite).all() and (values > 0).all(), values.to_dict()


def test_predictions_are_in_the_measured_range(real_rows, estimated):
    # not an accuracy bar: a unit or mapping slip (s vs ms, tp ignored) would land far outside this
    ratio = estimated["aic_tpot_ms"] / real_rows["silicon_tpot_ms"]
    assert ratio.between(0.2, 5.0).all(), ratio.to_dict()


def test_each_row_names_the_queryable_version_and_the_quant_modes_used(real_rows, estimated):
    for index, row in real_rows.iterrows():
        out = estimated.loc[index]
        assert out["aic_backend_version"]
        gemm = row["gemm_quant_mode"]
        expected = "bfloat16" if pd.isna(gemm) else gemm
        assert out["aic_quant"].startswith(f"gemm={expected} "), out["aic_quant"]


def test_version_mapping_picks_the_nearest_queryable_version():
    sdk = aic._sdk()
    slots = sdk.queryable_versions("h100_sxm", "trtllm")
    assert slots, "the package has no queryable trtllm version on h100_sxm"
    version, why = aic._nearest_version(sdk, "h100_sxm", "trtllm", None)
    assert (version, why) == (slots["current"], "")
    version, _ = aic._nearest_version(sdk, "h100_sxm", "trtllm", "0.0.1")
    assert version == min(slots.values(), key=aic._version_key)


def test_unsupported_rows_get_a_status_and_nan_not_an_exception(real_rows):
    base = real_rows.iloc[0].to_dict()
    bad = pd.DataFrame(
        [
            {**base, "system": "no_such_gpu"},
            {**base, "model_path": "nobody/no-such-model"},
            {**base, "gemm_quant_mode": "int3_magic"},
            {**base, "isl": float("nan")},
            {**base, "backend": "no_such_backend"},
        ],
        index=["system", "model", "gemm", "isl", "backend"],
    )
    out = aic.estimate_rows(bad)
    assert list(out.index) == list(bad.index)
    assert (out["aic_status"] != "ok").all(), out["aic_status"].to_dict()
    assert out[["aic_ttft_ms", "aic_tpot_ms"]].isna().all().all()
    assert "no perf data" in out.at["system", "aic_status"] and "no_such_gpu" in out.at["system", "aic_status"]
    assert "no cached model config" in out.at["model", "aic_status"]
    assert "int3_magic" in out.at["gemm", "aic_status"]
    for status in out["aic_status"]:
        assert "\n" not in status and len(status) <= 200


def _first(sample, **where) -> pd.DataFrame:
    pick = sample[sample["mode"] == "agg"]
    for column, value in where.items():
        pick = pick[pick[column] == value]
    assert not pick.empty, f"the sample has no agg row with {where}"
    return pick.iloc[[0]]


def test_moe_rows_run_with_the_precision_their_checkpoint_is_served_in(sample):
    rows = pd.concat(
        [
            # gpt-oss: labelled nvfp4, estimated from its MXFP4 checkpoint (bf16 GEMMs)
            _first(sample, model_path="openai/gpt-oss-120b", system="h200_sxm", backend="vllm"),
            # Kimi-K2.5's int4 rows: int4 experts, bf16 GEMMs
            _first(sample, model_path="moonshotai/Kimi-K2.5", system="h200_sxm", precision="int4"),
            # GLM-5's FP8 rows run on its FP8 release, whose config puts the KV cache in fp8
            _first(sample, model_path="zhipuai/GLM-5", system="h200_sxm", precision="fp8"),
        ]
    )
    out = aic.estimate_rows(rows)
    assert (out["aic_status"] == "ok").all(), out["aic_status"].to_list()
    quant = out["aic_quant"].to_list()
    assert quant[0].startswith("gemm=bfloat16 kv=bfloat16")
    assert quant[1].startswith("gemm=bfloat16 ")
    assert quant[2].startswith("gemm=fp8 kv=fp8")
    ratio = out["aic_tpot_ms"] / rows["silicon_tpot_ms"]
    assert ratio.between(0.2, 5.0).all(), ratio.to_dict()


def test_a_disaggregated_row_is_estimated_from_its_prefill_and_decode_workers(sample):
    from kvbench.validation.silicon import admitted

    rows, _ = admitted(sample[sample["mode"] == "disagg"])
    row = rows[(rows["system"] == "h200_sxm") & (rows["backend"] == "trtllm")].iloc[[0]]
    out = aic.estimate_rows(row).iloc[0]
    assert out["aic_status"] == "ok" and out["aic_ttft_ms"] > 0 and out["aic_tpot_ms"] > 0
    # aiconfigurator's disagg TTFT and TPOT do not read the worker counts (they enter its throughput)
    more = row.assign(prefill_num_workers=7.0, decode_num_workers=9.0)
    again = aic.estimate_rows(more).iloc[0]
    assert math.isclose(again["aic_ttft_ms"], out["aic_ttft_ms"], rel_tol=1e-9)
    assert math.isclose(again["aic_tpot_ms"], out["aic_tpot_ms"], rel_tol=1e-9)
    # a larger decode batch per rank costs more per token
    bigger = aic.estimate_rows(row.assign(decode_batch_size=row["decode_batch_size"] * 8)).iloc[0]
    assert bigger["aic_tpot_ms"] > out["aic_tpot_ms"] * 1.01
    assert math.isclose(bigger["aic_ttft_ms"], out["aic_ttft_ms"], rel_tol=1e-9)
