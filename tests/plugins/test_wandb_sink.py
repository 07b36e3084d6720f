"""The W&B sink: off by default and an optional extra; offline when asked (no account, no
network), with the command that uploads the runs; a no-op when disabled; runs a team can browse: a
sweep's runs grouped and named by what they vary, tables and figures logged.

W&B runs are slow to start (~1.5 s each): one in-process run, and one CLI sweep (two jobs and
their comparison) that also audits the network."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hang import HANG_S
from kvbench_cli import kvbench, main_without
from kvbench_plugins import wandb_sink

from kvbench.output.results import RunResult


def environ_without(*prefixes: str) -> dict[str, str]:
    """This process's environment less the variables starting with ``prefixes``: a W&B setting
    left by the developer's shell or an in-process test would steer the child's W&B."""
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def result(tmp_path, mode: str, requests: pd.DataFrame | None = None) -> RunResult:
    summary = {
        "allocator": "paged",
        "kernel": "triton",
        "workload": "lecture_chat",
        "mode": "sim",
        "hardware": "h100-sxm",
        "model": "llama2-7b",
        "peak_concurrency": 186,
        "ttft_p50_s": float("nan"),
    }
    return RunResult(
        config={"wandb": {"mode": mode, "project": "kvbench-test"}},
        summary=summary,
        requests=pd.DataFrame() if requests is None else requests,
        steps=pd.DataFrame(),
        refusals=pd.DataFrame(),
        out_dir=tmp_path,
    )


def hydra_folder(folder: Path, overrides: list[str]) -> Path:
    """A job folder as Hydra leaves it: its own overrides in ``.hydra/overrides.yaml``."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return folder


def sweep_folder(sweep: Path, task: list[str], jobs: list[list[str]]) -> list[Path]:
    """A multirun folder as Hydra leaves it: ``multirun.yaml`` with the command's overrides, and
    one numbered job folder per job."""
    sweep.mkdir(parents=True)
    lines = "".join(f"      - {o}\n" for o in task)
    (sweep / "multirun.yaml").write_text(f"hydra:\n  overrides:\n    task:\n{lines}wandb:\n  mode: disabled\n")
    return [hydra_folder(sweep / str(num), job) for num, job in enumerate(jobs)]


# -------------------------------------------------------------------------------------------------
# W&B's offline record of a run, read back
# -------------------------------------------------------------------------------------------------

#: ``run-<id>.wandb``, the transaction log ``wandb sync`` uploads, is framed as a LevelDB log:
#: a 7-byte file header, then 32 KiB blocks of chunks (crc32c, length, type: 1 whole record,
#: 2 first, 3 middle, 4 last part), each record a W&B protobuf ``Record``. wandb 0.31 reads it in
#: Go only (wandb-core), and writes no wandb-summary.json or config.yaml offline: hence this reader.
BLOCK_BYTES, HEADER_BYTES = 32768, 7


def wandb_records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data, pos, pending = path.read_bytes(), HEADER_BYTES, b""
    assert data[:4] == b":W&B", "not a W&B transaction log"
    while pos + HEADER_BYTES <= len(data):
        room = BLOCK_BYTES - pos % BLOCK_BYTES
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER_BYTES])
        if room < HEADER_BYTES or (length == 0 and kind == 0):  # a block's zero padding
            pos += room
            continue
        pending += data[pos + HEADER_BYTES : pos + HEADER_BYTES + length]
        pos += HEADER_BYTES + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def offline_run(folder: Path) -> dict:
    """What one offline run under ``folder/wandb`` recorded: its run record, config, summary (last
    value per key), files (paths under ``files/``, which must exist) and notes."""
    [run_dir] = list((folder / "wandb").glob("offline-run-*"))
    [log] = list(run_dir.glob("run-*.wandb"))
    out = {"config": {}, "summary": {}, "files": []}
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "files":
            out["files"] += [f.path for f in record.files.files]
    for path in out["files"]:
        assert (run_dir / "files" / path).is_file(), path
    out["dir"] = run_dir / "files"
    return out


def logged_table(run: dict, key: str) -> dict:
    [path] = [p for p in run["files"] if p.startswith(f"media/table/{key}_") and p.endswith(".table.json")]
    return json.loads((run["dir"] / path).read_text())


def logged_images(run: dict, key: str) -> list[str]:
    return [p for p in run["files"] if p.startswith(f"media/images/{key}_") and p.endswith(".png")]


# -------------------------------------------------------------------------------------------------
# Names, groups and tables, without W&B
# -------------------------------------------------------------------------------------------------


def test_a_sweep_job_is_named_by_its_swept_values_and_grouped_by_its_sweep(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "results" / "multirun" / "2026-11-30" / "18-48-39-123456"
    jobs = sweep_folder(
        sweep,
        ["allocator=naive,paged", "scheduler=mixed,chunked", "seed=3"],
        [["allocator=naive", "scheduler=chunked", "seed=3"], ["allocator=paged", "scheduler=mixed", "seed=3"]],
    )
    runs = [RunResult(config={}, summary={}, requests=None, steps=None, refusals=None, out_dir=job) for job in jobs]
    assert wandb_sink.sweep_of(jobs[0]) == sweep
    assert [wandb_sink.run_name(r, sweep) for r in runs] == [
        "allocator=naive scheduler=chunked",
        "allocator=paged scheduler=mixed",
    ]
    # relative to the results root, whatever the launcher's working folder calls it
    assert wandb_sink.sweep_group(sweep) == "multirun/2026-11-30/18-48-39-123456"
    assert wandb_sink.sweep_group(Path("results/multirun/2026-11-30/18-48-39-123456")) == wandb_sink.sweep_group(sweep)
    elsewhere = tmp_path.parent / ("x" * 200) / "study"
    assert wandb_sink.sweep_group(elsewhere).endswith("/study") and len(wandb_sink.sweep_group(elsewhere)) == 128


def test_a_single_run_is_named_by_the_overrides_that_change_its_numbers(tmp_path):
    run = hydra_folder(
        tmp_path / "runs" / "a", ["allocator=naive", "progress=false", "wandb.mode=offline", "output.steps=false"]
    )
    plain = hydra_folder(tmp_path / "runs" / "b", ["progress=false"])
    named = [
        RunResult(config={}, summary={}, requests=None, steps=None, refusals=None, out_dir=d)
        for d in (run, plain, None)
    ]
    assert [wandb_sink.sweep_of(r.out_dir) for r in named] == [None, None, None]
    assert [wandb_sink.run_name(r, None) for r in named] == ["allocator=naive", "defaults", "defaults"]


def test_a_table_with_missing_text_and_numbers_is_a_wandb_table():
    frame = pd.DataFrame(
        {
            "job": ["allocator=naive", "allocator=x"],
            "error": [None, "bad name"],
            "peak_concurrency": [29.0, float("nan")],
            "failed": [False, True],
        }
    )
    table = wandb_sink.table(frame)
    assert table.columns == list(frame.columns)
    assert table.data == [["allocator=naive", None, 29.0, False], ["allocator=x", "bad name", None, True]]
    assert len(wandb_sink.sampled(pd.DataFrame({"x": range(25)}), 10)) == 9  # every 3rd row
    assert len(wandb_sink.sampled(pd.DataFrame({"x": range(10)}), 10)) == 10


def test_a_sweep_with_wandb_disabled_or_no_rows_logs_no_comparison(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    sweep_folder(tmp_path / "sweep", ["allocator=naive,paged"], [["allocator=naive"]])
    wandb_sink.kvbench_sweep_finished(tmp_path / "sweep", pd.DataFrame({"job": ["allocator=naive"]}))
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb_sink.kvbench_sweep_finished(tmp_path / "sweep", pd.DataFrame())
    assert not (tmp_path / "sweep" / "wandb").exists()


# -------------------------------------------------------------------------------------------------
# Modes
# -------------------------------------------------------------------------------------------------


def test_kvbench_run_finished_disabled_writes_nothing(tmp_path):
    wandb_sink.kvbench_run_finished(result(tmp_path, "disabled"))
    assert not (tmp_path / "wandb").exists()


def test_an_offline_run_logs_its_name_summary_tables_and_figure(tmp_path, monkeypatch):
    import wandb
    from PIL import Image

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setattr(wandb.Table, "MAX_ROWS", 10)  # W&B's cap on a logged table, made small
    hydra_folder(tmp_path, ["allocator=paged", "wandb.mode=offline"])
    Image.new("RGB", (8, 4)).save(tmp_path / "memory.png")
    requests = pd.DataFrame({"request_id": range(25), "finish_s": [i / 2 for i in range(25)]})
    wandb_sink.kvbench_run_finished(result(tmp_path, "offline", requests))
    # run.finish() only informs wandb-core that the run is over (a message it does not wait on):
    # wandb-core closes the run's transaction log afterwards, in its own time. teardown() waits
    # for wandb-core to exit, with every log closed; it is what W&B's own atexit hook does.
    wandb.teardown()

    run = offline_run(tmp_path)
    assert (run["run"].display_name, run["run"].run_group, run["run"].job_type) == ("allocator=paged", "", "run")
    assert run["run"].notes.startswith("requests table: 9 of 25 rows (every 3-th row)"), run["run"].notes
    assert run["config"]["wandb"] == {"mode": "offline", "project": "kvbench-test"}
    assert run["config"]["kvbench_version"] and "kvbench_commit" in run["config"]
    assert run["summary"]["allocator"] == "paged" and run["summary"]["peak_concurrency"] == 186
    assert "ttft_p50_s" not in run["summary"], "NaN (no value) is left out"
    assert run["summary"]["requests_table_rows"] == 9
    summary_table = logged_table(run, "summary_table")
    assert len(summary_table["data"]) == 1 and "peak_concurrency" in summary_table["columns"]
    requests_table = logged_table(run, "requests")
    assert [row[0] for row in requests_table["data"]] == list(range(0, 25, 3))
    assert len(logged_images(run, "memory")) == 1


def test_wandb_mode_from_the_environment_overrides_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    wandb_sink.kvbench_run_finished(result(tmp_path, "offline"))
    assert not (tmp_path / "wandb").exists()
    assert wandb_sink.effective_mode("offline") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")  # W&B's old name for offline
    assert wandb_sink.effective_mode("disabled") == "offline"
    monkeypatch.delenv("WANDB_MODE")
    assert wandb_sink.effective_mode("offline") == "offline"


def test_a_bad_wandb_mode_in_the_environment_is_refused_before_the_run(monkeypatch):
    from kvbench.app.config import WandbConfig, to_dataclass
    from kvbench.errors import ConfigError

    monkeypatch.setenv("WANDB_MODE", "ofline")
    with pytest.raises(ConfigError, match=r"WANDB_MODE \(environment\)='ofline' is invalid: unset it or choose one of"):
        to_dataclass(WandbConfig, {"mode": "offline"}, "wandb")


def test_wandb_is_off_unless_asked_for(monkeypatch):
    from kvbench.app.config import WandbConfig, to_dataclass

    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert to_dataclass(WandbConfig, {}, "wandb").mode == "disabled"
    from omegaconf import OmegaConf

    conf = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "config.yaml")
    assert conf.wandb.mode == "disabled", "the shipped config logs nothing to W&B unless asked"


@pytest.mark.parametrize(
    ("env_mode", "config_mode", "says"),
    [
        (
            None,
            "offline",
            r"wandb\.mode=offline logs the run to Weights & Biases, which is not installed: "
            r"pip install -e '\.\[wandb\]' in a clone \(pip install 'kvbench\[wandb\]' otherwise\), "
            r"or leave wandb\.mode at disabled",
        ),
        (None, "online", r"wandb\.mode=online logs the run"),
        ("offline", "disabled", r"WANDB_MODE=offline \(environment\) logs the run .* or unset WANDB_MODE"),
        ("dryrun", "disabled", r"WANDB_MODE=dryrun \(environment\) logs the run"),
    ],
)
def test_asking_for_wandb_without_it_installed_is_refused_before_the_run(monkeypatch, env_mode, config_mode, says):
    from kvbench.app import config
    from kvbench.errors import ConfigError

    monkeypatch.setattr(config, "wandb_installed", lambda: False)
    if env_mode is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", env_mode)
    with pytest.raises(ConfigError, match=says):
        config.to_dataclass(config.WandbConfig, {"mode": config_mode}, "wandb")


def test_without_wandb_installed_disabled_runs_and_the_environment_can_turn_it_off(monkeypatch):
    from kvbench.app import config

    monkeypatch.setattr(config, "wandb_installed", lambda: False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert config.to_dataclass(config.WandbConfig, {"mode": "disabled"}, "wandb").mode == "disabled"
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the environment wins over the config, as in W&B
    assert config.to_dataclass(config.WandbConfig, {"mode": "offline"}, "wandb").mode == "offline"


def test_a_run_asking_for_wandb_without_it_is_one_line_and_exit_2(tmp_path):
    """The command line, with ``wandb`` hidden from the import system: one line, nothing run."""
    proc = kvbench(
        "wandb.mode=offline",
        "workload.num_requests=5",
        "progress=false",
        cwd=tmp_path,
        code=main_without("wandb"),
        env=environ_without("WANDB_"),
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "kvbench: error: wandb.mode=offline logs the run to Weights & Biases, which is not installed: "
        "pip install -e '.[wandb]' in a clone (pip install 'kvbench[wandb]' otherwise), or leave wandb.mode at disabled"
    ]
    assert not list(tmp_path.rglob("summary.json"))


def test_a_sweep_asking_for_wandb_without_it_is_refused_before_any_job(tmp_path):
    args = ["-m", "allocator=naive,paged", "wandb.mode=disabled,offline", "workload.num_requests=5", "progress=false"]
    proc = kvbench(*args, cwd=tmp_path, code=main_without("wandb"), env=environ_without("WANDB_"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "kvbench: error: wandb.mode=offline logs the run to Weights & Biases, which is not installed: "
        "pip install -e '.[wandb]' in a clone (pip install 'kvbench[wandb]' otherwise), or leave wandb.mode at disabled"
    ]
    assert not (tmp_path / "results").exists(), "refused before Hydra made a sweep folder"


def test_the_sync_command_names_every_offline_run_of_a_run_or_a_sweep(tmp_path):
    assert (
        wandb_sink.sync_command(Path("results/runs/a b"), sweep=False)
        == "wandb sync 'results/runs/a b'/wandb/offline-run-*"
    )
    assert wandb_sink.sync_command(Path("results/multirun/s"), sweep=True) == (
        "wandb sync results/multirun/s/*/wandb/offline-run-* results/multirun/s/wandb/offline-run-*"
    )


# -------------------------------------------------------------------------------------------------
# A whole offline sweep through the CLI: grouped runs, a comparison run, and no network call
# -------------------------------------------------------------------------------------------------

#: runs ``kvbench`` with every socket operation, name lookup and process start of this Python
#: process recorded by an audit hook (threads included), written as JSON to $AUDIT_LOG at exit
AUDITED_KVBENCH = r"""
import atexit, json, os, sys
events = []
def audit(event, args):
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        address = args[1]
        host = address if isinstance(address, (str, bytes)) else address[0]
        events.append([event, int(args[0].family), str(host)])
    elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr"):
        events.append([event, None, str(args[0])])
    elif event == "subprocess.Popen":
        events.append([event, None, [str(a) for a in (args[1] or [])]])
sys.addaudithook(audit)
atexit.register(lambda: open(os.environ["AUDIT_LOG"], "w").write(json.dumps(events)))  # runs last
from kvbench.commands.main import main
main()
"""

LOOPBACK = {"localhost", "127.0.0.1", "::1", "None", ""}


@pytest.fixture(scope="module")
def offline_sweep(tmp_path_factory):
    """``kvbench -m allocator=naive,paged`` offline, audited, in a fresh folder: (folder, process)."""
    tmp_path = tmp_path_factory.mktemp("offline-sweep")
    # no WANDB_* variable: WANDB_SERVICE, left by an in-process test, would reuse that test's wandb-core
    env = environ_without("WANDB_")
    env.update(
        AUDIT_LOG=str(tmp_path / "audit.json"),
        WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wandb-data"),
    )
    args = [
        "-m",
        "allocator=naive,paged",
        "workload.num_requests=20",
        "progress=false",
        "output.steps=false",
        "wandb.mode=offline",
    ]
    return tmp_path, kvbench(*args, cwd=tmp_path, code=AUDITED_KVBENCH, env=env)


def test_an_offline_sweep_says_how_to_upload_its_runs_and_wandb_sync_finds_them(offline_sweep):
    tmp_path, proc = offline_sweep
    assert proc.returncode == 0, proc.stderr
    [hint] = [line for line in proc.stderr.splitlines() if "wandb sync" in line]
    command = hint.split("upload with: ", 1)[1]
    assert "offline-run-*" not in proc.stdout, "the hint is a note on stderr, not part of the table"
    env = environ_without("WANDB_")
    env.update(WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), WANDB_MODE="offline")
    wandb_cli = str(Path(sys.executable).with_name("wandb"))
    listed = subprocess.run(
        f"{wandb_cli} {command.removeprefix('wandb ')} --dry-run",
        shell=True,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert "Would sync 3 run(s)" in listed.stdout + listed.stderr, listed.stdout + listed.stderr


def test_an_offline_sweep_makes_no_network_call(offline_sweep):
    """The whole CLI sweep, offline: no name lookup, no connection but the local one to wandb-core
    (a Unix socket), one wandb-core started without its error reporting, every run's files in its folder.

    wandb-core's own (Go) sockets are out of a Python audit hook's sight: ``--no-observability`` is
    what keeps it from reporting to Sentry (checked with strace for wandb 0.31)."""
    tmp_path, proc = offline_sweep
    assert proc.returncode == 0, proc.stderr
    events = json.loads((tmp_path / "audit.json").read_text())
    lookups = [e for e in events if e[0].startswith(("socket.getaddrinfo", "socket.gethostby"))]
    assert all(host in LOOPBACK for _, _, host in lookups), lookups
    remote = [
        e
        for e in events
        if e[0] in ("socket.connect", "socket.sendto", "socket.sendmsg")
        and e[1] != socket.AF_UNIX
        and e[2] not in LOOPBACK
    ]
    assert not remote, remote
    [core] = [argv for event, _, argv in events if event == "subprocess.Popen" and argv[0].endswith("wandb-core")]
    assert "--no-observability" in core
    [sweep] = list((tmp_path / "results" / "multirun").glob("*/*"))
    for folder in (sweep / "0", sweep / "1", sweep):
        [offline] = list((folder / "wandb").glob("offline-run-*"))
        assert list(offline.glob("run-*.wandb")), "the offline run's transaction log, for wandb sync"


def test_a_sweep_is_one_group_of_named_jobs_and_a_comparison(offline_sweep):
    tmp_path, proc = offline_sweep
    assert proc.returncode == 0, proc.stderr
    [sweep] = list((tmp_path / "results" / "multirun").glob("*/*"))
    jobs = [offline_run(sweep / num) for num in ("0", "1")]
    comparison = offline_run(sweep)
    group = sweep.relative_to(tmp_path / "results").as_posix()
    assert [(r["run"].run_group, r["run"].display_name, r["run"].job_type) for r in jobs] == [
        (group, "allocator=naive", "sweep-job"),
        (group, "allocator=paged", "sweep-job"),
    ]
    assert [r["summary"]["allocator"] for r in jobs] == ["naive", "paged"]
    assert all(r["config"]["allocator"]["name"] == name for r, name in zip(jobs, ("naive", "paged")))
    assert all(len(logged_table(r, "requests")["data"]) == 20 and len(logged_images(r, "memory")) == 1 for r in jobs)
    assert (comparison["run"].run_group, comparison["run"].job_type) == (group, "comparison")
    assert comparison["config"]["swept"] == ["allocator"] and "kvbench_version" in comparison["config"]
    table = logged_table(comparison, "comparison")
    assert [row[table["columns"].index("allocator")] for row in table["data"]] == ["naive", "paged"]
    assert len(logged_images(comparison, "comparison_figure")) == 1
    assert comparison["summary"]["num_jobs"] == 2 and comparison["summary"]["num_failed_jobs"] == 0


def test_an_offline_run_writes_nothing_outside_its_folder(tmp_path):
    # W&B's defaults put wandb-core's logs in ~/.cache/wandb/logs (two files a process) and table
    # staging in ~/.local/share/wandb: with a home of its own, the run must leave it empty
    home = tmp_path / "home"
    home.mkdir()
    env = environ_without("WANDB_", "XDG_")
    env.update(HOME=str(home))
    run_dir = tmp_path / "run"
    proc = kvbench(
        "workload.num_requests=20",
        "progress=false",
        "wandb.mode=offline",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    # (matplotlib keeps its font cache under ~/.cache/matplotlib, as for any program that draws)
    assert [str(p.relative_to(home)) for p in home.rglob("*") if "wandb" in str(p)] == []
    assert list((run_dir / "wandb" / ".cache").rglob("core-debug-*.log")), "wandb-core's log, in the run's folder"
    assert list((run_dir / "wandb").glob("offline-run-*"))
