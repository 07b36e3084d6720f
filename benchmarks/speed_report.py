"""Paired runs to medians, ratios and pass/fail against the issue's goals; the Markdown a README shows."""

from __future__ import annotations

import statistics

#: the goals: kvbench's loop and whole process this many times faster than Vidur's, and its peak RSS
LOOP_SPEEDUP_GOAL = 30.0
PROCESS_SPEEDUP_GOAL = 10.0
PEAK_RSS_GOAL_MB = 200.0  # MB = 10^6 bytes
#: scale.py's goals besides those: the loop with every request at t = 0, 16x the output tokens, a
#: million requests, and a 1-request run against a minimal Hydra application
T0_LOOP_SPEEDUP_GOAL = 100.0
TOKENS_16X_LOOP_RATIO_GOAL = 2.0  # x16 output tokens / x1: below this
MILLION_PEAK_RSS_GOAL_MB = 1000.0
HYDRA_FLOOR_RATIO_GOAL = 1.5  # kvbench's 1-request run / a minimal Hydra application's: at most this
MB = 1e6
PART_NAMES = {
    "startup": "start-up",
    "per_request_besides_loop": "workload, summary, tables",
    "loop": "loop",
    "writing_outputs": "writing outputs",
    "rest": "workload, summary, tables, writing outputs",
}


def _median(runs: list[dict], side: str, key: str) -> float | None:
    values = [run[side][key] for run in runs if side in run and run[side].get(key) is not None]
    return statistics.median(values) if values else None


def _per_step_us(med: dict, side: str) -> float | None:
    steps = med[f"{side}_steps"]
    return None if not steps else med[f"{side}_loop_s"] / steps * 1e6


def _verdict(value: float | None, goal: float, at_least: bool) -> str:
    if value is None:
        return "not measured"
    return "pass" if (value >= goal if at_least else value <= goal) else "fail"


def summarize(runs: list[dict]) -> dict:
    """One scenario's paired runs, each {"kvbench", optionally "kvbench_startup" and "kvbench_no_output"
    (without them the process splits into start-up, loop and the rest, or the loop and the rest), and
    with Vidur "vidur", "same_requests"}. ``loop_s`` is each side's whole loop (side_by_side.py), and
    ``loop_speedup`` their ratio; ``engine_loop_speedup`` compares the parts without making requests
    and writing rows (kvbench's ``engine_loop_s``, Vidur's ``event_loop_s``). ``steps_per_event`` is
    kvbench's steps over its loop's events (its step table's rows), both exact counts."""
    keys = (
        "loop_s",
        "process_s",
        "peak_rss_bytes",
        "steps",
        "requests",
        "simulated_s",
        "tpot_p50_s",
        "preemptions",
        "engine_loop_s",  # kvbench: the loop less making requests and writing rows (sim_wall_s)
        "events",  # kvbench: the loop's events, rows of its step table
        "event_loop_s",  # Vidur: its event loop, without its request making
        "request_making_s",  # Vidur: making its requests, before its event loop
    )
    med = {f"{side}_{key}": _median(runs, side, key) for side in ("kvbench", "vidur") for key in keys}
    med["kvbench_no_output_process_s"] = _median(runs, "kvbench_no_output", "process_s")
    startup_s = _median(runs, "kvbench_startup", "process_s")
    ratio = lambda a, b: a / b if a is not None and b else None
    loop_speedup = ratio(med["vidur_loop_s"], med["kvbench_loop_s"])
    engine_loop_speedup = ratio(med["vidur_event_loop_s"], med["kvbench_engine_loop_s"])
    process_speedup = ratio(med["vidur_process_s"], med["kvbench_process_s"])
    peak_mb = med["kvbench_peak_rss_bytes"] / MB
    checks = [run.get("same_requests") for run in runs if "vidur" in run]
    if startup_s is None:  # no start-up run: the loop and the rest
        parts = {"loop": med["kvbench_loop_s"], "rest": med["kvbench_process_s"] - med["kvbench_loop_s"]}
    elif med["kvbench_no_output_process_s"] is None:
        parts = {
            "startup": startup_s,
            "loop": med["kvbench_loop_s"],
            "rest": med["kvbench_process_s"] - startup_s - med["kvbench_loop_s"],
        }
    else:
        parts = {
            "startup": startup_s,
            "per_request_besides_loop": med["kvbench_no_output_process_s"] - startup_s - med["kvbench_loop_s"],
            "loop": med["kvbench_loop_s"],
            "writing_outputs": med["kvbench_process_s"] - med["kvbench_no_output_process_s"],
        }
    return {
        "median": med,
        "loop_speedup": loop_speedup,
        "engine_loop_speedup": engine_loop_speedup,
        "steps_per_event": ratio(med["kvbench_steps"], med["kvbench_events"]),
        "process_speedup": process_speedup,
        "kvbench_peak_rss_mb": peak_mb,
        "kvbench_startup_peak_rss_mb": None
        if startup_s is None
        else _median(runs, "kvbench_startup", "peak_rss_bytes") / MB,
        "vidur_peak_rss_mb": None if med["vidur_peak_rss_bytes"] is None else med["vidur_peak_rss_bytes"] / MB,
        # where kvbench's process time goes; the second part is what is left, so noise lands there
        "kvbench_process_parts_s": parts,
        "kvbench_process_dominated_by": max(parts, key=parts.get),
        "same_steps": None if med["vidur_steps"] is None else med["kvbench_steps"] == med["vidur_steps"],
        "loop_us_per_step": {side: _per_step_us(med, side) for side in ("kvbench", "vidur")},
        "same_requests": None if not checks or None in checks else all(checks),
        "goals": {
            "loop": _verdict(loop_speedup, LOOP_SPEEDUP_GOAL, at_least=True),
            "process": _verdict(process_speedup, PROCESS_SPEEDUP_GOAL, at_least=True),
            "peak_memory": _verdict(peak_mb, PEAK_RSS_GOAL_MB, at_least=False),
        },
    }


def _pair(kvbench: float | None, vidur: float | None, fmt: str) -> str:
    return (
        f"{format(kvbench, fmt) if kvbench is not None else '-'} / {format(vidur, fmt) if vidur is not None else '-'}"
    )


def _speedup(value: float | None, verdict: str) -> str:
    return "-" if value is None else f"{value:.1f}x ({verdict})"


def process_parts_table(scenarios: dict, parts: list[tuple[str, str, str]]) -> list[str]:
    """The Markdown lines of a table of where each scenario's kvbench process time went: a column
    for each of ``parts`` (header, key of ``kvbench_process_parts_s``, format; "-" where that part
    was not measured), then the whole process and its largest part."""
    lines = [
        f"| scenario | {' | '.join(header for header, _, _ in parts)} | process | largest |",
        "|---|" + "---:|" * (len(parts) + 1) + "---|",
    ]
    for name, s in scenarios.items():
        p = s["kvbench_process_parts_s"]
        cells = ["-" if key not in p else format(p[key], fmt) for _, key, fmt in parts]
        lines.append(
            f"| {name} | {' | '.join(cells)} | {s['median']['kvbench_process_s']:.2f} "
            f"| {PART_NAMES[s['kvbench_process_dominated_by']]} |"
        )
    return lines


def markdown(report: dict) -> str:
    """The report as two tables ready to paste into the README, and what they measure."""
    lines = [
        f"# kvbench against Vidur 0.0.26: loop, whole process and peak memory ({report['num_requests']:,} requests)",
        "",
        (
            f"Measured {report['measured_at']} with `{report['command']}`: {report['repeat']} paired runs per "
            "scenario (kvbench, then Vidur, in turn), medians. Goals: loop >= "
            f"{LOOP_SPEEDUP_GOAL:g}x, process >= {PROCESS_SPEEDUP_GOAL:g}x, kvbench peak RSS <= {PEAK_RSS_GOAL_MB:g} MB."
        ),
        "",
        (
            "| scenario | steps kvbench / Vidur | loop s kvbench / Vidur | loop speed-up | process s kvbench / Vidur "
            "| process speed-up | peak RSS MB kvbench / Vidur | memory goal | loop µs per step kvbench / Vidur |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, s in report["scenarios"].items():
        m, g = s["median"], s["goals"]
        lines.append(
            f"| {name}: {s['description']} | {_pair(m['kvbench_steps'], m['vidur_steps'], ',.0f')} "
            f"| {_pair(m['kvbench_loop_s'], m['vidur_loop_s'], '.3f')} | {_speedup(s['loop_speedup'], g['loop'])} "
            f"| {_pair(m['kvbench_process_s'], m['vidur_process_s'], '.2f')} "
            f"| {_speedup(s['process_speedup'], g['process'])} "
            f"| {_pair(s['kvbench_peak_rss_mb'], s['vidur_peak_rss_mb'], '.0f')} | {g['peak_memory']} "
            f"| {_pair(s['loop_us_per_step']['kvbench'], s['loop_us_per_step']['vidur'], '.1f')} |"
        )
    lines += [
        "",
        (
            "Where kvbench's process time goes (medians, s). Start-up: the same run cut to one request and "
            "writing nothing; writing outputs: the run with outputs less the run without; the rest, less "
            "the loop, is building the workload, the summary and the tables:"
        ),
        "",
        *process_parts_table(
            report["scenarios"],
            [
                ("start-up", "startup", ".2f"),
                ("workload, summary, tables", "per_request_besides_loop", ".2f"),
                ("loop", "loop", ".3f"),
                ("writing outputs", "writing_outputs", ".2f"),
            ],
        ),
    ]
    startup_mb = max(s["kvbench_startup_peak_rss_mb"] for s in report["scenarios"].values())
    lines += [
        "",
        "What is measured:",
        "",
        (
            "- loop: each simulator's whole loop, from its first request made to the last row its loop writes "
            "(kvbench: `loop_wall_s` of its summary; Vidur: its request making, timed in its process, plus the "
            "harness's event loop, `simulate()` minus writing its outputs);"
        ),
        (
            "- process: start to exit of one simulator process writing its normal outputs. kvbench: the `kvbench` "
            "command writing summary, requests, steps and refusals as Parquet + CSV, config.json and its log (no "
            "figures, no W&B). Vidur: its Python process writing request_metrics.csv and its other metrics CSVs "
            "(no plots, no Chrome trace), as the harness times it (the harness's own set-up check and report "
            "are not counted);"
        ),
        (
            "- peak RSS: each process's own ru_maxrss, from its own wait4 (kvbench) or getrusage (Vidur's harness); "
            f"kvbench's start-up alone reaches {startup_mb:.0f} MB;"
        ),
        (
            "- checks: the steps column compares the steps both scheduled (kvbench's step count, Vidur's batches); "
            f"{_requests_check(report)}.{_steps_check(report)}"
        ),
        "",
    ]
    return "\n".join(lines)


def _requests_check(report: dict) -> str:
    checks = {name: s["same_requests"] for name, s in report["scenarios"].items()}
    if all(v is None for v in checks.values()):
        return "Vidur was not run, so the request lists were not compared"
    return "request lists identical (arrival, prompt and output tokens, request by request): " + ", ".join(
        f"{name} {'yes' if ok else 'NO' if ok is False else 'not compared'}" for name, ok in checks.items()
    )


def _steps_check(report: dict) -> str:
    """Where the step counts differ, the simulated times that explain it (a step count depends on
    timing once arrivals are spread out: shorter steps leave fewer requests running together)."""
    differ = [(name, s["median"]) for name, s in report["scenarios"].items() if s["same_steps"] is False]
    return "".join(
        f" {name}: the steps differ; the same requests took {m['kvbench_simulated_s']:.1f} / "
        f"{m['vidur_simulated_s']:.1f} simulated s, TPOT p50 {m['kvbench_tpot_p50_s'] * 1e3:.1f} / "
        f"{m['vidur_tpot_p50_s'] * 1e3:.1f} ms (kvbench / Vidur): the two cost models price a step differently, "
        "which changes how arrivals overlap (with every request at t = 0 the steps do not depend on step times)."
        for name, m in differ
    )
