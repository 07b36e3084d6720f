"""Both loops, identical tables, at scale: the event-driven loop against the step-by-step reference on
scale.py's scenarios (100,000-request arrival-heavy traces, preemption storms, 16x the tokens) and on
a sliding-window model.

    python benchmarks/loops_agree.py                          # every scenario, full size (about 6 min on 2 cores)
    python benchmarks/loops_agree.py --scenarios arxiv-poisson3-100k,azure-conv-1x-100k
    python benchmarks/loops_agree.py --quick                  # scale.py's small sizes (about 20 s)
    python benchmarks/loops_agree.py --scenarios arxiv-poisson3-100k-gemma3-12b,arxiv-t0-2k-gemma3-12b

The unit tests check that ``event_driven=true`` and ``event_driven=false`` write the same tables on
every allocator x scheduler x preemption, at tens of requests. This runs both loops on the scenarios
the speed goals are measured on, each as a ``kvbench`` process writing its normal tables (Parquet
and CSV, no figures), and on a sliding-window model (Gemma-3-12B on a 40 GB KV budget, whose window
groups free blocks while it decodes: hybrid_speed.py's window side) with scale.py's arXiv replay
and with 2,000 arXiv requests at t = 0, where it preempts and requests wait while windows free
memory; and compares what they wrote:

- ``requests``, ``steps`` and ``refusals``, as CSV and as Parquet: byte for byte;
- ``summary.json``: every key but the ones that are the run's own (its job and date, and those
  ``kvbench compare``'s default tolerances hold as machine noise or provenance: its wall times and
  rates, the version), value for value.

Where anything differs the scenario fails, with the files named, and the command exits with status 1;
it exits 2 where it cannot compare (a ``kvbench`` run that failed, an output folder it cannot write).
Each scenario's two loop times (the whole loop, ``loop_wall_s``: making requests and writing rows
included) are reported too: what running quiet decode steps as one computation buys there, on
identical work.

Writes ``<out>/loops_agree.json`` and ``<out>/loops_agree.md``.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from hybrid_speed import PAIRS, side_scenario
from report_files import check_report, write_report
from scale import RESULTS, SPECS, Spec
from side_by_side import ARXIV_LENGTHS, VLLM, Scenario, compile_kvbench, poisson_lengths_scenario, run_kvbench

from kvbench.compare.tolerance import default_rules, tolerance_for


def _on_gemma3(name: str, requests: Scenario, kv_budget_bytes: float | None = None) -> Scenario:
    """A request list replayed on Gemma-3-12B (five window groups of 1,024 tokens per full group),
    on hybrid_speed.py's 40 GB KV budget or ``kv_budget_bytes``."""
    window = side_scenario(requests, PAIRS["gemma3-12b"], "window", kv_budget_bytes)
    budget = f", {kv_budget_bytes / 1e9:g} GB of KV" if kv_budget_bytes else ""
    return Scenario(name, f"{requests.description}, {window.description}{budget}", window.kvbench_overrides)


def _arxiv_at_once(name: str, n: int) -> Scenario:
    what = f"{n:,} requests of the arXiv length file at t = 0, paged prefill-first"
    return Scenario(name, what, [*VLLM, "workload=arxiv", "workload.arrival=all_at_once", f"workload.num_requests={n}"])


#: the memory-bound start's KV budget: about 15 of its sequences at once, so it preempts
T0_KV_BUDGET_BYTES = 8e9
#: the sliding-window model's scenarios: the arXiv replay, and a memory-bound start at t = 0
HYBRID_SPECS = (
    Spec(
        "arxiv-poisson3-100k-gemma3-12b",
        lambda n, work: _on_gemma3(
            "arxiv-poisson3-100k-gemma3-12b", poisson_lengths_scenario("arxiv-gemma3", ARXIV_LENGTHS, n, work)
        ),
        100_000,
        2_000,
    ),
    Spec(
        "arxiv-t0-2k-gemma3-12b",
        lambda n, work: _on_gemma3("arxiv-t0-2k-gemma3-12b", _arxiv_at_once("", n), T0_KV_BUDGET_BYTES),
        2_000,
        300,
    ),
)
ALL_SPECS = (*SPECS, *HYBRID_SPECS)
NAMES = tuple(s.name for s in ALL_SPECS)
#: the tables both loops must write alike, byte for byte
TABLE_FILES = tuple(f"{table}.{kind}" for table in ("requests", "steps", "refusals") for kind in ("csv", "parquet"))
#: the run's labels: its job (which names its own overrides, the loop among them) and its date
RUN_LABELS = frozenset({"job", "date"})
#: how ``kvbench compare`` holds a metric that measures the machine, not the simulation (its default
#: tolerances: wall-clock times and rates are ratios, provenance is ignored)
MACHINE_KINDS = ("ratio", "ignore")


def run_own(key: str, rules: list | None = None) -> bool:
    """Whether a summary key belongs to the run rather than to what it simulated: a label, or a
    metric ``kvbench compare``'s default tolerances treat as machine noise or provenance."""
    return key in RUN_LABELS or tolerance_for(key, rules or default_rules()).kind in MACHINE_KINDS


def _summary(run_dir: Path) -> dict:
    """``summary.json`` without the run's own keys, NaN as None (so that equal summaries compare equal)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rules = default_rules()
    return {
        key: None if isinstance(value, float) and math.isnan(value) else value
        for key, value in summary.items()
        if not run_own(key, rules)
    }


def differences(event_dir: Path, step_dir: Path) -> list[str]:
    """What the two runs wrote differently: a table file's name, or ``summary.json: <key>``."""
    found = []
    for name in TABLE_FILES:
        here, there = event_dir / name, step_dir / name
        if not (here.is_file() and there.is_file()):
            found.append(f"{name} (missing)")
        elif not filecmp.cmp(here, there, shallow=False):
            found.append(name)
    a, b = _summary(event_dir), _summary(step_dir)
    found += [f"summary.json: {key}" for key in sorted(set(a) | set(b)) if a.get(key, ...) != b.get(key, ...)]
    return found


def check_scenario(scenario, work: Path) -> dict:
    """Both loops on one scenario: their loop times and what they wrote differently."""
    name = scenario.name
    runs = {}
    for loop, flag in (("event_driven", "true"), ("step_by_step", "false")):
        started_s = time.perf_counter()
        print(f"{name}: {loop.replace('_', ' ')} ...", file=sys.stderr, flush=True)
        runs[loop] = run_kvbench(scenario, work / f"{name}-{loop}", extra=(f"event_driven={flag}",))
        print(f"{name}: {loop.replace('_', ' ')} done in {time.perf_counter() - started_s:.1f} s", file=sys.stderr)
    event, step = runs["event_driven"], runs["step_by_step"]
    found = differences(work / f"{name}-event_driven", work / f"{name}-step_by_step")
    # the step table's rows: a step, or a run of quiet steps (each an event of the event-driven loop)
    rows = pq.read_metadata(work / f"{name}-event_driven" / "steps.parquet").num_rows
    for loop in runs:
        shutil.rmtree(work / f"{name}-{loop}", ignore_errors=True)
    return {
        "description": scenario.description,
        "requests": event["requests"],
        "steps": event["steps"],
        "rows": rows,
        "preemptions": event["preemptions"],
        "event_driven_loop_s": event["loop_s"],
        "step_by_step_loop_s": step["loop_s"],
        "speedup": step["loop_s"] / event["loop_s"] if event["loop_s"] > 0 else None,
        "differences": found,
        "identical": not found,
    }


def markdown(report: dict) -> str:
    lines = [
        "# Both loops, identical tables, at scale",
        "",
        f"Measured {report['measured_at']} with `{report['command']}` on {report['machine']}: each scenario run "
        "twice as a `kvbench` process (`event_driven=true`, then `event_driven=false`: every step one by one), "
        "both writing their tables (Parquet and CSV); `requests`, `steps` and `refusals` compared byte for byte "
        "in both formats, `summary.json` key by key less the run's own (its job and date, and what `kvbench "
        "compare`'s default tolerances hold as machine noise or provenance: wall-clock times and rates, the "
        "version).",
        "",
        "A row of the step table is a step, or a run of quiet decode steps (the event-driven loop advances "
        "it in one turn, the step-by-step loop one step at a time; the recorder merges both alike).",
        "",
        "| scenario | requests | steps | step-table rows | preemptions | event-driven loop s | step-by-step loop s "
        "| ratio | µs per row, event-driven | µs per step, step by step | tables |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in report["scenarios"].items():
        verdict = "identical" if row["identical"] else "**differ**: " + ", ".join(row["differences"])
        ratio = f"{row['speedup']:.1f}x" if row["speedup"] else "n/a"
        lines.append(
            f"| {name}: {row['description']} | {row['requests']:,} | {row['steps']:,} | {row['rows']:,} | "
            f"{row['preemptions']:,} | {row['event_driven_loop_s']:.3f} | {row['step_by_step_loop_s']:.3f} | {ratio} | "
            f"{row['event_driven_loop_s'] / row['rows'] * 1e6:.1f} | {row['step_by_step_loop_s'] / row['steps'] * 1e6:.1f} "
            f"| {verdict} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/loops_agree.py", description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(NAMES), help=f"comma-separated, of {', '.join(NAMES)}")
    parser.add_argument("--quick", action="store_true", help="scale.py's small sizes: a smoke test")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for loops_agree.{json,md}")
    args = parser.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(args.scenarios) - set(NAMES))
    if unknown or not args.scenarios:
        parser.error(f"--scenarios: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(NAMES)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    report: dict = {
        "command": " ".join(["python benchmarks/loops_agree.py", *argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "quick": args.quick,
        "scenarios": {},
    }
    check_report("loops_agree", args.out, ["loops_agree.json", "loops_agree.md"])
    compile_kvbench()
    with tempfile.TemporaryDirectory(prefix="kvbench-loops-agree-") as tmp:
        work = Path(tmp)
        for spec in (s for s in ALL_SPECS if s.name in args.scenarios):
            scenario = spec.build(spec.quick if args.quick else spec.full, work)
            report["scenarios"][spec.name] = check_scenario(scenario, work)
    report["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report["identical"] = all(row["identical"] for row in report["scenarios"].values())
    text = markdown(report)
    print(text)
    write_report(
        "loops_agree", args.out, {"loops_agree.json": json.dumps(report, indent=1) + "\n", "loops_agree.md": text}
    )
    return report


if __name__ == "__main__":
    from kvbench.commands.signals import exit_interrupted, handle_sigterm

    handle_sigterm()  # SIGTERM unwinds like Ctrl-C: the running kvbench is stopped, nothing is written
    try:
        done = main()
    except (RuntimeError, OSError) as exc:  # a kvbench run that failed, an unwritable --out: no traceback
        print(f"loops_agree: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as exc:
        exit_interrupted(exc, "loops_agree", "no report was written")
    sys.exit(0 if done["identical"] else 1)
