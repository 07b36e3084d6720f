"""The scenarios kvbench and Vidur 0.0.26 both run, and one measured run of each simulator.

Llama-2-7B on an H100: 7,424 KV blocks of 16 tokens (62,277,025,792 bytes, what Vidur's memory
planner gives), at most 128 running requests, seed 42 for Vidur's predictor:

- ``vllm``: N requests of 512 prompt + 128 output tokens at t = 0; paged blocks of 16,
  prefill-first steps (vLLM v0) of at most 4,096 prompt tokens, a 1 % watermark, recompute
  preemption;
- ``orca``: the same requests, reserve-to-max (slots of 4,096 tokens: 29 of them) and Orca's
  mixed steps with no prompt-token budget;
- ``arxiv``: N requests drawn from Vidur's arXiv-summarization length file (shuffled; prompt +
  output clipped to 4,096 the way Vidur clips them, by shortening the prompt), Poisson arrivals at
  3 requests/s, through ``vllm``'s scheduler. The list is written once to a temporary folder in
  each simulator's format: kvbench replays it with its ``request_csv`` workload (Vidur's column
  names), Vidur with its harness's ``REPLAY``.

The Vidur side is a runner script (``--vidur-run``) that reads ``N``, ``QPS``, ``LENGTHS``,
``PROMPT``, ``DECODE``, ``REPLAY``, ``SCHED``, ``BLOCK`` and ``BATCH_CAP`` from the environment
and prints one JSON line with Vidur's own timings (``wall_s_event_loop``, ``wall_s_process``),
``peak_rss_mb``, ``batches``, ``requests`` and ``requests_csv`` (the request list it simulated).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from child_process import measure
from kvbench_plugins.workloads.request_csv import read_requests

KV_BUDGET_BYTES = 7424 * 16 * 524_288  # Vidur's planner: 7,424 blocks of 16 Llama-2-7B tokens
MAX_TOKENS = 4096  # Vidur's per-request limit (prompt + output) and Llama-2-7B's positions
ARXIV_RATE_PER_S = 3.0
SEED = 42
COMMON = [
    "wandb.mode=disabled",
    "progress=false",
    "kernel=torch",
    f"hardware.kv_budget_bytes={KV_BUDGET_BYTES}",
    "output.figures=false",
]
VLLM = [
    *COMMON,
    "scheduler=prefill_first",
    "allocator=paged",
    "allocator.block_size_tokens=16",
    "scheduler.max_num_batched_tokens=4096",
    "preemption=recompute",
    "scheduler.max_num_seqs=128",
]
ORCA = [
    *COMMON,
    "scheduler=mixed",
    "allocator=naive",
    f"allocator.s_max_tokens={MAX_TOKENS}",
    "scheduler.max_num_seqs=128",
    "scheduler.max_num_batched_tokens=100000000",
]
VIDUR_COMMON = {"BLOCK": "16", "BATCH_CAP": "128", "SEED": str(SEED)}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    kvbench_overrides: list[str]
    vidur_env: dict[str, str] = field(default_factory=dict)


def fixed_scenarios(num_requests: int, output_tokens: int) -> list[Scenario]:
    workload = [
        "workload=lecture_chat",
        f"workload.num_requests={num_requests}",
        f"workload.output_tokens={output_tokens}",
    ]
    vidur = {
        **VIDUR_COMMON,
        "N": str(num_requests),
        "QPS": "static",
        "LENGTHS": "fixed",
        "PROMPT": "512",
        "DECODE": str(output_tokens),
    }
    lengths = f"{num_requests:,} x 512/{output_tokens} at t = 0"
    return [
        Scenario("vllm", f"{lengths}, paged prefill-first (vLLM v0)", [*VLLM, *workload], {**vidur, "SCHED": "vllm"}),
        Scenario("orca", f"{lengths}, reserve-to-max (Orca)", [*ORCA, *workload], {**vidur, "SCHED": "orca"}),
    ]


def arxiv_scenario(lengths_csv: Path, num_requests: int, folder: Path) -> Scenario:
    """Write ``num_requests`` arXiv requests for both simulators under ``folder``; the scenario replaying them."""
    table = read_requests(lengths_csv)  # the request_csv workload's own checks
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(table.prompt_tokens))[:num_requests]
    output = table.output_tokens[order]
    prompt = table.prompt_tokens[order] - np.maximum(table.prompt_tokens[order] + output - MAX_TOKENS, 0)
    arrival_s = np.cumsum(rng.exponential(1.0 / ARXIV_RATE_PER_S, len(order)))
    kvbench_csv, vidur_csv = folder / "arxiv_kvbench.csv", folder / "arxiv_vidur.csv"
    with kvbench_csv.open("w", newline="") as f:  # repr: 17 digits, so both read the same doubles
        csv.writer(f).writerows(
            [
                ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
                *zip(map(repr, arrival_s.tolist()), prompt.tolist(), output.tolist()),
            ]
        )
    with vidur_csv.open("w", newline="") as f:
        csv.writer(f).writerows(
            [
                ("request_id", "arrival_s", "prompt_tokens", "decode_tokens"),
                *zip(range(len(order)), map(repr, arrival_s.tolist()), prompt.tolist(), output.tolist()),
            ]
        )
    return Scenario(
        "arxiv",
        f"{len(order):,} arXiv-summarization requests (mean {prompt.mean():.0f}/{output.mean():.0f} tokens), "
        f"Poisson {ARXIV_RATE_PER_S:g}/s, paged prefill-first",
        [*VLLM, "workload=request_csv", f"workload.path={kvbench_csv}"],
        {**VIDUR_COMMON, "N": str(len(order)), "REPLAY": str(vidur_csv), "SCHED": "vllm"},
    )


def kvbench_command() -> list[str]:
    """The ``kvbench`` console script of the Python running this benchmark."""
    script = Path(sys.executable).with_name("kvbench")
    if not script.is_file():
        raise SystemExit(f"error: no kvbench command beside {sys.executable}: install kvbench (pip install -e .)")
    return [str(script)]


def run_kvbench(scenario: Scenario, run_dir: Path, *, write_outputs: bool = True, extra: tuple[str, ...] = ()) -> dict:
    """One ``kvbench`` process; with ``write_outputs`` its normal tables (Parquet + CSV, no figures)."""
    overrides = [
        *scenario.kvbench_overrides,
        f"hydra.run.dir={run_dir}",
        f"output.write={str(write_outputs).lower()}",
        *extra,
    ]
    run = measure([*kvbench_command(), *overrides]).check(f"kvbench ({scenario.name})")
    row = {"process_s": run.wall_s, "peak_rss_bytes": run.peak_rss_bytes}
    if write_outputs:
        with (run_dir / "summary.csv").open(newline="") as f:
            summary = next(csv.DictReader(f))
        row.update(
            loop_s=float(summary["sim_wall_s"]),
            steps=int(summary["num_steps"]),
            requests=int(summary["num_finished"]),
            simulated_s=float(summary["duration_s"]),
            tpot_p50_s=float(summary["tpot_p50_s"]),
        )
    return row


def kvbench_startup(scenario: Scenario, run_dir: Path) -> dict:
    """The scenario's kvbench run cut to its first request, writing nothing: the fixed cost of every
    run (imports, composing and checking the config, building the plugins, reading the workload)."""
    return run_kvbench(scenario, run_dir, write_outputs=False, extra=("workload.num_requests=1",))


def run_vidur(runner: str, scenario: Scenario) -> dict:
    """One run of the Vidur runner: Vidur's own numbers, and the runner's as measured from here."""
    run = measure(["bash", runner], env={**os.environ, **scenario.vidur_env}).check(f"Vidur ({scenario.name})")
    report = json.loads(run.stdout.strip().splitlines()[-1])
    return {
        "loop_s": report["wall_s_event_loop"],
        "process_s": report["wall_s_process"],  # Vidur's Python process, start to exit (the runner's clock)
        "peak_rss_bytes": int(report["peak_rss_mb"] * 2**20),  # the harness's "MB" are ru_maxrss / 1024: MiB
        "steps": report["batches"],
        "requests": report["requests"],
        "simulated_s": report["sim_seconds"],
        "tpot_p50_s": report["tpot_ms_p50"] / 1e3,
        "runner_s": run.wall_s,  # + the runner's own set-up check and report
        "runner_peak_rss_bytes": run.peak_rss_bytes,
        "requests_csv": report.get("requests_csv"),
    }


def read_request_list(path: Path, output_column: str) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, output tokens) by request id, from a simulator's per-request CSV."""
    with path.open(newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: int(r["request_id"]))
    return [(float(r["arrival_s"]), int(r["prompt_tokens"]), int(r[output_column])) for r in rows]


def same_requests(kvbench_requests_csv: Path, vidur_requests_csv: str | None) -> bool | None:
    """Whether both simulators served the same requests (None: Vidur did not export its list)."""
    if not vidur_requests_csv or not Path(vidur_requests_csv).is_file():
        return None
    ours = read_request_list(kvbench_requests_csv, "output_tokens")
    theirs = read_request_list(Path(vidur_requests_csv), "decode_tokens")
    return len(ours) == len(theirs) and all(a[1:] == b[1:] and abs(a[0] - b[0]) <= 1e-9 for a, b in zip(ours, theirs))
