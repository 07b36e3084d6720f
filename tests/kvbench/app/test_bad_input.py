"""Every bad input is one line naming the key: never a traceback, never silently wrong numbers.

The CLI cases run ``kvbench`` in a subprocess (a few seconds each), one per kind of check; the
variants of each check are in-process tests here and beside the checked code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import kvbench.app.checks as checks_module
from kvbench.api import compose, run
from kvbench.app.checks import MEMORY_BYTES_PER_REQUEST
from kvbench.app.config import check_numbers
from kvbench.app.run import setup
from kvbench.errors import ConfigError
from kvbench_cli import assert_one_line_error, kvbench

SMALL = ["workload.num_requests=20", "wandb.mode=disabled", "progress=false"]



def assert_refused(proc: subprocess.CompletedProcess, cwd: Path, *fragments: str) -> None:
    """One ``kvbench: error:`` line, exit 2, and no result left behind."""
    assert_one_line_error(proc, *fragments, status=2)
    assert not list((cwd / "results").rglob("summary.parquet")), "a failed run left a results folder"


@pytest.fixture
def bad_files(tmp_path) -> Path:
    """A JSON array where a model config.json should be, and a calibration above 100% of the bandwidth."""
    (tmp_path / "array.json").write_text("[1, 2]")
    (tmp_path / "calibrations" / "h100-sxm").mkdir(parents=True)
    (tmp_path / "calibrations" / "h100-sxm" / "triton.json").write_text(json.dumps({"efficiency": {"16": 1.2}}))
    return tmp_path


# the small-workload args come first, so that each case's own value wins
@pytest.mark.parametrize(
    "args, fragments",
    [
        (["seed=-1"], ["seed=-1", "2**63-1"]),  # 1. numpy's ValueError traceback before
        (["hardware.hbm_bandwidth_bytes_per_s=inf"], ["hardware.hbm_bandwidth_bytes_per_s=inf", "finite"]),  # 2.
        (["model.hf_config.num_hidden_layers=0"], ["model.hf_config.num_hidden_layers=0", "positive integer"]),  # 3.
        (["model.config_path={tmp}/array.json"], ["model.config_path=", "JSON list, not an object"]),
        (["hardware.name=../../etc"], ["hardware.name='../../etc'"]),  # 4.
        (["calibration_dir={tmp}/calibrations"], ["triton.json", "efficiency['16']=1.2", "(0, 1]"]),  # 5.
        (["workload.num_requests=10000000000"], ["workload.num_requests=10000000000", "GB of memory"]),  # 6.
        (["+foo=1"], ["foo=1", "top-level keys are", "seed"]),  # 7.
    ],
)
def test_bad_input_is_one_line_and_leaves_no_results(bad_files, args, fragments):
    args = [a.replace("{tmp}", str(bad_files)) for a in args]
    cwd = bad_files / "cwd"
    cwd.mkdir()
    assert_refused(kvbench(*SMALL, *args, cwd=cwd), cwd, *fragments)


def test_a_bad_seed_fails_its_job_not_the_sweep(tmp_path):
    proc = kvbench("-m", *SMALL, "seed=-1,0", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    [sweep] = list((tmp_path / "results" / "multirun").glob("*/*"))
    assert (sweep / "1" / "summary.parquet").is_file() and not (sweep / "0" / "summary.parquet").exists()
    table = pd.read_csv(sweep / "comparison.csv")
    failed = table[table["failed"]]
    assert len(failed) == 1 and "seed=-1 is invalid" in failed["error"].iloc[0]


# --- the same checks, in process ---------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, 2**63, 10**30])
def test_seed_outside_int64_is_refused_before_simulating(seed):
    with pytest.raises(ConfigError, match=rf"seed={seed} is invalid"):
        setup(compose([f"seed={seed}"])[0])


def test_largest_seed_runs():
    assert run([*SMALL, f"seed={2**63 - 1}"]).summary["seed"] == 2**63 - 1


@pytest.mark.parametrize(
    "override, key",
    [
        ("hardware.kv_budget_bytes=inf", "hardware.kv_budget_bytes=inf"),
        ("hardware.dense_flops_per_s=nan", "hardware.dense_flops_per_s=nan"),
        ("workload.prompt_sigma=inf", "workload.prompt_sigma=inf"),
        ("scheduler.watermark_fraction=nan", "scheduler.watermark_fraction=nan"),
        ("slo.ttft_s=inf", "slo.ttft_s=inf"),
        ("kernel.tile_tokens=9223372036854775808", "kernel.tile_tokens=9223372036854775808"),
        ("+model.hf_config.rope_theta=inf", "model.hf_config.rope_theta=inf"),
    ],
)
def test_every_numeric_option_is_finite_and_int64(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        setup(compose([override])[0])


def test_check_numbers_names_nested_keys():
    check_numbers({"a": [1, 2.5, None, True], "b": {"c": "text"}}, "group")  # all fine
    with pytest.raises(ConfigError, match=r"group\.a\[1\]\.x=nan is invalid: use a finite number"):
        check_numbers({"a": [{"x": 1.0}, {"x": float("nan")}]}, "group")
    with pytest.raises(ConfigError, match=r"group\.n=-9223372036854775809 is invalid"):
        check_numbers({"n": -(2**63) - 1}, "group")


@pytest.mark.parametrize(
    "override, match",
    [
        ("+foo=1", r"foo=1 is not a kvbench config key; the top-level keys are: model, .*calibration_dir"),
        ("+slo.foo=1", r"slo.foo is not a config key of slo; its keys are: ttft_s, tpot_s, e2e_s"),
        ("+output.foo=1", r"output.foo is not a config key of output"),
        ("+allocator.foo=1", r"allocator.foo: Key 'foo' not in 'PagedConfig'"),
    ],
)
def test_a_key_added_with_plus_is_refused(override, match):
    with pytest.raises(ConfigError, match=match):
        setup(compose([override])[0])


def test_a_run_too_big_for_memory_is_refused_up_front(monkeypatch):
    monkeypatch.setattr(checks_module, "_available_memory_bytes", lambda: 1000 * MEMORY_BYTES_PER_REQUEST)
    run([*SMALL, "workload.num_requests=1000"])
    with pytest.raises(ConfigError, match=r"workload.num_requests=1001 needs about 0.0 GB of memory \(4,181 B per"):
        setup(compose(["workload.num_requests=1001"])[0])
    with pytest.raises(ConfigError, match=r"workload.num_requests=800 with workload.num_branches=4 needs .* per extra branch"):
        setup(compose(["workload.num_requests=800", "workload.num_branches=4"])[0])


def test_where_memory_is_unknown_there_is_no_check(monkeypatch):
    monkeypatch.setattr(checks_module, "_available_memory_bytes", lambda: None)
    setup(compose(["workload.num_requests=10000000000"])[0])  # only sets up: nothing is generated


def test_available_memory_is_known_on_linux():
    if sys.platform.startswith("linux"):
        assert checks_module._available_memory_bytes() > 0


@pytest.mark.parametrize("name", ["..", "a/b", "-x", ".hidden", "a..b", "x" * 65, "a b", ""])
def test_names_that_become_paths_are_checked(name):
    for key in ("hardware.name", "model.name"):
        with pytest.raises(ConfigError, match=rf"{key}=.* is invalid: use 1 to 64 letters"):
            setup(compose([f"{key}='{name}'"])[0])


def test_calibration_dir_that_does_not_exist_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"calibration_dir='.*missing' is invalid: no such folder"):
        setup(compose([f"calibration_dir={tmp_path / 'missing'}"])[0])


def test_real_mode_refuses_a_model_too_big_to_build_here(monkeypatch):
    from kvbench.app.checks import check_real_model_memory
    from kvbench.specs.model import ModelSpec

    seven_b = ModelSpec("llama2-7b", 32, 32, 32, 128, 2, 6_738_415_616)
    monkeypatch.setattr(checks_module, "_available_memory_bytes", lambda: 24 * 10**9)
    with pytest.raises(ConfigError, match=r"about 40.4 GB while initialising, more than the 24.0 GB .*model=tiny-llama"):
        check_real_model_memory(seven_b)
    monkeypatch.setattr(checks_module, "_available_memory_bytes", lambda: 64 * 10**9)
    check_real_model_memory(seven_b)  # fits there
