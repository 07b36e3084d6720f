"""kvbench against Vidur 0.0.26 on identical requests: loop time, whole-process time and peak memory.

    python benchmarks/loop_speed.py --vidur-run $VIDUR_RUN --arxiv-lengths $ARXIV_LENGTHS \\
        --repeat 5 --out benchmarks/results/loop_speed.json           # the measurement (~10 min)
    python benchmarks/loop_speed.py --num-requests 500 --repeat 1     # kvbench only, a smoke test

``$VIDUR_RUN`` is a Vidur 0.0.26 runner script (see side_by_side.py for what it reads and prints)
and ``$ARXIV_LENGTHS`` Vidur's arXiv-summarization length file (columns ``num_prefill_tokens``,
``num_decode_tokens``); without ``--arxiv-lengths`` the arXiv scenario is left out.

Three scenarios (side_by_side.py): ``vllm`` and ``orca`` (N x 512/128 at t = 0) and ``arxiv`` (N
arXiv requests replayed at 3/s). Each is measured ``--repeat`` times as a pair, kvbench then Vidur,
in turn, so that a change of machine load hits both; each run is a process of its own, measured
from start to exit with its own peak RSS (child_process.py). After each pair kvbench runs the scenario
twice more, without writing outputs and cut to one request, which splits its process time into
start-up, per-request work around the loop, the loop, and writing outputs. The report (speed_report.py)
holds the medians, the ratios and pass/fail against the goals (loop >= 30x, process >= 10x, kvbench
peak RSS <= 200 MB), as JSON (``--out``) and a Markdown table beside it (``.md``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from importlib.metadata import entry_points
from pathlib import Path

from report_files import check_report, write_report
from side_by_side import (
    Scenario,
    arxiv_scenario,
    compile_kvbench,
    fixed_scenarios,
    kvbench_startup,
    run_kvbench,
    run_vidur,
    same_requests,
)
from speed_report import markdown, summarize

from kvbench.errors import ConfigError

SCENARIOS = ("vllm", "orca", "arxiv")


def measure_scenario(scenario: Scenario, runner: str | None, repeat: int, work: Path) -> list[dict]:
    """``repeat`` pairs (kvbench, Vidur) for one scenario, each followed by kvbench's two splitting runs."""
    runs = []
    for i in range(repeat):
        run_dir = work / f"{scenario.name}-{i}"
        run = {"kvbench": run_kvbench(scenario, run_dir)}
        if runner:
            run["vidur"] = run_vidur(runner, scenario)
            run["same_requests"] = same_requests(run_dir / "requests.csv", run["vidur"].pop("requests_csv"))
        shutil.rmtree(run_dir, ignore_errors=True)  # a large run's tables, no longer needed
        run["kvbench_no_output"] = run_kvbench(scenario, work / f"{scenario.name}-{i}-quiet", write_outputs=False)
        run["kvbench_startup"] = kvbench_startup(scenario, work / f"{scenario.name}-{i}-one")
        print(json.dumps({"scenario": scenario.name, "repeat": i, **run}), file=sys.stderr, flush=True)
        runs.append(run)
    return runs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=10_000, help="requests per scenario (default 10,000)")
    parser.add_argument("--output-tokens", type=int, default=128, help="output tokens of vllm and orca (default 128)")
    parser.add_argument("--repeat", type=int, default=3, help="paired runs per scenario (default 3)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--vidur-run", help="a Vidur 0.0.26 runner script; without it only kvbench runs")
    parser.add_argument("--arxiv-lengths", type=Path, help="Vidur's arXiv-summarization length file (CSV)")
    parser.add_argument("--out", type=Path, help="write the report here as JSON, and as Markdown beside it (.md)")
    args = parser.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"--scenarios: unknown {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if "arxiv" in args.scenarios and args.arxiv_lengths is None:
        args.scenarios.remove("arxiv")
        print("loop_speed: no --arxiv-lengths, so the arxiv scenario is left out", file=sys.stderr)
    if "arxiv" in args.scenarios and not entry_points(group="kvbench", name="request_csv"):
        parser.error(
            "the arxiv scenario needs kvbench's request_csv workload, which is not installed: "
            "reinstall kvbench (pip install -e .)"
        )
    if args.arxiv_lengths is not None and not args.arxiv_lengths.is_file():
        parser.error(f"--arxiv-lengths {args.arxiv_lengths}: no such file; give Vidur's arXiv length CSV")
    if args.vidur_run and not Path(args.vidur_run).is_file():
        parser.error(f"--vidur-run {args.vidur_run}: no such file; give a Vidur runner script")
    if args.num_requests < 1 or args.repeat < 1 or args.output_tokens < 1:
        parser.error("--num-requests, --output-tokens and --repeat must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    hidden = {args.vidur_run: "$VIDUR_RUN", str(args.arxiv_lengths): "$ARXIV_LENGTHS"}
    command = " ".join(["python benchmarks/loop_speed.py", *(hidden.get(a, a) for a in argv)])
    report: dict = {"num_requests": args.num_requests, "repeat": args.repeat, "command": command, "scenarios": {}}
    if args.out:
        check_report("loop_speed", args.out.parent, [args.out.name, args.out.with_suffix(".md").name])
    compile_kvbench()  # kvbench's runs use its bytecode cache, as Vidur's use theirs
    with tempfile.TemporaryDirectory(prefix="kvbench-loop-speed-") as tmp:
        work = Path(tmp)
        scenarios = {s.name: s for s in fixed_scenarios(args.num_requests, args.output_tokens)}
        if "arxiv" in args.scenarios:
            scenarios["arxiv"] = arxiv_scenario(args.arxiv_lengths, args.num_requests, work)
        for name in args.scenarios:
            runs = measure_scenario(scenarios[name], args.vidur_run, args.repeat, work)
            report["scenarios"][name] = {"description": scenarios[name].description, "runs": runs, **summarize(runs)}
    report["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = markdown(report)
    print(text)
    if args.out:
        write_report(
            "loop_speed",
            args.out.parent,
            {args.out.name: json.dumps(report, indent=2) + "\n", args.out.with_suffix(".md").name: text},
        )
    return report


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, RuntimeError) as exc:  # a bad length file, a simulator that failed: no traceback
        sys.exit(f"loop_speed: error: {exc}")
