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

Any other request list is replayed the same way (:func:`replay_scenario`): scale.py's arrival-heavy
scenarios (:func:`poisson_lengths_scenario`, :func:`chat_poisson_scenario`, :func:`azure_scenario`)
and fixed-length ones on a smaller KV pool (:func:`fixed_scenario` with ``kv_blocks``; Vidur's
``NUM_BLOCKS``).

The Vidur side is a runner script (``--vidur-run``) that reads ``N``, ``QPS``, ``LENGTHS``,
``PROMPT``, ``DECODE``, ``REPLAY``, ``SCHED``, ``BLOCK`` and ``BATCH_CAP`` from the environment
and prints one JSON line with Vidur's own timings (``wall_s_event_loop``, ``wall_s_process``),
``peak_rss_mb``, ``batches``, ``requests`` and ``requests_csv`` (the request list it simulated);
scale.py also gives it ``NUM_BLOCKS`` (the KV pool in blocks) and reads ``preemptions``.

Each side's loop is timed over the same span, from its first request made to the last row its loop
writes (:func:`run_kvbench`, :func:`run_vidur`):

- kvbench: ``loop_wall_s`` of its summary, ``Engine.run`` from just before it makes its first
  request (it makes them, a batch at a time, as they arrive) to the last rows of its step table
  written to ``steps.parquet`` and of its request table stored; its breakdown, ``sim_wall_s``, is
  that less making requests, storing finished requests' rows and writing the step table;
- Vidur: its request making (``Simulator._init_event_queue``: the request generator's
  ``generate()``, which makes every request object from the list it read, and one arrival event
  per request pushed on its queue; timed by ``vidur_timing/sitecustomize.py``, which the runner's
  Python imports at start-up from ``PYTHONPATH``) plus its event loop (the runner's
  ``wall_s_event_loop``: ``Simulator.run`` less writing its outputs). Vidur records its metrics in
  memory as its loop goes and writes its tables after it, outside the span; kvbench writes its
  step table's Parquet file inside it. Reading the request list (kvbench's workload, Vidur's trace
  file) comes before either span.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from child_process import measure
from kvbench_plugins.workloads.request_csv import read_requests
from vllm_v0 import vllm_v0_scheduling

import kvbench
from kvbench.output.step_files import step_file_rows

KV_BLOCKS = 7424  # Vidur's planner: 7,424 blocks of 16 Llama-2-7B tokens on an H100
BLOCK_BYTES = 16 * 524_288  # 16 tokens of 512 KiB (Llama-2-7B: 32 layers x 2 x 4,096 x 2 bytes)
KV_BUDGET_BYTES = KV_BLOCKS * BLOCK_BYTES
MAX_TOKENS = 4096  # Vidur's per-request limit (prompt + output) and Llama-2-7B's positions
ARXIV_RATE_PER_S = 3.0
SEED = 42
#: the folder whose ``sitecustomize`` times Vidur's request making (put on its runner's PYTHONPATH)
VIDUR_TIMING = Path(__file__).resolve().parent / "vidur_timing"
#: the request traces kvbench ships (kvbench/traces)
TRACES = Path(kvbench.__file__).resolve().parent / "traces"
ARXIV_LENGTHS = TRACES / "vidur_arxiv_summarization_llama2_lengths.csv"  # the file Vidur ships, as is
AZURE_CONV = TRACES / "azure_llm_2023_conv.csv"
COMMON = [
    "wandb.mode=disabled",
    "progress=false",
    "kernel=torch",
    "output.figures=false",
]


def vllm_overrides(kv_blocks: int = KV_BLOCKS) -> list[str]:
    """vLLM v0's scheduling on a KV pool of ``kv_blocks`` blocks of 16 tokens."""
    return [
        *COMMON,
        f"hardware.kv_budget_bytes={kv_blocks * BLOCK_BYTES}",
        *vllm_v0_scheduling(),
    ]


VLLM = vllm_overrides()
ORCA = [
    *COMMON,
    f"hardware.kv_budget_bytes={KV_BUDGET_BYTES}",
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


def fixed_scenario(
    name: str,
    num_requests: int,
    prompt_tokens: int,
    output_tokens: int,
    *,
    orca: bool = False,
    kv_blocks: int | None = None,
    what: str = "",
) -> Scenario:
    """N requests of ``prompt_tokens`` + ``output_tokens`` at t = 0: vLLM v0 (paged, prefill-first,
    recompute preemption) on ``kv_blocks`` blocks (None: Vidur's planner, 7,424), or Orca."""
    workload = [
        "workload=lecture_chat",
        f"workload.num_requests={num_requests}",
        f"workload.prompt_tokens={prompt_tokens}",
        f"workload.output_tokens={output_tokens}",
    ]
    vidur = {
        **VIDUR_COMMON,
        "N": str(num_requests),
        "QPS": "static",
        "LENGTHS": "fixed",
        "PROMPT": str(prompt_tokens),
        "DECODE": str(output_tokens),
        "SCHED": "orca" if orca else "vllm",
    }
    if kv_blocks is not None:
        vidur["NUM_BLOCKS"] = str(kv_blocks)
    lengths = f"{num_requests:,} x {prompt_tokens}/{output_tokens} at t = 0"
    if orca:
        return Scenario(name, f"{lengths}, reserve-to-max (Orca){what}", [*ORCA, *workload], vidur)
    pool = "" if kv_blocks is None else f", {kv_blocks:,} KV blocks"
    return Scenario(
        name,
        f"{lengths}, paged prefill-first (vLLM v0){pool}{what}",
        [*vllm_overrides(kv_blocks or KV_BLOCKS), *workload],
        vidur,
    )


def fixed_scenarios(num_requests: int, output_tokens: int) -> list[Scenario]:
    return [
        fixed_scenario("vllm", num_requests, 512, output_tokens),
        fixed_scenario("orca", num_requests, 512, output_tokens, orca=True),
    ]


def clip_to_max_tokens(prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """The prompts shortened so that prompt + output <= MAX_TOKENS, as Vidur clips a request."""
    return prompt - np.maximum(prompt + output - MAX_TOKENS, 0)


def write_request_lists(
    folder: Path, name: str, arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray
) -> tuple[Path, Path]:
    """One request list in both simulators' formats: (kvbench's CSV, Vidur's REPLAY CSV)."""
    kvbench_csv, vidur_csv = folder / f"{name}_kvbench.csv", folder / f"{name}_vidur.csv"
    arrivals = list(map(repr, arrival_s.tolist()))  # repr: 17 digits, so both read the same doubles
    with kvbench_csv.open("w", newline="") as f:
        csv.writer(f).writerows(
            [
                ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
                *zip(arrivals, prompt.tolist(), output.tolist()),
            ]
        )
    with vidur_csv.open("w", newline="") as f:
        csv.writer(f).writerows(
            [
                ("request_id", "arrival_s", "prompt_tokens", "decode_tokens"),
                *zip(range(len(arrivals)), arrivals, prompt.tolist(), output.tolist()),
            ]
        )
    return kvbench_csv, vidur_csv


def replay_scenario(
    name: str, description: str, folder: Path, arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray
) -> Scenario:
    """A request list written once for both simulators, replayed through vLLM v0's scheduling."""
    if np.any(np.diff(arrival_s) < 0) or np.any(prompt < 1) or np.any(prompt + output > MAX_TOKENS):
        raise ValueError(f"{name}: arrivals must be sorted, prompts >= 1 token, prompt + output <= {MAX_TOKENS}")
    kvbench_csv, vidur_csv = write_request_lists(folder, name, arrival_s, prompt, output)
    return Scenario(
        name,
        f"{description} (mean {prompt.mean():.0f}/{output.mean():.0f} tokens), paged prefill-first",
        [*VLLM, "workload=request_csv", f"workload.path={kvbench_csv}"],
        {**VIDUR_COMMON, "N": str(len(arrival_s)), "REPLAY": str(vidur_csv), "SCHED": "vllm"},
    )


def arxiv_scenario(lengths_csv: Path, num_requests: int, folder: Path, name: str = "arxiv") -> Scenario:
    """Write ``num_requests`` arXiv requests for both simulators under ``folder``; the scenario replaying them."""
    table = read_requests(lengths_csv)  # the request_csv workload's own checks
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(table.prompt_tokens))[:num_requests]
    output = table.output_tokens[order]
    prompt = clip_to_max_tokens(table.prompt_tokens[order], output)
    arrival_s = np.cumsum(rng.exponential(1.0 / ARXIV_RATE_PER_S, len(order)))
    what = f"{len(order):,} arXiv-summarization requests, Poisson {ARXIV_RATE_PER_S:g}/s"
    return replay_scenario(name, what, folder, arrival_s, prompt, output)


def poisson_lengths_scenario(
    name: str, lengths_csv: Path, num_requests: int, folder: Path, rate_per_s: float = ARXIV_RATE_PER_S
) -> Scenario:
    """``num_requests`` (prompt, output) pairs drawn with replacement from a length file (seed 42),
    clipped to MAX_TOKENS, arriving as a Poisson process at ``rate_per_s``."""
    table = read_requests(lengths_csv)
    rng = np.random.default_rng(SEED)
    rows = rng.integers(0, len(table.prompt_tokens), num_requests)
    output = table.output_tokens[rows]
    prompt = clip_to_max_tokens(table.prompt_tokens[rows], output)
    arrival_s = np.cumsum(rng.exponential(1.0 / rate_per_s, num_requests))
    what = f"{num_requests:,} requests drawn from {lengths_csv.name}, Poisson {rate_per_s:g}/s"
    return replay_scenario(name, what, folder, arrival_s, prompt, output)


def chat_poisson_scenario(name: str, num_requests: int, folder: Path, rate_per_s: float) -> Scenario:
    """kvbench's own chat-like workload (``workload=lognormal``: lognormal prompts and outputs of
    medians 512 and 128 tokens, sigma 1.0, clipped into 4,096) at Poisson ``rate_per_s``, drawn by
    kvbench's workload source with the run's default seed: the requests that
    ``kvbench workload=lognormal workload.arrival=poisson workload.rate_per_s=R workload.num_requests=N``
    serves, written for both simulators."""
    from kvbench.api import compose
    from kvbench.app.run import setup

    overrides = [
        *VLLM,
        "workload=lognormal",
        f"workload.num_requests={num_requests}",
        "workload.arrival=poisson",
        f"workload.rate_per_s={rate_per_s}",
    ]
    cfg, _ = compose(overrides)
    workload = setup(cfg).workload_source.generate(np.random.default_rng(int(cfg.seed)))
    prompt = np.asarray(workload.prompt_tokens, dtype=np.int64)
    output = np.asarray(workload.output_tokens, dtype=np.int64)
    what = f"{num_requests:,} chat-like requests (workload=lognormal: medians 512/128), Poisson {rate_per_s:g}/s"
    return replay_scenario(name, what, folder, np.asarray(workload.arrival_s, dtype=np.float64), prompt, output)


def azure_rows(trace_csv: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival s from the first request, prompt tokens, output tokens) of an Azure LLM 2023 trace
    (columns TIMESTAMP, ContextTokens, GeneratedTokens), in the file's order."""
    with trace_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    stamps = np.array([r["TIMESTAMP"].replace(" ", "T") for r in rows], dtype="datetime64[ns]")
    arrival_s = (stamps - stamps[0]).astype(np.int64) / 1e9
    prompt = np.array([int(r["ContextTokens"]) for r in rows], dtype=np.int64)
    output = np.array([int(r["GeneratedTokens"]) for r in rows], dtype=np.int64)
    return arrival_s, prompt, output


def azure_scenario(name: str, trace_csv: Path, num_requests: int, folder: Path, rate_scale: float = 1.0) -> Scenario:
    """The Azure trace tiled to ``num_requests``: copy k is the trace shifted by k x (its span + its
    mean inter-arrival gap), so every request keeps its own gap to the one before (and a copy starts one
    mean gap after the last request of the one before); prompts clipped to MAX_TOKENS as Vidur clips them.
    ``rate_scale`` divides every arrival time, as kvbench's ``workload.rate_scale`` does."""
    if rate_scale <= 0:
        raise ValueError(f"{name}: rate_scale must be > 0, got {rate_scale}")
    arrival, prompt, output = azure_rows(trace_csv)
    period_s = float(arrival[-1]) * len(arrival) / (len(arrival) - 1)  # span + one mean gap
    copies = -(-num_requests // len(arrival))
    arrival_s = np.concatenate([arrival + k * period_s for k in range(copies)])[:num_requests] / rate_scale
    output = np.tile(output, copies)[:num_requests]
    prompt = clip_to_max_tokens(np.tile(prompt, copies)[:num_requests], output)
    rate = (
        "its own arrival times" if rate_scale == 1 else f"its arrival times / {rate_scale:g} ({rate_scale:g}x its rate)"
    )
    what = f"{num_requests:,} requests of {trace_csv.name} ({len(arrival):,} rows tiled {num_requests / len(arrival):.2f} times), {rate}"
    return replay_scenario(name, what, folder, arrival_s, prompt, output)


def kvbench_command() -> list[str]:
    """The ``kvbench`` console script of the Python running this benchmark."""
    script = Path(sys.executable).with_name("kvbench")
    if not script.is_file():
        raise SystemExit(f"error: no kvbench command beside {sys.executable}: install kvbench (pip install -e .)")
    return [str(script)]


def kvbench_env() -> dict[str, str]:
    """The environment of kvbench's runs: without PYTHONDONTWRITEBYTECODE, so that kvbench runs from
    its bytecode cache as an installed package does (pip compiles a package when it installs it,
    and Vidur's runner runs from its compiled package), not compiling its modules in every run."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def compile_kvbench() -> None:
    """Fill kvbench's bytecode cache before any timed run (an editable install has none until a
    run writes it): what ``pip install`` does for an installed package."""
    import compileall

    import kvbench_plugins

    for package in (kvbench, kvbench_plugins):
        for folder in package.__path__:
            compileall.compile_dir(folder, quiet=1)


def run_kvbench(
    scenario: Scenario,
    run_dir: Path,
    *,
    write_outputs: bool = True,
    extra: tuple[str, ...] = (),
    command: list[str] | None = None,
) -> dict:
    """One ``kvbench`` process (``command``: another install's ``kvbench``; None: this one's); with
    ``write_outputs`` its normal tables (Parquet + CSV, no figures), its whole loop (``loop_s``:
    ``loop_wall_s``), the engine's part of it (``engine_loop_s``: ``sim_wall_s``) and its events
    (``events``: rows of its step table, from the Parquet file's footer)."""
    overrides = [
        *scenario.kvbench_overrides,
        f"hydra.run.dir={run_dir}",
        f"output.write={str(write_outputs).lower()}",
        *extra,
    ]
    argv = [*(command or kvbench_command()), *overrides]
    run = measure(argv, env=kvbench_env()).check(f"kvbench ({scenario.name})")
    row = {"process_s": run.wall_s, "peak_rss_bytes": run.peak_rss_bytes}
    if write_outputs:
        with (run_dir / "summary.csv").open(newline="") as f:
            summary = next(csv.DictReader(f))
        steps_file = run_dir / "steps.parquet"
        row.update(
            loop_s=float(summary["loop_wall_s"]),
            engine_loop_s=float(summary["sim_wall_s"]),
            events=step_file_rows(steps_file) if steps_file.is_file() else None,
            steps=int(summary["num_steps"]),
            requests=int(summary["num_finished"]),
            simulated_s=float(summary["duration_s"]),
            tpot_p50_s=float(summary["tpot_p50_s"]),
            preemptions=int(float(summary["num_preemptions"])),
        )
    return row


def kvbench_startup(scenario: Scenario, run_dir: Path) -> dict:
    """The scenario's kvbench run cut to its first request, writing nothing: the fixed cost of every
    run (imports, composing and checking the config, building the plugins, reading the workload)."""
    return run_kvbench(scenario, run_dir, write_outputs=False, extra=("workload.num_requests=1",))


def run_vidur(runner: str, scenario: Scenario, timeout_s: float | None = None) -> dict:
    """One run of the Vidur runner: Vidur's own numbers, and the runner's as measured from here (a
    RuntimeError if it fails or, given ``timeout_s``, does not finish in time). ``loop_s`` is its whole
    loop: its request making (``request_making_s``, timed in its process by ``vidur_timing``) and its
    event loop (``event_loop_s``); None for the first where the runner's Python did not report it."""
    with tempfile.TemporaryDirectory(prefix="kvbench-vidur-timing-") as tmp:
        times_file = Path(tmp) / "times.json"
        path = os.pathsep.join(filter(None, (str(VIDUR_TIMING), os.environ.get("PYTHONPATH"))))
        env = {**os.environ, **scenario.vidur_env, "PYTHONPATH": path, "KVBENCH_VIDUR_TIMES": str(times_file)}
        run = measure(["bash", runner], env=env, timeout_s=timeout_s)
        run.check(f"Vidur ({scenario.name})")
        making_s = json.loads(times_file.read_text())["request_making_s"] if times_file.is_file() else None
    report = json.loads(run.stdout.strip().splitlines()[-1])
    event_loop_s = report["wall_s_event_loop"]
    return {
        "loop_s": event_loop_s + (making_s or 0.0),
        "event_loop_s": event_loop_s,
        "request_making_s": making_s,
        "process_s": report["wall_s_process"],  # Vidur's Python process, start to exit (the runner's clock)
        "peak_rss_bytes": int(report["peak_rss_mb"] * 2**20),  # the harness's "MB" are ru_maxrss / 1024: MiB
        "steps": report["batches"],
        "requests": report["requests"],
        "simulated_s": report["sim_seconds"],
        "tpot_p50_s": report["tpot_ms_p50"] / 1e3,
        "preemptions": report.get("preemptions"),
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
