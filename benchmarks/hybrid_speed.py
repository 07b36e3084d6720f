"""A sliding-window model's speed against a dense model of the same size, side by side: Gemma-3-12B
(five 1,024-token window groups for every full-attention group, so ``allocator=paged`` runs as
``hybrid_paged``) and its full-attention twin (``model.hf_config.sliding_window=null``: the same
weights and layers in one full group, on the paged allocator), on the same requests.

    python benchmarks/hybrid_speed.py                         # 100,000 requests, 2 pairs (about 2 min on 2 idle cores)
    python benchmarks/hybrid_speed.py --requests 10000 --repeat 3
    python benchmarks/hybrid_speed.py --models gemma3-12b,mistral-7b-v0.1
    python benchmarks/hybrid_speed.py --quick                 # 2,000 requests, one pair: a smoke test
    python benchmarks/hybrid_speed.py --profile               # and cProfile of the window model's loop
    python benchmarks/hybrid_speed.py --kvbench OLD/.venv/bin/kvbench --out OUT   # another checkout's kvbench

The requests are scale.py's ``arxiv-poisson3-100k`` recipe at ``--requests``: (prompt, output) pairs
drawn with replacement from the arXiv-summarization length file (seed 42), prompt + output clipped
to 4,096 tokens, Poisson arrivals at 3/s, replayed with vLLM v0's scheduling (side_by_side.VLLM:
paged blocks of 16, prefill-first steps of at most 4,096 prompt tokens, at most 128 running, recompute
preemption). Their prompts (2,591 tokens on average) outgrow Gemma-3's 1,024-token window, so its
window groups free blocks as they decode. The KV budget is 40 GB for Gemma-3-12B (its 23.5 GB of
weights leave less than the 62.3 GB the Llama-2-7B scenarios use) and those 62.3 GB for
Mistral-7B v0.1 (whose 4,096-token window these clipped requests never pass: every layer windowed,
nothing freed).

Each pair runs the window model and its twin as ``kvbench`` processes writing their tables (Parquet
and CSV, no figures), in turns: the window model first in even pairs, the twin first in odd ones, so
a busy minute on a shared machine slows both. The two take different numbers of engine steps (the
window model holds more sequences at once, so the runs differ), so they are compared per engine step:
a run's whole loop (``loop_wall_s``: from its first request made to the last row written) over its
``num_steps``, the median over pairs, and the window model's over the twin's. Also each run's events
(rows of its step table: a step, or a run of quiet decode steps advanced in one turn) and engine
steps per event, which is what a turn of the loop covers.

Writes ``<out>/hybrid_speed.json`` and ``<out>/hybrid_speed.md`` (with ``--profile`` also
``<out>/hybrid_speed_profile.txt``: the top functions of the window model's loop, cProfile of
``Engine.run`` alone).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from report_files import check_report, write_report
from scale import cprofile_profile, profile_text
from side_by_side import (
    ARXIV_LENGTHS,
    KV_BUDGET_BYTES,
    Scenario,
    compile_kvbench,
    kvbench_command,
    poisson_lengths_scenario,
    run_kvbench,
)

RESULTS = Path(__file__).resolve().parent / "results" / "hybrid_speed"
#: the goal: the window model's loop per engine step within this many times the twin's
GOAL_RATIO = 2.0


@dataclass(frozen=True)
class ModelPair:
    """A model with sliding-window layers and its full-attention twin, on one KV budget."""

    name: str
    label: str
    attention: str
    kv_budget_bytes: float

    def overrides(self, twin: bool, kv_budget_bytes: float | None = None) -> list[str]:
        budget = self.kv_budget_bytes if kv_budget_bytes is None else kv_budget_bytes
        model = [f"model={self.name}", f"hardware.kv_budget_bytes={budget:.12g}"]
        return [*model, "model.hf_config.sliding_window=null"] if twin else model


PAIRS = {
    "gemma3-12b": ModelPair("gemma3-12b", "Gemma-3-12B", "5:1, window 1,024", 40e9),
    "mistral-7b-v0.1": ModelPair("mistral-7b-v0.1", "Mistral-7B v0.1", "window 4,096", KV_BUDGET_BYTES),
}
SIDES = ("window", "twin")


def side_scenario(requests: Scenario, pair: ModelPair, side: str, kv_budget_bytes: float | None = None) -> Scenario:
    """The request list's replay on one side of a pair: its model and the pair's KV budget (or this one)."""
    replay = [o for o in requests.kvbench_overrides if not o.startswith("hardware.kv_budget_bytes=")]
    overrides = [*replay, *pair.overrides(twin=side == "twin", kv_budget_bytes=kv_budget_bytes)]
    what = f"{pair.label} ({pair.attention if side == 'window' else 'full attention, the twin'})"
    return Scenario(f"{pair.name}-{side}", what, overrides)


def per_step_us(run: dict) -> float:
    return run["loop_s"] / run["steps"] * 1e6


def summarize(runs: list[dict]) -> dict:
    """One side's runs: medians of the loop and its engine part; steps and events (the same in every run)."""
    first = runs[0]
    return {
        "loop_s": statistics.median(r["loop_s"] for r in runs),
        "engine_loop_s": statistics.median(r["engine_loop_s"] for r in runs),
        "us_per_step": statistics.median(per_step_us(r) for r in runs),
        "steps": first["steps"],
        "events": first["events"],
        "steps_per_event": first["steps"] / first["events"] if first["events"] else None,
        "requests": first["requests"],
        "preemptions": first["preemptions"],
        "simulated_s": first["simulated_s"],
    }


def measure_pair(pair: ModelPair, requests: Scenario, args: argparse.Namespace, work: Path) -> dict:
    """``--repeat`` pairs of runs, in turns; each side's runs and their summary, and the ratio per step."""
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    scenarios = {side: side_scenario(requests, pair, side) for side in SIDES}
    for number in range(args.repeat):
        for side in SIDES if number % 2 == 0 else reversed(SIDES):
            run_dir = work / f"{pair.name}-{side}-{number}"
            run = run_kvbench(scenarios[side], run_dir, command=args.kvbench)
            shutil.rmtree(run_dir, ignore_errors=True)
            print(json.dumps({"model": pair.name, "side": side, "pair": number, **run}), file=sys.stderr, flush=True)
            runs[side].append(run)
    sides = {side: {"description": scenarios[side].description, **summarize(runs[side])} for side in SIDES}
    # per pair, then the median: each ratio is of two runs made a minute apart
    ratios = [per_step_us(w) / per_step_us(t) for w, t in zip(runs["window"], runs["twin"])]
    return {
        "label": pair.label,
        "kv_budget_bytes": pair.kv_budget_bytes,
        "overrides": {side: pair.overrides(twin=side == "twin") for side in SIDES},
        "sides": sides,
        "runs": runs,
        "per_step_ratios": ratios,
        "per_step_ratio": statistics.median(ratios),
        "whole_loop_ratio": sides["window"]["loop_s"] / sides["twin"]["loop_s"],
    }


def load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def markdown(report: dict) -> str:
    load = report["load_average"]
    load_text = (
        ""
        if load["start"] is None
        else f", load average {load['start']:.1f} at the start, {load['end']:.1f} at the end"
    )
    lines = [
        "# A sliding-window model's speed against its full-attention twin",
        "",
        f"Measured {report['measured_at']} with `{report['command']}` on {report['machine']}{load_text} "
        f"(`kvbench`: {report['kvbench']}). {report['requests_description']}. Each pair runs both models as "
        "`kvbench` processes writing their tables (Parquet and CSV, no figures), in turns; the whole loop is "
        "`loop_wall_s`, its engine part `sim_wall_s`. An event is a row of the step table: a step, or a run of "
        "quiet decode steps advanced in one turn.",
        "",
        "| model | KV budget | engine steps | events | steps per event | preemptions | whole loop s, each pair "
        "| median s | engine only s | µs per engine step | per step, window / twin |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for pair in report["pairs"].values():
        for side in SIDES:
            row = pair["sides"][side]
            loops = ", ".join(f"{r['loop_s']:.2f}" for r in pair["runs"][side])
            ratio = (
                f"**{pair['per_step_ratio']:.2f}x** ({', '.join(f'{r:.2f}' for r in pair['per_step_ratios'])})"
                if side == "window"
                else "1"
            )
            lines.append(
                f"| {row['description']} | {pair['kv_budget_bytes'] / 1e9:.1f} GB | {row['steps']:,} | {row['events']:,} "
                f"| {row['steps_per_event']:.1f} | {row['preemptions']:,} | {loops} | {row['loop_s']:.2f} "
                f"| {row['engine_loop_s']:.2f} | {row['us_per_step']:.2f} | {ratio} |"
            )
    lines.append("")
    for name, pair in report["pairs"].items():
        verdict = "within" if pair["per_step_ratio"] <= GOAL_RATIO else "**not** within"
        lines.append(
            f"- {pair['label']}: the window model's loop takes {pair['per_step_ratio']:.2f}x its twin's per engine "
            f"step ({verdict} the {GOAL_RATIO:g}x goal), {pair['whole_loop_ratio']:.2f}x its whole loop "
            f"({pair['sides']['window']['steps']:,} steps against {pair['sides']['twin']['steps']:,})."
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/hybrid_speed.py", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, help="requests in the replay (default 100,000)")
    parser.add_argument("--repeat", type=int, default=2, help="pairs of runs per model (default 2)")
    parser.add_argument("--models", default="gemma3-12b", help=f"comma-separated, of {', '.join(PAIRS)}")
    parser.add_argument("--quick", action="store_true", help="2,000 requests, one pair: a smoke test")
    parser.add_argument("--profile", action="store_true", help="also cProfile the window model's loop")
    parser.add_argument("--kvbench", type=Path, default=None, help="another install's kvbench command")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for hybrid_speed.{json,md}")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(PAIRS))
    if unknown or not args.models:
        parser.error(f"--models: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(PAIRS)}")
    if args.quick:
        args.requests, args.repeat = 2_000, 1
    if args.requests < 1 or args.repeat < 1:
        parser.error("--requests and --repeat must be at least 1")
    if args.kvbench is not None and not args.kvbench.is_file():
        parser.error(f"--kvbench: no such file {args.kvbench}")
    args.kvbench = None if args.kvbench is None else [str(args.kvbench)]
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    names = ["hybrid_speed.json", "hybrid_speed.md", *(["hybrid_speed_profile.txt"] if args.profile else [])]
    check_report("hybrid_speed", args.out, names)
    if args.kvbench is None:
        compile_kvbench()
    report: dict = {
        "command": " ".join(["python benchmarks/hybrid_speed.py", *argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "kvbench": (args.kvbench or kvbench_command())[0],
        "load_average": {"start": load_average()},
        "pairs": {},
    }
    texts = {}
    with tempfile.TemporaryDirectory(prefix="kvbench-hybrid-speed-") as tmp:
        work = Path(tmp)
        requests = poisson_lengths_scenario("arxiv-poisson3", ARXIV_LENGTHS, args.requests, work)
        report["requests"] = args.requests
        report["requests_description"] = requests.description.replace(", paged prefill-first", "") + (
            ", replayed with vLLM v0's scheduling (paged blocks of 16, prefill-first, at most 128 running, "
            "recompute preemption)"
        )
        for name in args.models:
            report["pairs"][name] = measure_pair(PAIRS[name], requests, args, work)
        if args.profile:
            pair = PAIRS[args.models[0]]
            profile = cprofile_profile(side_scenario(requests, pair, "window"), work, top=25)
            texts["hybrid_speed_profile.txt"] = profile_text({f"{pair.name} ({args.requests:,} requests)": profile})
    report["load_average"]["end"] = load_average()
    report["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = markdown(report)
    print(text)
    texts = {"hybrid_speed.json": json.dumps(report, indent=1) + "\n", "hybrid_speed.md": text, **texts}
    write_report("hybrid_speed", args.out, texts)
    return report


if __name__ == "__main__":
    from kvbench.commands.signals import exit_interrupted, handle_sigterm

    handle_sigterm()  # SIGTERM unwinds like Ctrl-C: the running kvbench is stopped, nothing is written
    try:
        main()
    except (RuntimeError, OSError) as exc:  # a kvbench run that failed, an unwritable --out: no traceback
        print(f"hybrid_speed: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as exc:
        exit_interrupted(exc, "hybrid_speed", "no report was written")
