"""The `kvbench` command as a user runs it: sweeps, one table, one-line errors, outside plugins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from kvbench_cli import assert_one_line_error, kvbench

SMALL = ["workload.num_requests=40", "wandb.mode=disabled", "progress=false"]
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "outside_plugin"


def test_sweep_runs_four_jobs_and_prints_one_table(tmp_path):
    proc = kvbench("-m", "allocator=naive,paged", "kernel=triton,flashinfer", *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("kvbench comparison (4 jobs)") == 1
    # no GPU measured either kernel on H100: each is priced by the transfer, and the line above the
    # table gives its sources and held-out error (kvbench.exec.transfer)
    said = " ".join(proc.stdout.split())
    assert "no GPU measured these kernels on h100-sxm: priced by a transfer" in said
    assert "kernel=flashinfer from l40s, rtx_pro_6000_server (held-out median" in said
    assert "kernel=triton from" in said and "run at the same simulated speed" not in said
    [sweep] = list((tmp_path / "results" / "multirun").glob("*/*"))
    table = pd.read_csv(sweep / "comparison.csv")
    assert len(table) == 4 and set(table["allocator"]) == {"naive", "paged"}
    assert set(table["kernel"]) == {"triton", "flashinfer"} and table["calibration"].str.startswith("transfer:").all()
    # the two kernels now differ: their transferred decode attention does
    by_kernel = table[table["allocator"] == "paged"].set_index("kernel")["tpot_p50_s"]
    assert by_kernel["triton"] != by_kernel["flashinfer"]
    assert (sweep / "comparison.png").is_file()
    # sustained beside peak, whole-run beside saturated, and the unfilled tail as its own column
    # (headers are a name line and a unit line, so the words are checked one by one)
    for word in ("peak", "floor", "(sat.)", "util.", "unfilled", "% KV"):
        assert word in proc.stdout
    assert {"min_concurrency_saturated", "utilization_mean", "mean_tail_waste_tokens_per_seq"} <= set(table)
    for job in range(4):
        assert (sweep / str(job) / "summary.parquet").is_file() and (sweep / str(job) / "memory.png").is_file()


def test_a_single_run_writes_parquet_csv_config_and_figure(tmp_path):
    proc = kvbench("allocator=naive", *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [run_dir] = list((tmp_path / "results" / "runs").glob("*/*"))
    for name in ("summary", "requests", "steps", "refusals"):
        assert (run_dir / f"{name}.parquet").is_file() and (run_dir / f"{name}.csv").is_file()
    assert (run_dir / "config.json").is_file() and (run_dir / "memory.png").is_file()
    assert "peak concurrency" in proc.stdout


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["allocator=pagd"], ["allocator='pagd'", "naive", "paged"]),
        (["allocator.block_size_tokens=7"], ["allocator.block_size_tokens=7", "power of two from 8 to 256"]),
        (["workload.arrival=poisson", "workload.rate_per_s=-2"], ["workload.rate_per_s=-2", "positive"]),
        (["allocator=naive", "workload.prompt_tokens=5000"], ["5000", "S_max"]),
        (["workload.rat=3"], ["workload.rat=3", "rate_per_s"]),
        # refused either way on a CPU: triton needs a GPU, or (under the Triton interpreter, which some
        # tests switch on for the whole process) Llama-2-7B's weights do not fit this machine
        (["mode=real"], ["mode=", "real"]),
        (["seed=abc"], ["seed=abc", "Integer"]),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, fragments):
    assert_one_line_error(kvbench(*args, *SMALL, cwd=tmp_path), *fragments)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["compar", "a", "b"], ["'compar' is neither a kvbench subcommand", "did you mean `compare`?", "slo-batch"]),
        (["slo_batch"], ["did you mean `slo-batch`?", "subcommands: bench-kernels, calibrate"]),
        (["frobnicate"], ["'frobnicate' is neither a kvbench subcommand nor a key=value override; subcommands:"]),
        (["--tpot-ms", "20"], ["write slo.tpot_s=0.02 for --tpot-ms 20"]),
        (["preemption.victim=newst"], ["preemption.victim='newst' is invalid: did you mean `newest`? choose one of"]),
        (["wandb.mode=ofline"], ["wandb.mode='ofline' is invalid: did you mean `offline`? choose one of"]),
    ],
)
def test_a_near_miss_gets_a_suggestion_in_its_one_line(tmp_path, args, fragments):
    assert_one_line_error(kvbench(*args, cwd=tmp_path), *fragments, status=2)


def test_a_bad_job_does_not_stop_the_sweep(tmp_path):
    proc = kvbench("-m", "allocator.block_size_tokens=16,7,32", *SMALL, cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    [sweep] = list((tmp_path / "results" / "multirun").glob("*/*"))
    table = pd.read_csv(sweep / "comparison.csv")
    assert len(table) == 3
    failed = table[table["failed"]]
    assert len(failed) == 1 and "power of two" in failed["error"].iloc[0]
    assert "failed" in proc.stdout


@pytest.fixture
def outside_plugin():
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "install", "--quiet", "--no-deps", "--no-build-isolation", str(FIXTURE)], check=True)
    yield
    subprocess.run([*pip, "uninstall", "--quiet", "--yes", "kvbench-outside-example"], check=True)


def test_an_outside_distribution_adds_an_allocator(tmp_path, outside_plugin):
    proc = kvbench("allocator=lifo_paged", *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [run_dir] = list((tmp_path / "results" / "runs").glob("*/*"))
    assert pd.read_parquet(run_dir / "summary.parquet")["allocator"].iloc[0] == "lifo_paged"


def test_tab_completion_offers_an_outside_distribution_s_options(tmp_path, outside_plugin):
    # completion reads outside plugins' config folders without importing kvbench's own plugins
    import os

    env = {**os.environ, "COMP_LINE": "kvbench allocator=li", "COMP_POINT": "20"}
    code = "from kvbench.commands.main import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "-sc", "query=bash"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.split() == ["allocator=lifo_paged"], proc.stderr


def test_help_lists_every_config_group_with_its_options(tmp_path):
    proc = kvbench("--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert "scheduler: chunked, mixed, prefill_first, static" in proc.stdout
    assert "preemption: length_aware, recompute, swap" in proc.stdout
    assert "kvbench -m preemption=recompute,swap,length_aware scheduler=mixed,prefill_first,chunked" in proc.stdout


def test_version_is_kvbench_s_own(tmp_path):
    from kvbench.output.provenance import kvbench_version

    proc = kvbench("--version", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"kvbench {kvbench_version()}") and "Hydra" not in proc.stdout


def test_tab_completion_installs_and_completes_options(tmp_path):
    # the installed script: Hydra names the completed command after the program it runs as
    script_path = Path(sys.executable).parent / "kvbench"
    install = subprocess.run([str(script_path), "-sc", "install=bash"], cwd=tmp_path, capture_output=True, text=True)
    assert install.returncode == 0 and "-F hydra_bash_completion kvbench" in install.stdout
    script = tmp_path / "completion.sh"
    script.write_text(install.stdout)
    # bash accepts the script: the completion function is installed for the command
    shown = subprocess.run(["bash", "-c", f"source {script} && complete -p kvbench"], capture_output=True, text=True)
    assert "hydra_bash_completion" in shown.stdout, shown.stderr
    env = {"COMP_LINE": "kvbench allocator="}
    import os

    query = subprocess.run(
        [sys.executable, "-c", "from kvbench.commands.main import main; main()", "-sc", "query=bash"],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    assert query.returncode == 0
    assert {"allocator=naive", "allocator=paged", "allocator=per_request"} <= set(query.stdout.split())


def test_config_dir_and_search_path_add_options(tmp_path):
    own = tmp_path / "my_conf" / "allocator"
    own.mkdir(parents=True)
    (own / "paged32.yaml").write_text("name: paged\nblock_size_tokens: 32\n")
    by_dir = kvbench("-cd", str(tmp_path / "my_conf"), "allocator=paged32", *SMALL, cwd=tmp_path)
    by_path = kvbench(f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "allocator=paged32", *SMALL, cwd=tmp_path)
    for proc in (by_dir, by_path):
        assert proc.returncode == 0, proc.stderr
    blocks = {pd.read_parquet(p)["block_size_tokens"].iloc[0] for p in (tmp_path / "results").rglob("summary.parquet")}
    assert blocks == {32}


def test_list_values_with_commas_are_one_value(tmp_path):
    mix = "workload.s_max_mix=[{s_max_tokens:512,fraction:0.5},{s_max_tokens:4096,fraction:0.5}]"
    proc = kvbench("workload=exercise2_mix", "model=llama2-7b-32k", mix, *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [config] = list((tmp_path / "results").rglob("config.json"))
    import json

    assert json.loads(config.read_text())["workload"]["s_max_mix"] == [
        {"s_max_tokens": 512, "fraction": 0.5},
        {"s_max_tokens": 4096, "fraction": 0.5},
    ]


@pytest.mark.parametrize("allocators", ["pagd,paged", "paged,pagd"])
def test_every_value_of_a_sweep_is_checked_before_any_job_runs(tmp_path, allocators):
    # a misspelled option: refused whichever allocator comes first, and nothing ran
    proc = kvbench("-m", f"allocator={allocators}", *SMALL, cwd=tmp_path)
    assert_one_line_error(proc, "allocator='pagd' is not a known allocator", "did you mean `paged`?", status=2)
    assert not list(tmp_path.rglob("summary.parquet"))


def test_a_key_no_swept_allocator_has_is_refused_before_any_job_runs(tmp_path):
    # per_request and naive lack block_size_tokens, and neither has it: the line names who does
    proc = kvbench("-m", "allocator=per_request,naive", "allocator.block_size_tokens=32", *SMALL, cwd=tmp_path)
    assert_one_line_error(proc, "allocator.block_size_tokens=32", "it is a key of allocator=paged", status=2)
    assert not list(tmp_path.rglob("summary.parquet"))


def test_a_job_lost_by_a_launcher_is_one_line_then_the_table(tmp_path, capsys):
    from kvbench.commands import main as cli

    proc = kvbench("-m", "allocator=naive,paged", *SMALL, "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweep = tmp_path / "sweep"
    # job 1 as a killed worker leaves it: Hydra's .hydra/ folder and nothing else
    for path in (sweep / "1").iterdir():
        if path.is_file():
            path.unlink()
    with pytest.raises(SystemExit) as exit_info:
        cli._launcher_failed(RuntimeError("worker process died\nmore detail"), sweep)
    assert exit_info.value.code == 1
    out, err = capsys.readouterr()
    [line] = [line for line in err.splitlines() if line.startswith("kvbench: error:")]
    assert "RuntimeError: worker process died" in line and f"hydra.sweep.dir={sweep}" in line
    assert "incomplete" in out and "kvbench comparison (2 jobs)" in out


def test_kvbench_sweep_finished_gets_the_sweep_folder_and_its_table(tmp_path, capsys):
    from omegaconf import OmegaConf

    from kvbench import hookimpl
    from kvbench.commands import main as cli
    from kvbench.plugins import plugin_manager

    proc = kvbench("-m", "allocator=naive,paged", "seed=0,-1", *SMALL, "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # the seed=-1 jobs fail
    seen = []

    class Sink:
        @hookimpl
        def kvbench_sweep_finished(self, sweep_dir, comparison):
            seen.append((sweep_dir, comparison))

    sink = Sink()
    plugin_manager().register(sink)
    try:
        cli.ComparisonTable().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}}))
    finally:
        plugin_manager().unregister(sink)
    [(sweep_dir, frame)] = seen
    assert sweep_dir == tmp_path / "sweep" and len(frame) == 4
    assert sorted(frame["status"]) == ["failed", "failed", "ok", "ok"]
    assert len(cli.FAILED_JOBS) == 2  # what the command's exit status reports
    cli.FAILED_JOBS.clear()
