"""What one turn of the simulator's loop costs as the running batch grows, counted in machine
instructions: how much of an event is a pass over the batch, and how much a constant.

    python benchmarks/event_cost.py                      # batch caps 4, 16, 64, 128; about 10 minutes
    python benchmarks/event_cost.py --batch 8 --batch 128 --requests 500

A *turn* is one pass of the engine's loop: the scheduler decides a step, the executor prices it (or
a run of quiet decode steps, advanced at once), the scheduler applies it and the recorder writes it
down. The aim is a turn that costs O(1) in the batch (docs/engine.md). To see how far the loop is
from that, each batch cap B runs the same requests (the packaged arXiv-summarization lengths, all
at t = 0, vLLM v0's prefill-first scheduling, paged blocks of 16, a KV budget no batch fills, so
nothing is preempted) with ``scheduler.max_num_seqs=B``: each finish admits the next request, so
about B sequences run at every turn and the turns' kinds stay the same (an admission's prefill, a
run of decodes that ends at a finish). The loop's instructions are counted under valgrind as
``loop_instructions.py`` counts them (the run through the loop minus the run up to it, in one
thread, a fixed hash seed); a plain run of the same config counts the turns, the sequences each
turn decodes (the x axis) and, with a trace of line events, the lines of kvbench's code each
function executes per turn.

The result is a line fitted to instructions per turn against decoding sequences per turn: its
intercept is the constant part of a turn, its slope what each running sequence adds, and the
functions whose lines per turn grow most between the smallest and the largest cap are those that
pass over the batch. Written to ``benchmarks/results/event_cost.{json,md,png}``.

Exit status: 0 counted, 2 cannot count (no valgrind, bad arguments, a run that fails).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from loop_instructions import COUNTED_ENV, PRELUDE, NotComparable, count_with
from main_exits import one_line_failures, valgrind_missing
from speed_gate import BASE

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: the batch caps counted by default: from a handful of sequences (the arrival-heavy traces run
#: about 10) to vLLM's default cap (128); each cap needs many more requests than sequences, or the
#: batch drains at the end for much of the run
BATCHES = (4, 16, 64, 128)
#: requests per cap: enough turns (about 2 per request) that a turn's constant is well sampled
REQUESTS = 2000
#: 1 TB of simulated KV cache on a GPU given the memory to hold it (capacity only: the cost model
#: prices by bandwidth and compute): 256 arXiv-length sequences (about 1.5 GB each on llama2-7b)
#: fit, so no cap preempts and every cap's turns are of the same kinds
KV_BUDGET_BYTES = 10**12
HBM_BYTES = 2 * 10**12
#: the functions listed as growing with the batch
TOP_GROWERS = 8

#: a plain run of a config: its turns, the sequences each turn decodes, and the lines of kvbench's
#: code each function executes (a trace of line events, exact where a profiler's times are not; a
#: comprehension is a function of its own, named by its qualified name)
TURNS_CHILD = (
    PRELUDE
    + """
from collections import Counter
decodes = []
advance = engine._advance
def counted(plan, next_arrival_s):
    decodes.append(len(plan.decodes))
    return advance(plan, next_arrival_s)
engine._advance = counted
lines = Counter()
def on_line(frame, event, arg):
    if event == "line":
        lines[frame.f_code] += 1
    return on_line
def on_call(frame, event, arg):  # kvbench's modules and its plugins' (kvbench_plugins), wherever installed
    return on_line if frame.f_globals.get("__name__", "").startswith("kvbench") else None
sys.settrace(on_call)
record = engine.run(requests)
sys.settrace(None)
by_name = Counter()
for code, n in lines.items():
    by_name[code.co_filename.rsplit("/", 1)[-1] + ":" + code.co_qualname] += n
print(json.dumps({"turns": len(decodes), "decodes": sum(decodes), "steps": int(record.steps["num_steps"].sum()),
                  "requests": len(record.requests), "lines": by_name}))
"""
)


class CannotCount(RuntimeError):
    """One line saying why the count cannot be made."""


def overrides(batch: int, num_requests: int) -> list[str]:
    return [
        *[o for o in BASE if not o.startswith("hardware.kv_budget_bytes=")],
        f"hardware.kv_budget_bytes={KV_BUDGET_BYTES}",
        f"hardware.hbm_bytes={HBM_BYTES}",
        "workload=arxiv",
        f"workload.num_requests={num_requests}",
        "workload.arrival=all_at_once",
        "scheduler=prefill_first",
        "allocator=paged",
        "scheduler.max_num_batched_tokens=4096",
        f"scheduler.max_num_seqs={batch}",
        "preemption=recompute",
    ]


def _env() -> dict[str, str]:
    return {**os.environ, **COUNTED_ENV}


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("==")]
        raise CannotCount(f"{what} failed: {lines[-1] if lines else done.returncode}")
    return done


def instructions(mode: str, config: list[str]) -> tuple[int, object]:
    """(instructions, the run's printed work) of one run of the installed kvbench under valgrind."""
    try:
        return count_with(_env(), ROOT, mode, config, f"the {mode} run")
    except NotComparable as exc:
        raise CannotCount(str(exc)) from None


def plain_run(config: list[str]) -> dict:
    """A plain run's turns, decodes per turn summed, steps, requests and lines per function."""
    return json.loads(_run([sys.executable, "-c", TURNS_CHILD, json.dumps(config)], "the plain run").stdout)


def measure(batch: int, num_requests: int) -> dict:
    config = overrides(batch, num_requests)
    # first the plain run: it also compiles every module the loop imports, so that no compilation
    # is counted under valgrind
    plain = plain_run(config)
    through, work = instructions("loop", config)
    before, _ = instructions("setup", config)
    if work != [plain["steps"], work[1], plain["requests"]]:
        raise CannotCount(f"batch {batch}: the counted run simulated other work than the plain one")
    return {
        "batch_cap": batch,
        "requests": plain["requests"],
        "turns": plain["turns"],
        "steps": plain["steps"],
        "decodes_per_turn": plain["decodes"] / plain["turns"],
        "loop_instructions": through - before,
        "instructions_per_turn": (through - before) / plain["turns"],
        "lines_per_turn": {name: n / plain["turns"] for name, n in plain["lines"].items()},
    }


def fit(rows: list[dict]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of instructions per turn against decodes per turn."""
    xs = [r["decodes_per_turn"] for r in rows]
    ys = [r["instructions_per_turn"] for r in rows]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx
    return mean_y - slope * mean_x, slope


def growers(rows: list[dict], top: int = TOP_GROWERS) -> list[tuple[str, float, float]]:
    """The functions whose lines executed per turn grow most from the smallest cap to the largest."""
    small, large = rows[0]["lines_per_turn"], rows[-1]["lines_per_turn"]
    grown = [(name, small.get(name, 0.0), n) for name, n in large.items()]
    grown.sort(key=lambda g: g[2] - g[1], reverse=True)
    return [g for g in grown[:top] if g[2] > g[1]]


def markdown(rows: list[dict], command: str) -> str:
    intercept, slope = fit(rows)
    at_10 = 10 * slope / (intercept + 10 * slope)
    lines = [
        "# What a turn of the loop costs as the batch grows",
        "",
        f"`{command}` ({os.uname().machine}, Python {sys.version.split()[0]}; instructions counted by "
        "valgrind's cachegrind, one thread, `PYTHONHASHSEED=0`). The same arXiv-length requests at t = 0, "
        "prefill-first, paged blocks of 16, nothing preempted; only the batch cap differs.",
        "",
        "| batch cap | decoding seqs per turn | turns | steps | loop instructions | instructions per turn |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['batch_cap']} | {r['decodes_per_turn']:.1f} | {r['turns']:,} | {r['steps']:,} | "
        f"{r['loop_instructions']:,} | {r['instructions_per_turn']:,.0f} |"
        for r in rows
    ]
    lines += [
        "",
        f"Fitted: a turn costs **{intercept:,.0f} instructions plus {slope:,.0f} per decoding sequence**. "
        f"At 10 sequences (what the arrival-heavy traces run) the per-sequence part is {at_10:.0%} of a turn.",
        "",
        f"The functions whose lines executed per turn grow most from batch cap {rows[0]['batch_cap']} to "
        f"{rows[-1]['batch_cap']} (a trace of line events: exact counts; a comprehension is a function of its own):",
        "",
        f"| function | lines per turn at {rows[0]['batch_cap']} | at {rows[-1]['batch_cap']} |",
        "|---|---:|---:|",
    ]
    lines += [f"| `{name}` | {small:.1f} | {large:.1f} |" for name, small, large in growers(rows)]
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    intercept, slope = fit(rows)
    xs = [r["decodes_per_turn"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    ax.plot(xs, [r["instructions_per_turn"] for r in rows], "o", label="counted")
    ends = [0.0, max(xs)]
    ax.plot(ends, [intercept + slope * x for x in ends], "-", label=f"{intercept:,.0f} + {slope:,.0f} per sequence")
    ax.set_xlabel("decoding sequences per turn")
    ax.set_ylabel("loop instructions per turn")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    ax.set_title("A loop turn's cost against the running batch")
    ax.legend()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/event_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", action="append", type=int, help="a batch cap (repeatable; default 4 16 64 128)")
    parser.add_argument("--requests", type=int, default=REQUESTS, help=f"requests per cap (default {REQUESTS})")
    args = parser.parse_args(argv)
    batches = sorted(set(args.batch or BATCHES))
    if len(batches) < 2 or batches[0] < 1:
        parser.error(f"give at least two batch caps >= 1, got {batches}")
    if args.requests < 1:
        parser.error(f"--requests must be >= 1, got {args.requests}")
    if valgrind_missing("event cost"):
        return 2
    rows = []
    with one_line_failures("event cost", CannotCount) as ending:
        for batch in batches:
            rows.append(measure(batch, args.requests))
            r = rows[-1]
            print(
                f"  batch cap {batch}: {r['decodes_per_turn']:.1f} seqs per turn, "
                f"{r['instructions_per_turn']:,.0f} instructions per turn",
                file=sys.stderr,
                flush=True,
            )
    if ending.exit_status is not None:
        return ending.exit_status
    if len({r["decodes_per_turn"] for r in rows}) < 2:
        print(
            "event cost: error: every cap ran the same batch (too few requests to fill the larger caps?): "
            "nothing to fit; raise --requests",
            file=sys.stderr,
        )
        return 2
    command = " ".join(["python benchmarks/event_cost.py", *argv])
    text = markdown(rows, command)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "event_cost.json").write_text(json.dumps(rows, indent=1) + "\n")
    (RESULTS / "event_cost.md").write_text(text)
    figure(rows, RESULTS / "event_cost.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
