"""The W&B sink: offline by default (no account, no network), a no-op when disabled."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pandas as pd
import pytest

from kvbench.output.results import RunResult
from kvbench_plugins import wandb_sink


def result(tmp_path, mode: str) -> RunResult:
    summary = {"allocator": "paged", "kernel": "triton", "workload": "lecture_chat", "mode": "sim",
               "hardware": "h100-sxm", "model": "llama2-7b", "peak_concurrency": 186, "ttft_p50_s": float("nan")}  # fmt: skip
    return RunResult(
        config={"wandb": {"mode": mode, "project": "kvbench-test"}},
        summary=summary,
        requests=pd.DataFrame(),
        steps=pd.DataFrame(),
        refusals=pd.DataFrame(),
        out_dir=tmp_path,
    )


def test_kvbench_run_finished_disabled_writes_nothing(tmp_path):
    wandb_sink.kvbench_run_finished(result(tmp_path, "disabled"))
    assert not (tmp_path / "wandb").exists()


def test_kvbench_run_finished_offline_logs_a_local_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    wandb_sink.kvbench_run_finished(result(tmp_path, "offline"))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1


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
from kvbench.app.cli import main
main()
"""

LOOPBACK = {"localhost", "127.0.0.1", "::1", "None", ""}


def test_an_offline_run_makes_no_network_call(tmp_path):
    """The whole CLI run, offline: no name lookup, no connection but the local one to wandb-core
    (a Unix socket), wandb-core started without its error reporting, the run's files in its folder.

    wandb-core's own (Go) sockets are out of a Python audit hook's sight: ``--no-observability`` is
    what keeps it from reporting to Sentry (checked with strace for wandb 0.31)."""
    log = tmp_path / "audit.json"
    # no WANDB_* variable: WANDB_SERVICE, left by an in-process test, would reuse that test's wandb-core
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(AUDIT_LOG=str(log), HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore",
               WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
               WANDB_DATA_DIR=str(tmp_path / "wandb-data"))  # fmt: skip
    args = ["workload.num_requests=20", "progress=false", "output.figures=false", "wandb.mode=offline"]
    proc = subprocess.run([sys.executable, "-c", AUDITED_KVBENCH, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    events = json.loads(log.read_text())
    lookups = [e for e in events if e[0].startswith(("socket.getaddrinfo", "socket.gethostby"))]
    assert all(host in LOOPBACK for _, _, host in lookups), lookups
    remote = [e for e in events if e[0] in ("socket.connect", "socket.sendto", "socket.sendmsg")
              and e[1] != socket.AF_UNIX and e[2] not in LOOPBACK]  # fmt: skip
    assert not remote, remote
    [core] = [argv for event, _, argv in events if event == "subprocess.Popen" and argv[0].endswith("wandb-core")]
    assert "--no-observability" in core
    [run_dir] = list((tmp_path / "results" / "runs").glob("*/*"))
    [offline_run] = list((run_dir / "wandb").glob("offline-run-*"))
    assert list(offline_run.glob("run-*.wandb")), "the offline run's transaction log, for wandb sync"
