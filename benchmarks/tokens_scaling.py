"""What 16x the output tokens costs the simulator's loop, regime by regime: with nothing preempted,
and under preemption.

    python benchmarks/tokens_scaling.py                      # 2,000 requests, 5 pairs per regime
    python benchmarks/tokens_scaling.py --requests 500 --pairs 5

The speed goal says 16x the output tokens should cost less than 2x the loop time in every regime.
Each regime is one of scale.py's configurations (Orca's reserve-to-max, or vLLM v0 on Vidur's
7,424 blocks of 16 tokens, on 4x that, or on the storm's 1,000) running the lecture's requests
(``--requests`` of them, all at t = 0, 512 prompt tokens; the storm's 128) twice per pair: with
128 output tokens and with 2,048, everything else identical, in turn (1x first in even pairs, 16x
first in odd ones). Reported per regime, medians over the pairs: the loop's time (``sim_wall_s``),
its steps, its events (step-table rows: a step, or a run of quiet decode steps advanced at once),
the preemptions, and the loop's time per event. The cost ratio is the median over the pairs of
16x / 1x: it compares two workloads on purpose (it is the goal's definition), not two versions of
kvbench. Where the ratio is far above 2x, the events column says whether the loop grew because
each event cost more or because the simulated run has more events (each preemption ends a run of
quiet steps, and 16x the tokens preempts many more times).

Writes ``<out>/tokens_scaling.json``, ``<out>/tokens_scaling.md`` and ``<out>/tokens_scaling.png``.
Exit status: 0 measured, 2 bad arguments, a config kvbench refuses, a config whose runs differ from
pair to pair or an --out that cannot be written, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from main_exits import one_line_failures
from report_files import check_report, report_header, write_report
from scale import STORM_BLOCKS
from side_by_side import KV_BLOCKS, ORCA, vllm_overrides

from kvbench.api import run
from kvbench.errors import ConfigError

#: the lecture's requests, at 1x and 16x their output tokens (below); only the loop is timed
WORKLOAD = ["workload=lecture_chat", "output.write=false"]
#: output tokens at 1x and at 16x (the lecture's 128)
OUTPUT_TOKENS = (128, 2048)
#: regime name -> its overrides: scale.py's scenarios (512-128-t0-10k-orca, 512-128-t0-2k and
#: 512-2048-t0-2k, the storms) and 512-128-t0-2k's with 4x the blocks
REGIMES = {
    "reserve-to-max (Orca: naive, S_max 4,096)": ORCA,
    "paged 16, vLLM v0, 4x Vidur's 7,424 blocks: nothing preempted": [
        *vllm_overrides(4 * KV_BLOCKS),
        "hardware.hbm_bytes=300000000000",  # room for that budget beside the weights
    ],
    "paged 16, vLLM v0, Vidur's 7,424 blocks: 16x preempts": vllm_overrides(),
    # 128 running requests of 256 tokens each need 32,768 slots of 16,000
    f"paged 16, vLLM v0, 128-token prompts on {STORM_BLOCKS:,} blocks: a storm at 1x already": [
        *vllm_overrides(STORM_BLOCKS),
        "workload.prompt_tokens=128",
    ],
}
GOAL_RATIO = 2.0


class NotRepeatable(RuntimeError):
    """One config simulated different runs from pair to pair: no ratio of its loop times means anything."""


def measure(overrides: list[str]) -> dict:
    result = run(overrides)
    s = result.summary
    return {
        "loop_s": float(s["sim_wall_s"]),
        "steps": int(s["num_steps"]),
        "events": result.num_step_rows(),
        "preemptions": int(s["num_preemptions"]),
    }


def measure_regime(overrides: list[str], num_requests: int, pairs: int) -> dict:
    """Both token counts, ``pairs`` times each, alternating which runs first."""
    runs: dict[int, list[dict]] = {n: [] for n in OUTPUT_TOKENS}
    for pair in range(pairs):
        for output_tokens in OUTPUT_TOKENS if pair % 2 == 0 else OUTPUT_TOKENS[::-1]:
            config = [
                *overrides,
                *WORKLOAD,
                f"workload.num_requests={num_requests}",
                f"workload.output_tokens={output_tokens}",
            ]
            runs[output_tokens].append(measure(config))
    sides = {}
    for output_tokens, measured in runs.items():
        first = measured[0]  # the simulated run is the same every time: steps, events, preemptions
        if any(
            (m["steps"], m["events"], m["preemptions"]) != (first["steps"], first["events"], first["preemptions"])
            for m in measured
        ):
            raise NotRepeatable(
                f"{output_tokens} output tokens: the same config simulated different runs (steps, events, "
                f"preemptions: {sorted({(m['steps'], m['events'], m['preemptions']) for m in measured})}); "
                "a loop ratio needs the same work in every pair"
            )
        loop_s = statistics.median(m["loop_s"] for m in measured)
        sides[str(output_tokens)] = {**first, "loop_s": loop_s, "us_per_event": loop_s / first["events"] * 1e6}
    one, sixteen = (runs[n] for n in OUTPUT_TOKENS)
    return {
        "sides": sides,
        "loop_ratio": statistics.median(b["loop_s"] / a["loop_s"] for a, b in zip(one, sixteen)),
        "event_ratio": sixteen[0]["events"] / one[0]["events"],
    }


def markdown(report: dict) -> str:
    one, sixteen = (str(n) for n in OUTPUT_TOKENS)
    lines = [
        "# What 16x the output tokens costs the loop",
        "",
        f"Measured {report['measured_utc']} with `{report['command']}` on {report['machine']}: "
        f"{report['requests']:,} lecture requests at t = 0 (512 prompt tokens; the storm's 128), "
        f"{OUTPUT_TOKENS[0]:,} and {OUTPUT_TOKENS[1]:,} output tokens, "
        f"{report['pairs']} pairs per regime (the two token counts in turn); medians. Goal: 16x the tokens "
        f"cost < {GOAL_RATIO:g}x the loop time.",
        "",
        "| regime | loop ms 1x / 16x | cost ratio | steps 1x / 16x | events 1x / 16x | event ratio "
        "| preemptions 1x / 16x | µs per event 1x / 16x | goal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, regime in report["regimes"].items():
        a, b = regime["sides"][one], regime["sides"][sixteen]
        verdict = "pass" if regime["loop_ratio"] < GOAL_RATIO else "**fail**"
        lines.append(
            f"| {name} | {a['loop_s'] * 1e3:,.1f} / {b['loop_s'] * 1e3:,.1f} | {regime['loop_ratio']:.2f}x "
            f"| {a['steps']:,} / {b['steps']:,} | {a['events']:,} / {b['events']:,} | {regime['event_ratio']:.1f}x "
            f"| {a['preemptions']:,} / {b['preemptions']:,} | {a['us_per_event']:.1f} / {b['us_per_event']:.1f} "
            f"| {verdict} |"
        )
    lines += ["", "![loop time and events, 16x over 1x](tokens_scaling.png)"]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """The figure, as PNG, at ``path`` (a temporary name that the report's writer renames into place)."""
    from kvbench.output.figures import agg_figure

    names = list(report["regimes"])
    loop = [report["regimes"][n]["loop_ratio"] for n in names]
    events = [report["regimes"][n]["event_ratio"] for n in names]
    fig = agg_figure(figsize=(9, 4), layout="constrained")
    ax = fig.subplots()
    at = range(len(names))
    ax.bar([i - 0.2 for i in at], loop, width=0.4, label="loop time, 16x / 1x", color="#2b8cbe")
    ax.bar([i + 0.2 for i in at], events, width=0.4, label="events, 16x / 1x", color="#a6bddb")
    ax.axhline(GOAL_RATIO, color="#d7301f", linestyle="--", linewidth=1, label=f"goal: < {GOAL_RATIO:g}x")
    ax.set_yscale("log")
    ax.set_xticks(list(at), [n.replace(": ", ":\n").replace(", 128", ",\n128") for n in names], fontsize=8)
    ax.set_ylabel("16x tokens over 1x (log)")
    ax.set_title("16x the output tokens: what grows, the events or the cost of each")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, format="png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per run (default 2,000)")
    parser.add_argument("--pairs", type=int, default=5, help="pairs per regime (default 5)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.pairs < 1:
        print("error: --requests and --pairs must be at least 1", file=sys.stderr)
        return 2
    check_report("tokens_scaling", args.out, ["tokens_scaling.json", "tokens_scaling.md", "tokens_scaling.png"])
    regimes = {}
    with one_line_failures(
        "tokens scaling", ConfigError, NotRepeatable, error_prefix="error", interrupted="interrupted, nothing written"
    ) as ending:
        for name, overrides in REGIMES.items():
            print(f"{name}...", file=sys.stderr, flush=True)
            regimes[name] = measure_regime(overrides, args.requests, args.pairs)
            print(f"  16x / 1x: loop {regimes[name]['loop_ratio']:.2f}x", file=sys.stderr, flush=True)
    if ending.exit_status is not None:
        return ending.exit_status
    report = {
        **report_header("tokens_scaling.py", argv),
        "requests": args.requests,
        "pairs": args.pairs,
        "regimes": regimes,
    }
    write_report(
        "tokens_scaling",
        args.out,
        {"tokens_scaling.json": json.dumps(report, indent=2) + "\n", "tokens_scaling.md": markdown(report)},
        {"tokens_scaling.png": lambda tmp: plot(report, tmp)},
    )
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
