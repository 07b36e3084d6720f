"""The W&B sink: offline by default (no account, no network), a no-op when disabled."""

from __future__ import annotations

import pandas as pd

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
