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
from kvbench_cli import assert_one_line_error, kvbench, main_without

import kvbench.app.checks as checks_module
from kvbench.api import compose, run
from kvbench.app.checks import MEMORY_BASE_BYTES, MEMORY_BYTES_PER_REQUEST
from kvbench.app.config import check_numbers
from kvbench.app.run import setup
from kvbench.errors import ConfigError

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
        (["calibration_dir={tmp}/calibrations"], ["triton.json", "efficiency['16']=1.2", "[0.001, 1]"]),  # 5.
        (["workload.num_requests=10000000000"], ["workload.num_requests=10000000000", "GB of memory"]),  # 6.
        (["+foo=1"], ["foo=1", "top-level keys are", "seed"]),  # 7.
        # a label the run does not have: the preset's name without the preset
        (["engine.name=vllm_v1"], ["engine.name=vllm_v1", "pick the preset with engine=vllm_v1"]),
        (["-m", "hydra.sweeper.max_batch_size=0"], ["hydra.sweeper.max_batch_size=0 is invalid", ">= 1"]),
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
    per = MEMORY_BYTES_PER_REQUEST["synthetic"]
    monkeypatch.setattr(checks_module, "_available_memory_bytes", lambda: MEMORY_BASE_BYTES + 1000 * per)
    run([*SMALL, "workload.num_requests=1000"])
    with pytest.raises(
        ConfigError, match=rf"workload.num_requests=1001 needs about 0.3 GB of memory \(250 MB \+ 1,001 x {per:,} B"
    ):
        setup(compose(["workload.num_requests=1001"])[0])
    branched = per + 3 * checks_module.MEMORY_BYTES_PER_EXTRA_BRANCH
    setup(compose([f"workload.num_requests={1000 * per // branched}", "workload.num_branches=4"])[0])
    with pytest.raises(ConfigError, match=r"workload.num_requests=\d+ with workload.num_branches=4 needs .*4 branches"):
        setup(compose([f"workload.num_requests={1000 * per // branched + 1}", "workload.num_branches=4"])[0])
    setup(compose(["workload.num_requests=1001", "check_memory=false"])[0])  # the way to go on anyway


def test_a_trace_is_counted_before_it_is_read(monkeypatch):
    # the packaged Azure conversation trace, counted without parsing
    from kvbench_plugins.workloads.trace import TRACES_DIR

    rows = len(pd.read_csv(TRACES_DIR / "azure_llm_2023_conv.csv"))
    per = MEMORY_BYTES_PER_REQUEST["trace"]
    monkeypatch.setattr(checks_module, "_available_memory_bytes", lambda: MEMORY_BASE_BYTES + (rows - 1) * per)
    with pytest.raises(
        ConfigError, match=rf"the {rows:,} rows of workload.path=azure_llm_2023_conv.csv needs about .*replayed trace"
    ):
        setup(compose(["workload=azure_conv"])[0])
    setup(compose(["workload=azure_conv", f"workload.num_requests={rows - 1}"])[0])


def test_prefix_caching_and_fan_out_raise_the_estimate():
    plain, _ = checks_module.memory_estimate(10_000, trace=True, branches=1, prefix_cached=False)
    cached, words = checks_module.memory_estimate(10_000, trace=True, branches=1, prefix_cached=True)
    fanned, _ = checks_module.memory_estimate(10_000, trace=False, branches=4, prefix_cached=False)
    synthetic, _ = checks_module.memory_estimate(10_000, trace=False, branches=1, prefix_cached=False)
    base = checks_module.MEMORY_BASE_BYTES
    assert cached - base > 20 * (plain - base) and "prefix hashes under prefix caching" in words
    assert fanned == synthetic + 10_000 * 3 * checks_module.MEMORY_BYTES_PER_EXTRA_BRANCH


@pytest.mark.parametrize(
    "lines, files, headroom",
    [
        ("0::/job\n", {"job/memory.max": "1000000", "job/memory.current": "250000"}, 750_000),  # cgroup v2
        ("0::/job\n", {"job/memory.max": "max", "job/memory.current": "250000"}, None),  # v2, no limit
        (
            "4:memory:/job\n0::/\n",
            {"memory/job/memory.limit_in_bytes": "4096", "memory/job/memory.usage_in_bytes": "96"},
            4000,
        ),  # v1
        (
            "4:memory:/job\n",
            {"memory/job/memory.limit_in_bytes": str(2**63 - 4096), "memory/job/memory.usage_in_bytes": "1"},
            None,
        ),
        ("0::/job\n", {"unified/job/memory.max": "2000", "unified/job/memory.current": "500"}, 1500),  # hybrid host
    ],
)
def test_the_cgroup_limit_is_read_where_it_binds(tmp_path, lines, files, headroom):
    (tmp_path / "cgroup").write_text(lines)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text + "\n")
    assert checks_module._cgroup_headroom_bytes(tmp_path / "cgroup", tmp_path / "fs") == headroom


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
    with pytest.raises(
        ConfigError, match=r"about 40.4 GB while initialising, more than the 24.0 GB .*model=tiny-llama"
    ):
        check_real_model_memory(seven_b)
    monkeypatch.setattr(checks_module, "_available_memory_bytes", lambda: 64 * 10**9)
    check_real_model_memory(seven_b)  # fits there


# --- the command line itself --------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--frobnicate"], ["unrecognized option '--frobnicate'", "kvbench --help"]),
        (["--multirn", "allocator=naive"], ["unrecognized option '--multirn'", "did you mean --multirun?"]),
        (["--cfg", "everything"], ["argument --cfg/-c: invalid choice: 'everything'"]),
        (["progress=2"], ["progress=2 is invalid: use true or false"]),
        (["-m", "output.steps=true,2"], ["output.steps=2 is invalid: use true or false"]),
        (["allocator.prefix_caching=2"], ["allocator.prefix_caching=2 is invalid: use true or false"]),
        (["allocator=" + "a" * 100_000], ["(100,010 characters) is too long", "255 bytes"]),
        (["bench-kernels", "foo=1"], ["kvbench bench-kernels: error: foo=1 is not a config key"]),
        (["bench-kernels", "--bogus"], ["kvbench bench-kernels: error: unrecognized option '--bogus'"]),
    ],
)
def test_a_bad_command_line_is_one_line_without_a_usage_block(tmp_path, args, fragments):
    proc = kvbench(*args, *SMALL, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "usage:" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_control_characters_in_an_override_are_shown_escaped_never_sent_to_the_terminal(tmp_path):
    proc = kvbench("workload=request_csv", "workload.path=a\tb\x1b[31mred\x07", *SMALL, cwd=tmp_path)
    assert proc.returncode == 2
    assert not any(ch in proc.stderr for ch in "\t\x1b\x07"), repr(proc.stderr)
    assert "a\\tb\\x1b[31mred\\x07" in proc.stderr


def test_real_mode_loads_safetensors_only_and_damaged_weights_are_one_line(tmp_path):
    from kvbench.exec.real.model import load_model

    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")  # a pickle: may run code
    with pytest.raises(ConfigError, match=r"holds only pickled PyTorch weights .*\(a pickle can run code\)"):
        load_model(tmp_path / "pickled", "float32")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 8,
                "intermediate_size": 16,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "num_hidden_layers": 1,
                "vocab_size": 32,
            }
        )
    )
    (tmp_path / "damaged" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    with pytest.raises(ConfigError, match=r"its weights cannot be loaded \(.*\); re-save them") as caught:
        load_model(tmp_path / "damaged", "float32")
    assert "\n" not in str(caught.value)


def test_real_mode_without_torch_is_one_line_naming_the_extra(tmp_path):
    proc = kvbench(
        "mode=real", "model=tiny-llama", "kernel=torch", "workload=real_smoke", cwd=tmp_path, code=main_without("torch")
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "kvbench: error: mode=real runs a model with torch and transformers (torch not installed): "
        "pip install -e '.[real]' in a clone (pip install 'kvbench[real]' otherwise), or use mode=sim"
    ]


def test_a_sliding_window_model_is_refused_in_real_mode():
    # the real kernels attend to every cached token: the window would be silently ignored
    cfg, _ = compose(["mode=real", "model=mistral-7b-v0.1", "kernel=torch", "workload=real_smoke"])
    with pytest.raises(ConfigError, match="mode=real cannot run mistral-7b-v0.1 yet: its sliding-window layers"):
        setup(cfg)
    twin, _ = compose(["model=mistral-7b-v0.1", "model.hf_config.sliding_window=null"])
    assert setup(twin).model.kv_groups == ()  # the full-attention twin has no groups to refuse


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["engine.name=vllm_v1"], r"^engine.name=vllm_v1 would label the run vllm_v1 but it runs engine=kvbench's"),
        (["engine.name=nano_vllm", "engine=vllm_v1"], r"pick the preset with engine=nano_vllm"),
        (["engine.name=mine"], r"engine.name=mine .* pick an engine preset with engine=<preset> \(kvbench, nano_vllm"),
    ],
)
def test_an_engine_name_without_its_preset_is_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        run([*overrides, "workload.num_requests=5", "output.write=false"])


def test_an_engine_preset_runs_under_its_own_name():
    assert run(["engine=vllm_v1", "workload.num_requests=5"]).summary["engine"] == "vllm_v1"
    # the name the preset sets, said again, is no contradiction
    assert run(["engine=vllm_v1", "engine.name=vllm_v1", "workload.num_requests=5"]).summary["engine"] == "vllm_v1"


def test_an_allocator_layer_count_other_than_the_model_s_is_refused():
    with pytest.raises(ConfigError, match=r"^allocator.num_layers=16 but llama2-7b has 32 layers: .* leave"):
        setup(compose(["allocator=vattention", "allocator.num_layers=16"])[0])
    assert setup(compose(["allocator=vattention"])[0]).allocator.config.num_layers == 32  # follows the model
    assert setup(compose(["allocator=vattention", "model=tiny-llama"])[0]).allocator.config.num_layers == (
        compose(["model=tiny-llama"])[0].model.hf_config.num_hidden_layers
    )


# Llama-2-7B's block: 16 tokens x 524,288 B a token = 8,388,608 B; one byte less holds none
@pytest.mark.parametrize("host_bytes", [1.5, 1, 8388607])
def test_a_host_tier_smaller_than_one_block_is_refused(host_bytes):
    with pytest.raises(ConfigError, match=r"^allocator.host_cache_bytes=.* holds no block: one block is 8388608 bytes"):
        setup(compose(["allocator=paged_cached", f"allocator.host_cache_bytes={host_bytes}"])[0])
    built = setup(compose(["allocator=paged_cached", "allocator.host_cache_bytes=8388608"])[0])
    assert built.allocator.host_cache.capacity_blocks == 1
