"""kvbench validate: silicon rows replayed on both clocks, errors per group, files and one-line errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest
from hang import HANG_S

from kvbench.errors import ConfigError
from kvbench.validation.silicon import MODELS, admitted, read_silicon, replay, select
from kvbench.validation.validate import run_validation

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def test_the_admitted_rows_are_aggregated_and_modelled():
    frame, source = read_silicon()
    rows, refused = admitted(frame)
    assert len(rows) >= 700 and "silicon_sample.csv" in source
    assert set(rows["mode"]) <= {"agg", "disagg"} and set(rows["model_path"]) <= set(MODELS)
    agg = rows[rows["mode"] == "agg"]
    gpus = agg["tp_size"] * agg["attention_dp_size"].fillna(1).clip(lower=1)
    assert gpus.between(1, 8).all()
    assert len(rows) + refused.sum() == len(frame)  # every row is replayed or counted
    if len(refused):  # the package's full sample: disaggregated rows without their workers are counted
        assert "unknown-workers" in refused.index


def test_the_disaggregated_rows_wait_for_the_deployment_loop_in_one_line():
    import kvbench.validation.validate as validate

    v = run_validation(models=["nvidia/Qwen3-32B-NVFP4"], limit=1, workers=1, with_aic=False)
    assert list(v.rows["mode"]) == ["disagg"]
    if not validate.config_exists("deployment", "disagg"):
        assert v.rows["profiled_status"].iloc[0] == validate.NO_DEPLOYMENT
        assert v.failed.sum() == 2  # a dense row: the profiled clock and the roofline
    assert "disagg" in set(v.headline["subset"]) and list(v.groups["mode"]) == ["disagg"]


def test_a_disaggregated_replay_beyond_max_tokens_is_not_run_and_says_so():
    import kvbench.validation.validate as validate

    v = run_validation(models=["nvidia/Qwen3-32B-NVFP4"], limit=1, workers=1, with_aic=False, max_tokens=10)
    status = v.rows["profiled_status"].iloc[0]
    assert status.startswith("not run: the replay simulates") and "above --max-tokens 10 " in status
    row = v.rows.iloc[0]
    tokens = validate.replay_tokens(validate.replay(row, "profiled").overrides)
    assert f"{tokens:,} output tokens" in status and tokens > 10


def test_a_row_replays_its_precision_parallelism_and_client():
    rows, _ = admitted(read_silicon()[0])
    # a dense per-tensor FP8 row: its checkpoint declares an FP8 KV cache
    dense = rows["model_path"].isin(["Qwen/Qwen3-32B", "meta-llama/Llama-3.1-70B"])
    row = rows[dense & (rows["precision"] == "fp8") & (rows["gemm_quant_mode"] == "fp8") & (rows["tp_size"] == 2)].iloc[
        0
    ]
    job = replay(row, "profiled")
    assert "model.tp=2" in job.overrides and "model.kv_dtype=float8" in job.overrides
    assert f"workload.max_concurrency={int(row['batch_size'])}" in job.overrides
    assert f"workload.prompt_tokens={int(row['isl'])}" in job.overrides
    assert "kernel=torch" in replay(row, "roofline").overrides


def test_run_validation_predicts_every_row_on_both_clocks():
    v = run_validation(models=[LLAMA_8B], backends=["trtllm"], limit=3, workers=1, with_aic=False)
    assert len(v.rows) == 3
    assert set(v.rows["profiled_status"]) == {"ok"} and set(v.rows["roofline_status"]) == {"ok"}
    for clock in ("profiled", "roofline"):
        for metric in ("ttft", "tpot"):
            assert (v.rows[f"{clock}_{metric}_ms"] > 0).all()
            assert v.rows[f"{clock}_{metric}_ape"].map(math.isfinite).all()
    assert v.groups["rows"].sum() == 3
    assert list(v.headline["subset"])[-1] == "all"


def test_the_tp_filter_keeps_those_rows_and_the_fitted_clocks_stand_beside_the_profiled_one():
    v = run_validation(models=[LLAMA_8B], backends=["trtllm"], tps=[1], limit=3, workers=1, with_aic=False)
    assert set(v.rows["tp_size"]) == {1} and len(v.rows) == 3
    assert (v.rows["profiled_ttft_steps"] >= 1).all() and (v.rows["profiled_tpot_steps"] >= 1).all()
    # one group of its framework: nothing is left to fit its held-out h on
    assert (v.rows["heldout_h_s"] == 0).all() and (v.rows["heldout_tpot_ms"] == v.rows["profiled_tpot_ms"]).all()
    assert v.fits["trtllm"].rows == 3
    line = v.headline[v.headline["subset"] == "TP1"].iloc[0]
    assert {"profiled_ttft_median", "heldout_ttft_median", "insample_tpot_median"} <= set(line.index)


def test_a_filter_that_matches_nothing_is_one_line():
    rows, _ = admitted(read_silicon()[0])
    with pytest.raises(ConfigError) as err:
        select(rows, None, None, ["tensorrt"], None)
    assert "--backend 'tensorrt'" in str(err.value) and "\n" not in str(err.value)


def test_the_command_writes_tables_and_the_parity_figure(tmp_path):
    out = tmp_path / "v"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvbench.commands.validate",
            "--model",
            "meta-llama/Llama-3.1-70B",
            "--system",
            "h100_sxm",
            "--backend",
            "vllm",
            "--limit",
            "2",
            "--workers",
            "1",
            "--no-aic",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    assert "with a profiled median TPOT error above" in done.stdout and "fitted: one per-step host" in done.stdout
    assert "+h held-out" in done.stdout and "+h in-sample" in done.stdout and "profiled h=0" in done.stdout
    said = " ".join(done.stdout.split())  # the console wraps its lines at the terminal's width
    assert "vllm: step_overhead_s = " in said and "leave-one-group-out held-out median error" in said
    record = json.loads((out / "validate.json").read_text())
    assert record["fitted"].startswith("fitted: one per-step host overhead h per framework")
    assert record["schedulers"] == "shared"
    assert record["client"]["waves"] == 5 and record["client"]["warmup_waves"] == 0 and record["client"]["desync"] == 0
    assert set(record["step_overhead_s"]) == {"vllm"} and record["step_overhead_s"]["vllm"]["rows"] == 2
    assert record["step_overhead_sources"][0].startswith("vllm: step_overhead_s = ")
    headline = pd.read_csv(out / "headline.csv")
    for clock in ("profiled", "heldout", "insample"):
        for metric in ("ttft", "tpot"):
            assert f"{clock}_{metric}_median" in headline.columns
    for name in ("rows.csv", "groups.csv", "headline.csv", "parity.png", "COMPLETE"):
        assert (out / name).is_file()
    # the same --out again: a complete result is never overwritten, said in one line before any replay
    marker = (out / "COMPLETE").read_text()
    again = subprocess.run(
        [sys.executable, "-m", "kvbench.commands.validate", "--limit", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stderr
    assert "already holds a complete result (kvbench validate --model meta-llama/Llama-3.1-70B" in again.stderr
    assert (out / "COMPLETE").read_text() == marker


@pytest.mark.parametrize(
    "args",
    [
        ["--limit", "0"],
        ["--bogus"],
        ["model=llama3.1-8b"],
        ["--max-tokens", "-1"],
        ["--waves", "0"],
        ["--warmup-waves", "5"],
        ["--warmup-waves", "-1"],
        ["--desync", "2"],
        ["--desync", "nan"],
        ["--tp", "0"],
        ["--tp", "3"],
        ["--schedulers", "vllm"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kvbench.commands.validate", *args, "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_profiles_lists_the_measured_kernels_per_gpu():
    done = subprocess.run(
        [sys.executable, "-m", "kvbench.commands.profiles", "--hardware", "h200"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    for name in ("vllm_fa3", "sglang_fa3", "trtllm"):
        assert name in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "kvbench.commands.profiles", "--hardware", "a100-40gb"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert bad.returncode == 2 and "no public measured tables" in bad.stderr


def _scored(architectures: dict[str, list[float]]):
    """Rows of the given architectures whose profiled TPOT is off by the given fractions (TTFT exact)."""
    import pandas as pd

    records = []
    for arch, errors in architectures.items():
        for i, error in enumerate(errors):
            records.append(
                {
                    "architecture": arch,
                    "mode": "agg",
                    "tp_size": 1 + i % 2,
                    "silicon_ttft_ms": 100.0,
                    "silicon_tpot_ms": 10.0,
                    "profiled_ttft_ms": 100.0,
                    "profiled_tpot_ms": 10.0 * (1 + error),
                }
            )
    rows = pd.DataFrame.from_records(records)
    for metric in ("ttft", "tpot"):
        rows[f"profiled_{metric}_ape"] = (rows[f"profiled_{metric}_ms"] - rows[f"silicon_{metric}_ms"]).abs() / rows[
            f"silicon_{metric}_ms"
        ]
    return rows


def test_the_headline_has_one_line_per_architecture_then_all_moe():
    from kvbench.validation.validate import headline

    rows = _scored({"dense": [0.1, 0.3, 0.2], "mla-moe": [0.4, -0.4], "linear-hybrid-moe": [0.05]})
    table = headline(rows, ["profiled"]).set_index("subset")
    assert list(table.index) == ["dense", "mla-moe", "linear-hybrid-moe", "all MoE", "TP1", "TP>1", "all"]
    assert list(table["rows"]) == [3, 2, 1, 3, 4, 2, 6]
    assert table.at["dense", "profiled_tpot_median"] == pytest.approx(0.2, rel=1e-6)
    assert table.at["mla-moe", "profiled_tpot_median"] == pytest.approx(0.4, rel=1e-6)
    assert table.at["all MoE", "profiled_tpot_median"] == pytest.approx(0.4, rel=1e-6)
    assert table.at["all", "profiled_ttft_median"] == pytest.approx(0.0, abs=1e-9)


def test_the_parity_figure_gives_each_architecture_its_colour(tmp_path):
    from matplotlib.colors import to_hex

    from kvbench.validation.validate import ARCHITECTURES, parity_figure

    rows = _scored({"dense": [0.1, 0.2], "moe": [0.3], "window-sinks-moe": [0.2, 0.1]})
    fig = parity_figure(rows, ["profiled", "roofline"])
    path = tmp_path / "parity.png"
    fig.savefig(path)
    assert path.stat().st_size > 10_000
    assert len(fig.axes) == 2  # one row of panels: the profiled clock (the roofline is in the tables)
    for ax in fig.axes:
        colours = {c.get_label().split(" ")[0]: to_hex(c.get_facecolor()[0]) for c in ax.collections}
        assert colours == {a: to_hex(ARCHITECTURES[a]) for a in ("dense", "moe", "window-sinks-moe")}


def test_a_moe_row_is_replayed_on_the_profiled_clock_only():
    # kvbench prices a MoE/MLA/linear model from measured tables under any kernel, so a kernel=torch
    # replay of it would not be the roofline
    from kvbench.validation.validate import replay_jobs

    row = {
        "id": "r",
        "backend": "trtllm",
        "system": "h200_sxm",
        "mode": "agg",
        "precision": "fp8",
        "gemm_quant_mode": "fp8",
        "moe_quant_mode": "fp8",
        "isl": 1024,
        "osl": 128,
        "batch_size": 8.0,
        "tp_size": 8.0,
        "pp_size": 1.0,
        "attention_dp_size": 1.0,
        "moe_tp_size": 1.0,
        "moe_ep_size": 8.0,
        "silicon_ttft_ms": 100.0,
        "silicon_tpot_ms": 10.0,
    }
    rows = pd.DataFrame(
        [
            {**row, "model_path": LLAMA_8B, "architecture": "dense"},
            {**row, "model_path": "deepseek-ai/DeepSeek-R1", "architecture": "mla-moe"},
        ]
    )
    assert len(admitted(rows)[0]) == 2
    jobs = replay_jobs(rows)
    assert [(i, clock) for i, clock, _ in jobs] == [(0, "profiled"), (0, "roofline"), (1, "profiled")]
