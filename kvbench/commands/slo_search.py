"""``kvbench slo-search``: the largest arrival rate (or batch cap) whose simulated runs meet every
SLO, by bisection over whole runs (:mod:`kvbench.slo.search`)."""

from __future__ import annotations

import math

import pandas as pd

from kvbench.app.progress import progress_bar
from kvbench.commands.arguments import renamed_slo_flag
from kvbench.commands.common import Parser, compose_checked, resolve_out_dir, run_cli
from kvbench.errors import ConfigError, require
from kvbench.output.figures import pyplot
from kvbench.output.report import wide_console
from kvbench.output.run_report import compact_table
from kvbench.slo.common import folder_files, write_folder
from kvbench.slo.search import (
    KNOBS,
    MAX_NUM_SEQS,
    MAX_RATE_SPAN,
    MAX_RUNS,
    MIN_REL_TOL,
    PROBE_COLUMNS,
    bisect,
    expected_runs,
    figure,
    is_monotone,
    slo_text,
    value_text,
)


def _main(argv: list[str]) -> int:
    renamed = renamed_slo_flag(argv)  # SLOs are slo.* keys here as in every command, never --flags
    if renamed:
        raise ConfigError(renamed)
    parser = Parser(
        "kvbench slo-search",
        "The largest arrival rate or batch cap whose simulated runs meet "
        "every SLO (slo.ttft_s, slo.tpot_s, slo.e2e_s overrides) for a fraction of requests, by bisection. "
        "Exit status 1 when --low..--high does not bracket the largest such value (the line says what "
        "was found instead), 2 on bad input.",
    )
    parser.add_argument(
        "--over",
        required=True,
        choices=sorted(KNOBS),
        help="rate: workload.rate_per_s (Poisson arrivals); max_num_seqs: scheduler.max_num_seqs",
    )
    parser.add_argument("--low", type=float, default=None, help="lower end (default 0.1 req/s or 1 seq)")
    parser.add_argument("--high", type=float, default=None, help="upper end (default 64 req/s or 1024 seqs)")
    parser.add_argument(
        "--attainment", type=float, default=0.9, help="fraction of requests that must meet every SLO (default 0.9)"
    )
    parser.add_argument(
        "--rel-tol", type=float, default=0.05, help="rate: stop when high/low <= 1 + rel_tol (default 0.05)"
    )
    parser.add_argument("--max-runs", type=int, default=20, help="most simulated runs (default 20)")
    parser.add_argument("--out", default=None, help="output folder (default results/slo/<date>/search-<time>/)")
    args, overrides = parser.parse(argv)
    out_dir = resolve_out_dir(args.out, "search", folder_files(["curve"], ["curve.png", "search.json"]))
    knob = KNOBS[args.over]
    low = knob.default_low if args.low is None else args.low
    high = knob.default_high if args.high is None else args.high
    require(math.isfinite(low) and low > 0, "--low", low, "use a positive number")
    require(math.isfinite(high) and high > low, "--high", high, f"use a finite number above --low={low:g}")
    if knob.integer:
        require(high <= MAX_NUM_SEQS, "--high", high, f"use at most {MAX_NUM_SEQS:,} sequences")
    if knob.integer:
        require(low == int(low), "--low", low, "scheduler.max_num_seqs is an integer: use a whole number")
        require(high == int(high), "--high", high, "scheduler.max_num_seqs is an integer: use a whole number")
        low, high = int(low), int(high)
    require(0 < args.attainment <= 1, "--attainment", args.attainment, "use a fraction in (0, 1]")
    require(
        math.isfinite(args.rel_tol) and MIN_REL_TOL <= args.rel_tol <= 1,
        "--rel-tol",
        args.rel_tol,
        f"use a fraction from {MIN_REL_TOL:g} to 1, e.g. 0.05 (below {MIN_REL_TOL:g} the bracket's ends are "
        "closer than the rate's own digits)",
    )
    require(
        2 <= args.max_runs <= MAX_RUNS,
        "--max-runs",
        args.max_runs,
        f"use an integer from 2 to {MAX_RUNS} (both ends are probed first; each probe is a whole run)",
    )
    if not knob.integer:
        require(
            high / low <= MAX_RATE_SPAN, "--high", high, f"use a range of at most {MAX_RATE_SPAN:.0e} x --low={low:g}"
        )
    for override in overrides:
        if override.split("=")[0].lstrip("+") == knob.key:
            raise ConfigError(f"{override} sets what --over {args.over} searches: drop it and give --low/--high")

    from kvbench.api import run
    from kvbench.app.run import setup

    # the whole config once, before any run: a bad override or value fails here, in one line
    cfg, _ = compose_checked([*overrides, f"{knob.key}={low}"])
    if args.over == "rate" and cfg.workload.get("arrival") != "poisson":
        raise ConfigError(
            f"--over rate sets workload.rate_per_s, which needs Poisson arrivals, but "
            f"workload.arrival={cfg.workload.get('arrival')}: add workload.arrival=poisson "
            "or pick a Poisson workload such as workload=sharegpt_like"
        )
    s = setup(cfg)
    slo = {key: value for key, value in vars(s.slo).items() if value is not None}
    if not slo:
        raise ConfigError(
            "no SLO given: add at least one of slo.ttft_s=<s> slo.tpot_s=<s> slo.e2e_s=<s>, "
            "e.g. slo.ttft_s=2 slo.tpot_s=0.05"
        )

    digits = 3 + max(0, math.ceil(-math.log10(args.rel_tol)) - 2)  # enough to tell the bracket's ends apart
    rows: list[dict] = []
    out = wide_console()
    estimate = min(args.max_runs, expected_runs(low, high, knob.integer, args.rel_tol))
    # the probes' bar on a terminal, a line every 10 s in a log (stderr); each probe's line on stdout
    with progress_bar(estimate, "slo-search", enabled=bool(cfg.progress), unit="probes") as advance:

        def passes(value: float) -> bool:
            text = value_text(value, knob, digits)
            advance(0, note=f"probe {len(rows) + 1}: {args.over}={text}")
            value_arg = int(value) if knob.integer else repr(float(value))
            result = run([*overrides, f"{knob.key}={value_arg}", "progress=false"])
            row = {"probe": len(rows) + 1, "value": value, **{k: result.summary[k] for k in PROBE_COLUMNS}}
            # NaN attainment (nothing finished) fails: the comparison is False
            row["passed"] = bool(row["slo_attainment"] >= args.attainment)
            rows.append(row)
            out.print(
                f"probe {row['probe']}: {args.over}={text} {knob.unit}: attainment {row['slo_attainment']:.1%} "
                f"-> {'pass' if row['passed'] else 'fail'}",
                highlight=False,
            )
            advance(1)
            return row["passed"]

        search = bisect(passes, low, high, integer=knob.integer, rel_tol=args.rel_tol, max_runs=args.max_runs)

    curve = pd.DataFrame(rows).sort_values("value", kind="stable").reset_index(drop=True)
    curve.insert(0, "knob", knob.key)
    # units under the headers and no vertical rules: the table fits 100 columns (a pipe's width)
    table = compact_table(
        f"kvbench slo-search over {knob.key}: {slo_text(slo)}, target {args.attainment * 100:g} %",
        (
            args.over,
            "attainment",
            "goodput\nreq/s",
            "throughput\nreq/s",
            "TTFT p99\ns",
            "TPOT p99\nms",
            "E2E p99\ns",
            "pass?",
            "probe #",
        ),
    )
    for row in curve.itertuples():
        table.add_row(
            value_text(row.value, knob, digits),
            f"{row.slo_attainment:.1%}",
            f"{row.goodput_requests_per_s:.2f}",
            f"{row.throughput_requests_per_s:.2f}",
            f"{row.ttft_p99_s:.2f}",
            f"{row.tpot_p99_s * 1e3:.1f}",
            f"{row.e2e_p99_s:.2f}",
            "pass" if row.passed else "fail",
            str(row.probe),
        )
    out.print(table)

    goal = f"{slo_text(slo)} for {args.attainment * 100:g} % of requests"
    unit = f" {knob.unit}" if knob.unit == "req/s" else ""
    answer = None
    if search.status == "bracketed":
        answer = search.low
        out.print(
            f"[bold]largest {args.over} meeting {goal}: {value_text(search.low, knob, digits)}{unit} "
            f"(bracket {value_text(search.low, knob, digits)}..{value_text(search.high, knob, digits)})[/bold]",
            highlight=False,
        )
    elif search.status == "rising":
        out.print(
            f"[bold]attainment rises with {args.over} here: --low={value_text(low, knob, digits)}{unit} misses "
            f"{goal} and --high={value_text(high, knob, digits)}{unit} meets it; the smallest {args.over} "
            f"meeting it is {value_text(search.high, knob, digits)}{unit} (bracket "
            f"{value_text(search.low, knob, digits)}..{value_text(search.high, knob, digits)}); the largest "
            f"is not bracketed (every value probed from there to --high passes): try a larger --high[/bold]",
            highlight=False,
        )
    elif search.status == "high_passes":
        out.print(
            f"[bold]even --high={value_text(high, knob, digits)}{unit} meets {goal}: the range does not "
            f"bracket the answer, which is above it; try a larger --high[/bold]",
            highlight=False,
        )
    else:
        hint = "a smaller --low" if not knob.integer else "looser SLOs or a lower --attainment"
        out.print(
            f"[bold]even --low={value_text(low, knob, digits)}{unit} misses {goal}: the range does not "
            f"bracket the answer; try {hint}[/bold]",
            highlight=False,
        )
    if search.status in ("bracketed", "rising") and not search.converged:
        out.print(
            f"stopped at --max-runs={args.max_runs} before the bracket reached the tolerance: "
            "raise --max-runs or narrow --low/--high",
            highlight=False,
        )
    monotone = is_monotone(search.probes)
    if not monotone:
        out.print(
            f"[bold yellow]attainment is not monotone in {args.over} over these probes (a pass above a "
            "fail): the bisection's answer is one crossing of the target, not necessarily the largest[/bold yellow]",
            highlight=False,
        )

    document = {
        "over": args.over,
        "key": knob.key,
        "status": search.status,
        "answer": answer,
        "smallest_passing": search.high if search.status == "rising" else None,
        "bracket": [search.low, search.high] if search.status in ("bracketed", "rising") else None,
        "converged": search.converged,
        "monotone": monotone,
        "midpoint": "arithmetic (integer)" if knob.integer else "geometric",
        "target_attainment": args.attainment,
        "rel_tol": args.rel_tol,
        "low": low,
        "high": high,
        "num_runs": len(rows),
        "max_runs": args.max_runs,
        "slo": slo,
        "overrides": overrides,
    }
    fig = figure(curve, search, args.over, knob, args.attainment, f"slo-search: {goal}")
    try:
        write_folder(out_dir, {"curve": curve}, {"curve.png": fig}, {"search.json": document})
    finally:
        pyplot().close(fig)
    out.print(f"results: {out_dir}", highlight=False)
    return 0 if answer is not None else 1


def main() -> None:
    """Entry point for ``kvbench slo-search`` (reads ``sys.argv[1:]``)."""
    run_cli(_main)


if __name__ == "__main__":
    main()
