"""kvbench validate: silicon rows replayed on both clocks, errors per group, files and one-line errors."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hang import HANG_S

from kvbench.errors import ConfigError
from kvbench.validation.silicon import MODELS, admitted, read_silicon, replay, select
from kvbench.validation.validate import run_validation


def test_the_admitted_rows_are_dense_aggregated_and_modelled():
    frame, source = read_silicon()
    rows, refused = admitted(frame)
    assert len(rows) >= 700 and "silicon_sample.csv" in source
    assert set(rows["mode"]) == {"agg"} and set(rows["model_path"]) <= set(MODELS)
    assert rows["tp_size"].between(1, 8).all()
    if len(refused):  # the package's full sample: MoE and disaggregated rows are counted, not replayed
        assert "disaggregated" in refused.index


def test_a_row_replays_its_precision_parallelism_and_client():
    rows, _ = admitted(read_silicon()[0])
    row = rows[(rows["precision"] == "fp8") & (rows["tp_size"] == 2)].iloc[0]
    job = replay(row, "profiled")
    assert "model.tp=2" in job.overrides and "model.kv_dtype=float8" in job.overrides
    assert f"workload.max_concurrency={int(row['batch_size'])}" in job.overrides
    assert f"workload.prompt_tokens={int(row['isl'])}" in job.overrides
    assert "kernel=torch" in replay(row, "roofline").overrides


def test_run_validation_predicts_every_row_on_both_clocks():
    v = run_validation(backends=["trtllm"], limit=3, workers=1, with_aic=False)
    assert len(v.rows) == 3
    assert set(v.rows["profiled_status"]) == {"ok"} and set(v.rows["roofline_status"]) == {"ok"}
    for clock in ("profiled", "roofline"):
        for metric in ("ttft", "tpot"):
            assert (v.rows[f"{clock}_{metric}_ms"] > 0).all()
            assert v.rows[f"{clock}_{metric}_ape"].map(math.isfinite).all()
    assert v.groups["rows"].sum() == 3
    assert list(v.headline["subset"])[-1] == "all"


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
    assert "TP1 profiled" in done.stdout or "TP>1" in done.stdout
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
    assert "already holds a complete result (kvbench validate --backend vllm" in again.stderr
    assert (out / "COMPLETE").read_text() == marker


@pytest.mark.parametrize("args", [["--limit", "0"], ["--bogus"], ["model=llama3.1-8b"]])
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
