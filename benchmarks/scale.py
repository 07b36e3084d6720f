"""Speed at scale: kvbench against Vidur 0.0.26 on arrival-heavy traces, preemption storms and 16x the
output tokens; a profile of each loop, a floor under it, and the issue's goals as a table.

    python benchmarks/scale.py --vidur-run $VIDUR_RUN --repeat 2      # the measurement (about 1 h on 2 cores)
    python benchmarks/scale.py --vidur-run $VIDUR_RUN --repeat 2 --large-repeat 1   # one pair at 100k
    python benchmarks/scale.py --quick                                # kvbench only, small N (about 2 min)
    python benchmarks/scale.py --vidur-run $VIDUR_RUN --scenarios storm-128-128-t0-5k,storm-128-2048-t0-5k --repeat 3

``$VIDUR_RUN`` is a Vidur 0.0.26 runner script: side_by_side.py's docstring says what it reads from
the environment (``N``, ``QPS``, ``LENGTHS``, ``PROMPT``, ``DECODE``, ``REPLAY``, ``SCHED``, ``BLOCK``,
``BATCH_CAP``, ``NUM_BLOCKS``, ``SEED``) and the JSON line it prints (Vidur's own ``wall_s_event_loop``
and ``wall_s_process``, ``peak_rss_mb``, ``batches``, ``requests``, ``preemptions``, ``requests_csv``).
Without it only kvbench runs.

Scenarios (Llama-2-7B on an H100, vLLM v0's scheduling unless said: paged blocks of 16, prefill-first
steps of at most 4,096 prompt tokens, at most 128 running requests, recompute preemption), each
named by its lengths, its arrivals and its number of requests:

- ``arxiv-poisson3-10k``: loop_speed.py's arXiv replay: 10,000 requests of the packaged
  arXiv-summarization length file (Vidur's own, ``kvbench/traces/vidur_arxiv_summarization_llama2_lengths.csv``),
  drawn without replacement, Poisson 3/s;
- ``arxiv-poisson3-100k``: 100,000 (prompt, output) pairs drawn *with* replacement from the same file
  (seed 42), Poisson 3/s;
- ``azure-conv-1x-100k``: 100,000 requests of the packaged Azure LLM 2023 conversation trace
  (``azure_llm_2023_conv.csv``, 19,366 rows): the trace tiled 5.16 times, copy k shifted by k x (its
  span + its mean inter-arrival gap), so each request keeps the trace's own gap to the one before;
- ``chat-poisson12-10k``, ``chat-poisson12-100k``: kvbench's chat-like workload (``workload=lognormal``:
  prompt and output medians 512 and 128 tokens) at Poisson 12/s (``CHAT_RATE_PER_S``);
- ``azure-conv-1.5x-10k``, ``azure-conv-1.5x-100k``: the tiled Azure conversation trace at 1.5x its
  rate (``workload.rate_scale=1.5``: every arrival time / 1.5; ``AZURE_RATE_SCALE``);
- ``512-128-t0-10k-vllm``, ``512-128-t0-10k-orca``: loop_speed.py's 10,000 x 512/128 at t = 0 (Orca:
  reserve-to-max slots of 4,096 tokens and mixed steps);
- ``storm-128-128-t0-5k``: a recompute-preemption storm: 5,000 x 128/128 at t = 0 on 1,000 KV blocks
  (16,000 tokens for 128 running requests that grow to 256 tokens each); ``storm-128-2048-t0-5k``: the
  same with 2,048 output tokens;
- ``512-128-t0-2k``, ``512-2048-t0-2k``: 2,000 lecture requests (512/128 and 512/2,048) at t = 0 on
  Vidur's 7,424 blocks (62.3 GB: the lecture's 62.5 GB budget as Vidur's memory planner rounds it),
  where 16x the output tokens preempt;
- ``arxiv-poisson3-1m`` (kvbench only): ``arxiv-poisson3-100k``'s recipe at 1,000,000 requests, with
  kvbench's default outputs (tables and figures).

The chat rate and the Azure scale load the GPU as a busy deployment would: each offers about 3/4 of
the requests per second that the same engine serves with the same lengths all at t = 0 (kvbench,
vLLM v0 on the H100: 15.9/s for 10,000 ``workload=lognormal`` requests, 11.3/s for the Azure trace's
first 10,000, which arrive at 5.6/s at the trace's own rate), and neither simulator's queue grows
(TTFT p50 within 0.1 s on both at 10,000 requests).

Every arrival list (and every request: every scenario is checked request by request where Vidur
exports its list) is written once in both simulators' formats (side_by_side.py): kvbench replays it
with its ``request_csv`` workload, Vidur with its runner's ``REPLAY`` (Vidur clips a request to
4,096 tokens by shortening its prompt: the lists are clipped that way before either reads them).
Vidur's vLLM scheduler preempts by recompute when a running request finds no free block
(``NUM_BLOCKS`` sets its pool), so it runs the storms too; a Vidur run that takes longer than
``--vidur-timeout`` is killed and not tried again.

Measured, in ``--repeat`` paired runs per scenario (kvbench then Vidur in even pairs, Vidur then
kvbench in odd ones), medians: each simulator's whole loop, from its first request made to the last
row its loop writes (side_by_side.py says what each side's span holds: kvbench's ``loop_wall_s``;
Vidur's request making and event loop), with its parts (kvbench: the engine's own ``sim_wall_s``, the
rest making requests and writing rows; Vidur: request making, event loop), the loop's events (rows of
kvbench's step table: a step or a run of quiet steps advanced in one turn) and engine steps per
event, its whole process (start to exit, writing its normal outputs; kvbench without figures, Vidur
without plots) and its peak RSS (child_process.py); after each pair kvbench's start-up alone (the
run cut to one request, writing nothing). The machine's load average is recorded at the start and
the end: on a shared machine the paired ratios hold, absolute times do not. kvbench runs from its
bytecode cache, as Vidur's runner runs from its compiled package: kvbench is compiled once before the
first run (an editable install has no cache until a run writes one, as ``pip install`` compiles an
installed package), and its runs get the environment without ``PYTHONDONTWRITEBYTECODE`` (until
2026-12-03 every kvbench process compiled the hundred or so modules a run imports again: compiling all
178 of kvbench's takes 0.4 s on the 2-core machine). Then, kvbench only:

- peak RSS at 100k requests with kvbench's default outputs (tables and figures), one run each;
- ``poisson1m``: whether a million requests complete, in how much memory;
- a 1-request ``kvbench`` run against a minimal Hydra application (``minimal_hydra/app.py``:
  ``@hydra.main`` over a small config tree, printing one line), ``--startup-repeat`` times in turn,
  and against the same app writing a table and a figure with the libraries kvbench writes them
  with (the floor of a run's default outputs: the 1-request goal cannot be met below it);
- a profile of each scenario's loop (py-spy sampling the ``kvbench`` process, only the samples inside
  ``Engine.run`` kept; or, without py-spy, cProfile of ``Engine.run`` alone): the top functions by
  their own time, in ``scale_profiles.txt``;
- a floor: a pure-Python loop over kvbench's own steps table (each row, a step or a run of quiet
  steps advanced at once, is one event) doing a clock update and two counter updates per event: what
  just advancing those steps costs in Python on this machine. kvbench's loop / the floor says how much
  work each event does beyond that. For the 16x-tokens goal, the x16 scenario's events and floor over
  the x1 scenario's bound any simulator that writes every event down.

Writes ``<out>/scale.json``, ``<out>/scale.md`` (the goals table first) and ``<out>/scale_profiles.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import startup
from child_process import measure
from report_files import check_report, write_report
from side_by_side import (
    ARXIV_LENGTHS,
    AZURE_CONV,
    Scenario,
    arxiv_scenario,
    azure_scenario,
    chat_poisson_scenario,
    compile_kvbench,
    fixed_scenario,
    kvbench_command,
    kvbench_startup,
    poisson_lengths_scenario,
    run_kvbench,
    run_vidur,
    same_requests,
)
from speed_report import (
    HYDRA_FLOOR_RATIO_GOAL,
    LOOP_SPEEDUP_GOAL,
    MB,
    MILLION_PEAK_RSS_GOAL_MB,
    PEAK_RSS_GOAL_MB,
    PROCESS_SPEEDUP_GOAL,
    T0_LOOP_SPEEDUP_GOAL,
    TOKENS_16X_LOOP_RATIO_GOAL,
    process_parts_table,
    summarize,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
#: the start-up floor's commands (startup.py's names) by this report's names
FLOOR_COMMANDS = {
    "hydra_app": "minimal_hydra",
    "kvbench_1_request": "run_1_request",
    "kvbench_1_request_no_output": "run_1_request_no_output",
    "hydra_app_tables": "minimal_hydra_tables",  # the app writing a table (Parquet and CSV)
    "hydra_app_outputs": "minimal_hydra_outputs",  # the app writing a table and a figure
}
#: how the start-up section names them
FLOOR_LABELS = {
    "hydra_app": "`python benchmarks/minimal_hydra/app.py` (a minimal Hydra application)",
    "hydra_app_tables": "the same with `output.tables=true` (writes a one-row table: Parquet and CSV)",
    "hydra_app_outputs": "the same with `output.tables=true output.figure=true` (and draws a figure)",
    "kvbench_1_request": "`kvbench workload.num_requests=1` (its default outputs)",
    "kvbench_1_request_no_output": "`kvbench workload.num_requests=1 output.write=false`",
}
STORM_BLOCKS = 1000  #: the storms' KV pool: 1,000 blocks of 16 tokens
#: chat-like traffic's Poisson rate and the Azure conversation trace's rate scale: each about 3/4 of
#: what kvbench's vLLM v0 on the H100 serves with the same lengths all at t = 0 (15.9 requests/s
#: for 10,000 workload=lognormal requests, 11.3 for the Azure trace's first 10,000: 10,000 over the
#: run's duration_s), so that the GPU is busy and no queue grows (the module's docstring)
CHAT_RATE_PER_S = 12.0
AZURE_RATE_SCALE = 1.5
CHAT = f"chat-poisson{CHAT_RATE_PER_S:g}"
AZURE_SCALED = f"azure-conv-{AZURE_RATE_SCALE:g}x"
#: (x1, x16) pairs whose loop-time ratio is a goal
SIXTEEN_X = {
    "lecture under preemption (512-2048-t0-2k)": ("512-128-t0-2k", "512-2048-t0-2k"),
    "storm-128-2048-t0-5k": ("storm-128-128-t0-5k", "storm-128-2048-t0-5k"),
}
ARRIVAL_HEAVY = (
    f"{CHAT}-100k",
    f"{AZURE_SCALED}-100k",
    f"{CHAT}-10k",
    f"{AZURE_SCALED}-10k",
    "arxiv-poisson3-100k",
    "azure-conv-1x-100k",
    "arxiv-poisson3-10k",
)
AT_T0 = ("512-128-t0-10k-vllm", "512-128-t0-10k-orca")
AT_100K = ("arxiv-poisson3-100k", "azure-conv-1x-100k", f"{CHAT}-100k", f"{AZURE_SCALED}-100k")
#: kvbench's default outputs (side_by_side's scenarios write no figures, as Vidur writes no plots)
DEFAULT_OUTPUTS = ("output.figures=true",)
MILLION = "arxiv-poisson3-1m"
LARGE = 100_000  #: --large-repeat applies to scenarios of this many requests and more
QUICK_PROFILES = ("arxiv-poisson3-100k", "storm-128-2048-t0-5k")  #: --quick profiles these only


@dataclass(frozen=True)
class Spec:
    """A scenario at its full and its --quick size (requests)."""

    name: str
    build: Callable[[int, Path], Scenario]
    full: int
    quick: int


def _spec(name: str, build: Callable[[str, int, Path], Scenario], full: int, quick: int) -> Spec:
    return Spec(name, lambda n, work: build(name, n, work), full, quick)


def _arxiv(name: str, n: int, work: Path) -> Scenario:
    return poisson_lengths_scenario(name, ARXIV_LENGTHS, n, work)


def _chat(name: str, n: int, work: Path) -> Scenario:
    return chat_poisson_scenario(name, n, work, CHAT_RATE_PER_S)


def _azure_scaled(name: str, n: int, work: Path) -> Scenario:
    return azure_scenario(name, AZURE_CONV, n, work, rate_scale=AZURE_RATE_SCALE)


def _fixed(prompt: int, output: int, **kwargs) -> Callable[[str, int, Path], Scenario]:
    return lambda name, n, work: fixed_scenario(name, n, prompt, output, **kwargs)


SPECS = (
    _spec("arxiv-poisson3-10k", lambda name, n, work: arxiv_scenario(ARXIV_LENGTHS, n, work, name=name), 10_000, 1_000),
    _spec("arxiv-poisson3-100k", _arxiv, 100_000, 2_000),
    _spec("azure-conv-1x-100k", lambda name, n, work: azure_scenario(name, AZURE_CONV, n, work), 100_000, 2_000),
    _spec(f"{CHAT}-10k", _chat, 10_000, 1_000),
    _spec(f"{CHAT}-100k", _chat, 100_000, 2_000),
    _spec(f"{AZURE_SCALED}-10k", _azure_scaled, 10_000, 1_000),
    _spec(f"{AZURE_SCALED}-100k", _azure_scaled, 100_000, 2_000),
    _spec("512-128-t0-10k-vllm", _fixed(512, 128), 10_000, 1_000),
    _spec("512-128-t0-10k-orca", _fixed(512, 128, orca=True), 10_000, 1_000),
    _spec("storm-128-128-t0-5k", _fixed(128, 128, kv_blocks=STORM_BLOCKS), 5_000, 500),
    _spec("storm-128-2048-t0-5k", _fixed(128, 2048, kv_blocks=STORM_BLOCKS), 5_000, 500),
    _spec("512-128-t0-2k", _fixed(512, 128), 2_000, 300),
    _spec("512-2048-t0-2k", _fixed(512, 2048), 2_000, 300),
)
MILLION_SPEC = _spec(MILLION, _arxiv, 1_000_000, 5_000)
NAMES = tuple(s.name for s in SPECS)


# ---- the floor -----------------------------------------------------------------------------------


def advance_steps(num_steps: list[int], durations_s: list[float]) -> tuple[float, int, int]:
    """Only advance the steps: per event (a row of the steps table) a clock update and two counters."""
    clock_s, steps, events = 0.0, 0, 0
    for count, duration_s in zip(num_steps, durations_s):
        clock_s += duration_s
        steps += count
        events += 1
    return clock_s, steps, events


def floor_estimate(steps_table: Path, rounds: int = 5) -> dict:
    """The best of ``rounds`` timings of :func:`advance_steps` over a kvbench run's steps table."""
    table = pd.read_parquet(steps_table, columns=["num_steps", "duration_s"])
    num_steps, durations_s = table["num_steps"].tolist(), table["duration_s"].tolist()
    best_s = float("inf")
    for _ in range(rounds):
        start_s = time.perf_counter()
        advance_steps(num_steps, durations_s)
        best_s = min(best_s, time.perf_counter() - start_s)
    return {"events": len(num_steps), "steps": int(sum(num_steps)), "floor_s": best_s}


# ---- profiles ------------------------------------------------------------------------------------

#: a frame of py-spy's raw output with -F: "function (file:first line)"
_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
#: cProfile's child: builds the run as ``kvbench`` does and profiles ``Engine.run`` alone
CPROFILE_CHILD = """
import cProfile, json, sys
import numpy as np
from kvbench.api import compose
from kvbench.app.run import setup
from kvbench.core.request import requests_from_workload
from kvbench.engine import Engine
from kvbench.exec.sim import SimExecutor
cfg, _ = compose(json.loads(sys.argv[1]))
s = setup(cfg)
requests = requests_from_workload(s.workload_source.generate(np.random.default_rng(int(cfg.seed))), int(cfg.seed))
engine = Engine(s.scheduler, SimExecutor(s.cost), event_driven=bool(cfg.event_driven))
profile = cProfile.Profile()
profile.runcall(engine.run, requests)
profile.dump_stats(sys.argv[2])
"""


def _frame(text: str) -> str:
    match = _FRAME.match(text)
    return f"{match['name']} ({match['file']})" if match else text


def py_spy_profile(scenario: Scenario, work: Path, top: int, rate_hz: int = 250) -> dict:
    """Sample a ``kvbench`` run of the scenario; the top functions of its loop by own (leaf) samples."""
    raw = work / f"{scenario.name}.pyspy"
    argv = [
        str(Path(sys.executable).with_name("py-spy")),
        "record",
        "--rate",
        str(rate_hz),
        "--function",
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(raw),
        "--",
        *kvbench_command(),
        *scenario.kvbench_overrides,
        f"hydra.run.dir={work / (scenario.name + '-profile')}",
        "output.write=false",
    ]
    measure(argv).check(f"py-spy ({scenario.name})")
    own, inclusive, total = Counter(), Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        inside = next((i for i, f in enumerate(frames) if f.startswith("Engine.run (") and "engine.py" in f), None)
        if inside is None:
            continue
        samples = int(count)
        total += samples
        loop_frames = [_frame(f) for f in frames[inside:]]
        own[loop_frames[-1]] += samples
        for name in set(loop_frames):
            inclusive[name] += samples
    return _top("py-spy", f"{rate_hz} Hz samples of the kvbench process inside Engine.run", own, inclusive, total, top)


def cprofile_profile(scenario: Scenario, work: Path, top: int) -> dict:
    """cProfile of ``Engine.run`` alone in a child process (deterministic; it inflates call-heavy code)."""
    stats_file = work / f"{scenario.name}.prof"
    overrides = [*scenario.kvbench_overrides, "output.write=false"]
    done = subprocess.run(
        [sys.executable, "-c", CPROFILE_CHILD, json.dumps(overrides), str(stats_file)],
        capture_output=True,
        text=True,
        cwd=work,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cProfile ({scenario.name}) failed: {done.stderr.strip().splitlines()[-1:]}")
    stats = pstats.Stats(str(stats_file)).stats
    own, inclusive = Counter(), Counter()
    for (file, _, name), (_, _, own_s, cumulative_s, _) in stats.items():
        key = f"{name} ({'/'.join(Path(file).parts[-2:])})" if file != "~" else name
        own[key] += own_s
        inclusive[key] = max(inclusive[key], cumulative_s)
    total = sum(own.values())
    return _top(
        "cProfile", "seconds inside Engine.run (deterministic, with cProfile's overhead)", own, inclusive, total, top
    )


def _top(profiler: str, unit: str, own: Counter, inclusive: Counter, total: float, top: int) -> dict:
    rows = [
        {"function": name, "own_share": value / total, "inclusive_share": min(1.0, inclusive[name] / total)}
        for name, value in own.most_common(top)
    ]
    return {"profiler": profiler, "unit": unit, "total": total, "top": rows}


def profile_text(profiles: dict) -> str:
    lines = ["kvbench's loop: the top functions by own time, per scenario (scale.py)", ""]
    for name, p in profiles.items():
        if "error" in p:
            lines += [f"== {name}: no profile ({p['error']})", ""]
            continue
        lines += [f"== {name} ({p['profiler']}: {p['total']:,.6g} {p['unit']})", "   own   incl.  function"]
        lines += [f"{r['own_share']:6.1%} {r['inclusive_share']:6.1%}  {r['function']}" for r in p["top"]]
        lines.append("")
    return "\n".join(lines)


# ---- the measurement -----------------------------------------------------------------------------


def with_retries(attempt: Callable[[], dict], retries: int, wait_s: float = 60.0) -> dict:
    """``attempt()``, tried again ``retries`` times ``wait_s`` apart if kvbench fails (a working tree
    others edit can fail to import for a moment); the last failure is raised."""
    for number in range(retries + 1):
        try:
            return attempt()
        except RuntimeError as exc:
            if number == retries:
                raise
            print(f"scale: {str(exc).splitlines()[0]}; trying again in {wait_s:.0f} s", file=sys.stderr, flush=True)
            time.sleep(wait_s)
    raise AssertionError("unreachable")


def paired_runs(scenarios: dict[str, Scenario], args: argparse.Namespace, work: Path) -> tuple[dict, dict]:
    """``--repeat`` rounds over every scenario, each a pair (kvbench, Vidur; their order alternating by
    round) and kvbench's start-up; the floor from each scenario's first kvbench run."""
    runs: dict[str, list[dict]] = {name: [] for name in scenarios}
    floors: dict[str, dict] = {}
    vidur_off: dict[str, str] = {}  # scenario -> why Vidur is no longer run
    for number in range(args.repeat):
        for name, scenario in scenarios.items():
            if number >= args.large_repeat and int(scenario.vidur_env["N"]) >= LARGE:
                continue
            run: dict = {}
            run_dir = work / f"{name}-{number}"
            order = ("kvbench", "vidur") if number % 2 == 0 else ("vidur", "kvbench")
            for side in order:
                if side == "kvbench":
                    run["kvbench"] = with_retries(lambda: run_kvbench(scenario, run_dir), args.retries)
                elif args.vidur_run and name not in vidur_off:
                    try:
                        run["vidur"] = run_vidur(args.vidur_run, scenario, args.vidur_timeout)
                    except RuntimeError as exc:
                        vidur_off[name] = str(exc).splitlines()[0]
                        run["vidur_error"] = vidur_off[name]
            if "vidur" in run:
                run["same_requests"] = same_requests(run_dir / "requests.csv", run["vidur"].pop("requests_csv"))
            if name not in floors:
                floors[name] = floor_estimate(run_dir / "steps.parquet")
            shutil.rmtree(run_dir, ignore_errors=True)
            if not args.quick:
                run["kvbench_startup"] = kvbench_startup(scenario, work / f"{name}-{number}-one")
            print(json.dumps({"scenario": name, "round": number, **run}), file=sys.stderr, flush=True)
            runs[name].append(run)
    return runs, floors


def hydra_floor(repeat: int, work: Path) -> dict:
    """A 1-request ``kvbench`` run (its defaults: tables and a figure; and writing nothing) against
    the minimal Hydra application: startup.py's rounds (one untimed, then ``repeat``, every command
    in turn), and each run's median ratio to the Hydra app in the same round."""
    measured = startup.measure(list(FLOOR_COMMANDS.values()), repeat, work)
    result = {
        name: {
            "wall_s": measured[command]["wall_s"],
            "walls_s": measured[command]["walls_s"],
            "peak_rss_mb": measured[command]["peak_rss_mib"] * 2**20 / MB,
        }
        for name, command in FLOOR_COMMANDS.items()
    }
    result["ratio"] = measured["run_1_request"]["vs_hydra"]
    result["ratio_no_output"] = measured["run_1_request_no_output"]["vs_hydra"]
    # the floor of the run's own outputs: the Hydra app writing a table and a figure
    result["outputs_floor_ratio"] = measured["minimal_hydra_outputs"]["vs_hydra"]
    result["ratio_own_floor"] = measured["run_1_request"]["vs_own_floor"]
    return result


def default_outputs_run(scenario: Scenario, work: Path) -> dict:
    """One kvbench run with its default outputs (tables and figures): process time, peak RSS, loop."""
    run_dir = work / f"{scenario.name}-default-outputs"
    try:
        row = run_kvbench(scenario, run_dir, extra=DEFAULT_OUTPUTS)
    except RuntimeError as exc:
        return {"error": str(exc).splitlines()[0]}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {**row, "peak_rss_mb": row["peak_rss_bytes"] / MB}


# ---- the report ----------------------------------------------------------------------------------


def _verdict(value: float | None, goal: float, at_least: bool) -> str:
    if value is None:
        return "not measured"
    return "pass" if (value >= goal if at_least else value <= goal) else "fail"


def _ratio_of_loops(runs: list[dict], side: str, x1: list[dict]) -> float | None:
    """The median over rounds of x16's loop / x1's loop on one side (rounds paired by number)."""
    ratios = [a[side]["loop_s"] / b[side]["loop_s"] for a, b in zip(runs, x1) if side in a and side in b]
    return statistics.median(ratios) if ratios else None


def _floor_ratios(floors: dict, x1: str, x16: str) -> dict:
    """What 16x the tokens does to the exact step table itself: its rows (events, an exact count)
    and the floor loop over them (x16 / x1). Any simulator that writes every event down pays at
    least the events' growth, so these bound the 16x goal from below."""
    if x1 not in floors or x16 not in floors:
        return {}
    return {
        "events": floors[x16]["events"] / floors[x1]["events"],
        "floor": floors[x16]["floor_s"] / floors[x1]["floor_s"],
    }


def goals(report: dict) -> list[dict]:
    """Each goal of the issue: what it is, where, its measured value, pass/fail."""
    s, rows = report["scenarios"], []

    def add(goal: str, where: str, value: float | None, text: str, target: float, at_least: bool) -> None:
        rows.append(
            {
                "goal": goal,
                "where": where,
                "value": value,
                "measured": text,
                "verdict": _verdict(value, target, at_least),
            }
        )

    speed = lambda v: "-" if v is None else f"{v:.1f}x"  # noqa: E731

    def loop_text(summary: dict) -> str:  # the whole loop's ratio, and why ratios differ: steps per event
        per_event = summary.get("steps_per_event")
        return speed(summary["loop_speedup"]) + ("" if per_event is None else f" ({per_event:.1f} steps/event)")

    for names, target, goal in (
        (ARRIVAL_HEAVY, LOOP_SPEEDUP_GOAL, f"whole loop >= {LOOP_SPEEDUP_GOAL:g}x Vidur's"),
        (AT_T0, T0_LOOP_SPEEDUP_GOAL, f"whole loop >= {T0_LOOP_SPEEDUP_GOAL:g}x Vidur's at t = 0"),
    ):
        for name in names:
            if name in s:
                add(goal, name, s[name]["loop_speedup"], loop_text(s[name]), target, True)
    # a scenario's kvbench process writes its tables: it cannot take less than the Hydra app writing
    # a table, so Vidur's process over that app's time bounds the speed-up any such run could reach
    tables_floor_s = report.get("hydra", {}).get("hydra_app_tables", {}).get("wall_s")
    for name, summary in s.items():
        value = summary["process_speedup"]
        text = speed(value)
        vidur_s = summary["median"]["vidur_process_s"]
        if tables_floor_s and vidur_s:
            text += f" (bound {vidur_s / tables_floor_s:.1f}x)"
        add(f"whole process >= {PROCESS_SPEEDUP_GOAL:g}x Vidur's", name, value, text, PROCESS_SPEEDUP_GOAL, True)
    for name, run in report.get("default_outputs", {}).items():
        value = run.get("peak_rss_mb")
        text = run.get("error") or f"{value:.0f} MB"
        add(
            f"peak RSS <= {PEAK_RSS_GOAL_MB:g} MB at 100k requests, default outputs",
            name,
            value,
            text,
            PEAK_RSS_GOAL_MB,
            False,
        )
    million = report.get("million")
    if million:
        value = million.get("peak_rss_mb")
        text = million.get("error") or (
            f"{million['requests']:,} requests, {value:.0f} MB, loop {million['loop_s']:.0f} s, "
            f"process {million['process_s']:.0f} s"
        )
        add(
            f"{million['num_requests']:,} requests complete in < {MILLION_PEAK_RSS_GOAL_MB / 1000:g} GB",
            MILLION,
            value,
            text,
            MILLION_PEAK_RSS_GOAL_MB,
            False,
        )
    for where, ratio in report.get("sixteen_x", {}).items():
        value = ratio["kvbench"]
        notes = [] if ratio["vidur"] is None else [f"Vidur {ratio['vidur']:.1f}x"]
        if "events" in ratio:  # the bound: the step table's own growth
            notes.append(f"events {ratio['events']:.1f}x, the floor loop over them {ratio['floor']:.1f}x")
        add(
            f"16x output tokens cost < {TOKENS_16X_LOOP_RATIO_GOAL:g}x the loop time",
            where,
            value,
            f"{value:.1f}x" + (f" ({'; '.join(notes)})" if notes else ""),
            TOKENS_16X_LOOP_RATIO_GOAL,
            False,
        )
        rows[-1]["verdict"] = "pass" if value < TOKENS_16X_LOOP_RATIO_GOAL else "fail"
    hydra = report.get("hydra")
    if hydra:
        value = hydra["ratio"]
        text = (
            f"{value:.2f}x (median of the rounds' ratios; medians {hydra['kvbench_1_request']['wall_s']:.2f} / "
            f"{hydra['hydra_app']['wall_s']:.2f} s; writing nothing {hydra['ratio_no_output']:.2f}x)"
        )
        if "outputs_floor_ratio" in hydra:  # the bound: the same app writing a table and a figure
            text += (
                f"; the Hydra app writing a table and a figure {hydra['outputs_floor_ratio']:.2f}x, "
                f"kvbench {hydra['ratio_own_floor']:.2f}x that"
            )
        add(
            f"1-request run within {HYDRA_FLOOR_RATIO_GOAL:g}x a minimal Hydra app",
            "run_1_request",
            value,
            text,
            HYDRA_FLOOR_RATIO_GOAL,
            False,
        )
    return rows


def _pair(a: float | None, b: float | None, fmt: str) -> str:
    return f"{'-' if a is None else format(a, fmt)} / {'-' if b is None else format(b, fmt)}"


def _load_text(report: dict) -> str:
    load = report.get("load_average")
    if not load:
        return ""
    return (
        f" The machine's 1-minute load average was {load['start']:.1f} at the start and {load['end']:.1f} at the end "
        f"on {report.get('cores', '?')} cores: other work shared it, so absolute times are slower than on an idle "
        "machine, while each ratio pairs runs made minutes apart."
    )


def markdown(report: dict) -> str:
    lines = [
        "# Speed at scale: kvbench against Vidur 0.0.26",
        "",
        (
            f"Measured {report['measured_at']} with `{report['command']}` on {report['machine']}: "
            f"{report['repeat']} paired runs per scenario ({report['large_repeat']} of each 100,000-request one; "
            "kvbench and Vidur in turn, the order alternating), medians."
            + ("" if report["vidur"] else " Vidur not run.")
            + _load_text(report)
        ),
        "",
        (
            "Each loop is timed whole, from its first request made to the last row it writes. kvbench: `Engine.run` "
            "from just before its first request is made (it makes them as they arrive) to the last rows of its step "
            "table written to `steps.parquet` and of its request table stored (`loop_wall_s`). Vidur: its request "
            "making (`Simulator._init_event_queue`: every request object and its arrival event, before its event "
            "loop) plus its event loop (`Simulator.run` less writing its outputs); it keeps its metrics in memory "
            "and writes its tables after the loop. Steps per event: kvbench's engine steps over its loop's events "
            "(rows of its step table: a step, or a run of quiet steps advanced in one turn), both exact counts; "
            "the more steps an event covers, the less each step costs."
        ),
        "",
        "## Goals",
        "",
        "| goal | scenario | measured | verdict |",
        "|---|---|---|---|",
    ]
    for g in report["goals"]:
        lines.append(
            f"| {g['goal']} | {g['where']} | {g['measured']} | {'**' + g['verdict'] + '**' if g['verdict'] == 'fail' else g['verdict']} |"
        )
    hydra = report.get("hydra", {})
    if "hydra_app_tables" in hydra:
        lines += [
            "",
            (
                "The bounds are floors no run could go below. Whole process: Vidur's process over the minimal "
                f"Hydra app writing a one-row table with kvbench's libraries ({hydra['hydra_app_tables']['wall_s']:.2f} s; "
                "each scenario's kvbench run writes its tables). 16x tokens: the x16 scenario's events (rows of "
                "the exact step table, an exact count) and a loop that only advances them, over the x1 "
                "scenario's. 1-request run: the same Hydra app writing a table and drawing a figure "
                f"({hydra['hydra_app_outputs']['wall_s']:.2f} s), as a kvbench run does by default."
            ),
        ]
    lines += [
        "",
        "## Scenarios",
        "",
        (
            "| scenario | steps kvbench / Vidur | events kvbench | steps per event | preemptions kvbench / Vidur "
            "| whole loop s kvbench / Vidur | whole-loop speed-up | process s kvbench / Vidur | process speed-up "
            "| peak RSS MB kvbench / Vidur | same requests |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    speed = lambda v: "-" if v is None else f"{v:.1f}x"  # noqa: E731
    number = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    for name, s in report["scenarios"].items():
        m = s["median"]
        error = report["vidur_errors"].get(name)
        same = {True: "yes", False: "NO", None: "-"}[s["same_requests"]]
        lines.append(
            f"| {name}: {s['description']}{' (Vidur: ' + error + ')' if error else ''} "
            f"| {_pair(m['kvbench_steps'], m['vidur_steps'], ',.0f')} | {number(m['kvbench_events'], ',.0f')} "
            f"| {number(s.get('steps_per_event'), '.2f')} "
            f"| {_pair(m['kvbench_preemptions'], m['vidur_preemptions'], ',.0f')} "
            f"| {_pair(m['kvbench_loop_s'], m['vidur_loop_s'], '.3f')} | {speed(s['loop_speedup'])} "
            f"| {_pair(m['kvbench_process_s'], m['vidur_process_s'], '.2f')} | {speed(s['process_speedup'])} "
            f"| {_pair(s['kvbench_peak_rss_mb'], s['vidur_peak_rss_mb'], '.0f')} | {same} |"
        )
    lines += [
        "",
        "## The whole loop and its parts",
        "",
        (
            "Medians, s. kvbench's engine is its loop less making requests, storing finished requests' rows and "
            "writing the step table (`sim_wall_s`); Vidur's event loop is its loop less making its requests. "
            "The engine-only ratio is the one scale.py reported before it timed whole loops (kvbench's "
            "`sim_wall_s` against Vidur's event loop)."
        ),
        "",
        (
            "| scenario | kvbench whole loop | engine | making requests, writing rows | share | Vidur whole loop "
            "| making requests | event loop | whole-loop speed-up | engine-only speed-up |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in report["scenarios"].items():
        m = s["median"]
        loop_s, engine_s = m["kvbench_loop_s"], m["kvbench_engine_loop_s"]
        outside_s = None if loop_s is None or engine_s is None else loop_s - engine_s
        share = None if outside_s is None or not loop_s else outside_s / loop_s
        lines.append(
            f"| {name} | {number(loop_s, '.3f')} | {number(engine_s, '.3f')} | {number(outside_s, '.3f')} "
            f"| {number(share, '.1%')} | {number(m['vidur_loop_s'], '.3f')} | {number(m['vidur_request_making_s'], '.3f')} "
            f"| {number(m['vidur_event_loop_s'], '.3f')} | {speed(s['loop_speedup'])} | {speed(s.get('engine_loop_speedup'))} |"
        )
    lines += [
        "",
        "Where kvbench's process goes (medians, s): start-up is the same run cut to one request, writing nothing; "
        "the rest is building the workload, the summary and the tables, and writing them.",
        "",
        *process_parts_table(
            report["scenarios"], [("start-up", "startup", ".2f"), ("loop", "loop", ".3f"), ("rest", "rest", ".2f")]
        ),
    ]
    lines += [
        "",
        "## The floor",
        "",
        (
            "A pure-Python loop over kvbench's own steps table (one event per row: a step, or a run of quiet steps "
            "advanced at once), a clock update and two counters per event, the best of 5 (`advance_steps`):"
        ),
        "",
        "| scenario | events (rows) | steps | floor ms | floor ns per event | kvbench whole loop µs per event | kvbench loop / floor |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in report["floors"].items():
        loop_s = report["scenarios"][name]["median"]["kvbench_loop_s"]
        lines.append(
            f"| {name} | {f['events']:,} | {f['steps']:,} | {f['floor_s'] * 1e3:.2f} | {f['floor_s'] / f['events'] * 1e9:.0f} "
            f"| {loop_s / f['events'] * 1e6:.1f} | {loop_s / f['floor_s']:,.0f}x |"
        )
    lines += [
        "",
        "## Profiles",
        "",
        "The five functions with the most own time in each loop (all in `scale_profiles.txt`):",
        "",
    ]
    for name, p in report["profiles"].items():
        if "error" in p:
            lines.append(f"- {name}: no profile ({p['error']})")
            continue
        top = ", ".join(f"`{r['function']}` {r['own_share']:.0%}" for r in p["top"][:5])
        lines.append(f"- {name} ({p['profiler']}): {top}")
    hydra = report.get("hydra")
    if hydra:
        lines += [
            "",
            "## Start-up against Hydra's floor",
            "",
            f"Median of {len(hydra['hydra_app']['walls_s'])} rounds after one untimed round, each running these "
            "in turn:",
            "",
            "| command | wall s | peak RSS MB |",
            "|---|---:|---:|",
        ]
        for name, label in FLOOR_LABELS.items():
            if name in hydra:
                lines.append(f"| {label} | {hydra[name]['wall_s']:.2f} | {hydra[name]['peak_rss_mb']:.0f} |")
    return "\n".join(lines) + "\n"


# ---- the command ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/scale.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vidur-run", help="a Vidur 0.0.26 runner script (side_by_side.py); without it only kvbench runs"
    )
    parser.add_argument("--repeat", type=int, default=2, help="paired runs per scenario (default 2)")
    parser.add_argument("--scenarios", default=",".join(NAMES), help=f"comma-separated, of {', '.join(NAMES)}")
    parser.add_argument("--quick", action="store_true", help="small N, no Vidur, one round, two profiles: a smoke test")
    parser.add_argument("--vidur-timeout", type=float, default=900.0, help="kill a Vidur run after this many s")
    parser.add_argument(
        "--startup-repeat", type=int, default=5, help="timed rounds of kvbench against Hydra (default 5)"
    )
    parser.add_argument("--no-million", action="store_true", help="leave out the 1,000,000-request run")
    parser.add_argument("--profiler", choices=("auto", "py-spy", "cprofile", "none"), default="auto")
    parser.add_argument(
        "--large-repeat", type=int, default=None, help="paired runs of the 100,000-request scenarios (default --repeat)"
    )
    parser.add_argument("--retries", type=int, default=0, help="try a failed kvbench run again (default 0)")
    parser.add_argument("--top", type=int, default=15, help="functions listed per profile (default 15)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="folder for scale.{json,md} (default benchmarks/results)"
    )
    args = parser.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(args.scenarios) - set(NAMES))
    if unknown:
        parser.error(f"--scenarios: unknown {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    if args.quick:
        args.vidur_run, args.repeat, args.startup_repeat = None, 1, 1
    if args.vidur_run and not Path(args.vidur_run).is_file():
        parser.error(f"--vidur-run {args.vidur_run}: no such file; give a Vidur runner script")
    args.large_repeat = args.repeat if args.large_repeat is None else min(args.large_repeat, args.repeat)
    if args.repeat < 1 or args.startup_repeat < 1 or args.large_repeat < 1:
        parser.error("--repeat and --startup-repeat must be >= 1")
    if args.profiler == "auto":
        args.profiler = "py-spy" if Path(sys.executable).with_name("py-spy").is_file() else "cprofile"
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    check_report("scale", args.out, ["scale.json", "scale.md", "scale_profiles.txt"])
    argv = sys.argv[1:] if argv is None else argv
    command = " ".join(["python benchmarks/scale.py", *("$VIDUR_RUN" if a == args.vidur_run else a for a in argv)])
    size = (lambda spec: spec.quick) if args.quick else (lambda spec: spec.full)
    report: dict = {
        "command": command,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "cores": os.cpu_count(),
        "load_average": {"start": os.getloadavg()[0]},
        "repeat": args.repeat,
        "large_repeat": args.large_repeat,
        "vidur": bool(args.vidur_run),
        "quick": args.quick,
    }
    compile_kvbench()  # kvbench's runs use its bytecode cache, as Vidur's use theirs
    with tempfile.TemporaryDirectory(prefix="kvbench-scale-") as tmp:
        work = Path(tmp)
        chosen = [spec for spec in SPECS if spec.name in args.scenarios]
        scenarios = {spec.name: spec.build(size(spec), work) for spec in chosen}
        runs, floors = paired_runs(scenarios, args, work)
        report["scenarios"] = {
            name: {"description": scenarios[name].description, "runs": runs[name], **summarize(runs[name])}
            for name in scenarios
        }
        report["vidur_errors"] = {
            name: run["vidur_error"] for name in runs for run in runs[name] if "vidur_error" in run
        }
        report["floors"] = floors
        report["sixteen_x"] = {
            where: {
                **{side: _ratio_of_loops(runs[x16], side, runs[x1]) for side in ("kvbench", "vidur")},
                **_floor_ratios(floors, x1, x16),
            }
            for where, (x1, x16) in SIXTEEN_X.items()
            if x1 in runs and x16 in runs
        }
        report["default_outputs"] = {
            name: default_outputs_run(scenarios[name], work)
            for name in AT_100K[: 1 if args.quick else None]
            if name in scenarios
        }
        if not args.no_million:
            million = MILLION_SPEC.build(size(MILLION_SPEC), work)
            report["million"] = {"num_requests": size(MILLION_SPEC), **default_outputs_run(million, work)}
            (work / f"{MILLION}_kvbench.csv").unlink(missing_ok=True)
        report["hydra"] = hydra_floor(args.startup_repeat, work)
        report["profiles"] = {}
        profiled = [name for name in scenarios if not args.quick or name in QUICK_PROFILES]
        for name in profiled if args.profiler != "none" else ():
            scenario = scenarios[name]
            try:
                if args.profiler == "py-spy":
                    report["profiles"][name] = py_spy_profile(scenario, work, args.top)
                else:
                    report["profiles"][name] = cprofile_profile(scenario, work, args.top)
            except RuntimeError as exc:
                report["profiles"][name] = {"error": str(exc).splitlines()[0]}
    report["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report["load_average"]["end"] = os.getloadavg()[0]
    report["goals"] = goals(report)
    text = markdown(report)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    write_report(
        "scale",
        args.out,
        {
            "scale.json": json.dumps(report, indent=1) + "\n",
            "scale.md": text,
            "scale_profiles.txt": profile_text(report["profiles"]),
        },
    )
    return report


if __name__ == "__main__":
    from kvbench.commands.signals import exit_interrupted, handle_sigterm

    handle_sigterm()  # SIGTERM unwinds like Ctrl-C: the running simulator is stopped, nothing is written
    try:
        main()
    except RuntimeError as exc:  # a simulator that failed: one line, no traceback
        sys.exit(f"scale: error: {exc}")
    except KeyboardInterrupt as exc:
        exit_interrupted(exc, "scale", "no report was written")
