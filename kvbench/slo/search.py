"""``kvbench slo-search``: the largest arrival rate (or batch cap) whose simulated runs meet every SLO.

Each probe is one whole simulated run (:func:`kvbench.api.run`) with the knob set; it passes when
its SLO attainment, the fraction of finished requests meeting every SLO given (inclusive, the
count behind goodput: ``summary["slo_attainment"]``), reaches ``--attainment``.

Attainment usually falls as the knob rises (more load; or a larger batch cap, which makes every
decode step slower), so one bracket [passes, fails] holds the answer and is halved. Where it rises
instead (over ``max_num_seqs`` with a TTFT SLO, a larger cap shortens the queue), the ends say so
(--low fails, --high passes) and the same halving finds the smallest value that passes:

- ``rate``: geometric midpoint ``sqrt(low * high)``. The stopping rule is relative
  (``high / low <= 1 + rel_tol``), and the geometric midpoint halves ``log(high / low)`` each
  probe, so the count of probes depends on the ratio alone, not on where in the range the answer is;
- ``max_num_seqs``: the integer midpoint, until ``high - low <= 1`` (the tolerance is absolute).

Every probe is recorded, so a curve that is not monotone shows in the table and the figure (and a
line says so).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from kvbench.errors import ConfigError, require
from kvbench.output.figures import pyplot
from kvbench.output.report import wide_console
from kvbench.slo.common import (
    Parser,
    compose_checked,
    fmt_seconds,
    resolve_out_dir,
    run_cli,
    write_folder,
)


@dataclass(frozen=True)
class Knob:
    key: str  #: the config key a probe sets
    integer: bool
    unit: str
    default_low: float
    default_high: float


KNOBS = {
    "rate": Knob("workload.rate_per_s", False, "req/s", 0.1, 64.0),
    "max_num_seqs": Knob("scheduler.max_num_seqs", True, "seqs", 1, 1024),
}
#: bounds on the options: a relative tolerance below 1e-6 asks for more digits than a rate has
#: (and 1e-20 made the probe count a division by zero); every probe is a whole simulated run
MIN_REL_TOL = 1e-6
MAX_RUNS = 1000
MAX_RATE_SPAN = 1e12
MAX_NUM_SEQS = 1 << 24
#: summary columns kept for every probe
PROBE_COLUMNS = ("slo_attainment", "goodput_requests_per_s", "throughput_requests_per_s", "ttft_p99_s",
                 "tpot_p99_s", "e2e_p99_s", "num_requests", "num_finished", "num_preemptions")  # fmt: skip


@dataclass
class Search:
    """The probes taken (knob value -> passed, in the order taken) and where the search ended."""

    probes: dict[float, bool] = field(default_factory=dict)
    #: bracketed (low passes, high fails: attainment falls with the knob), rising (low fails, high
    #: passes: it rises, and the bracket holds the smallest passing value), high_passes or low_fails
    #: (both ends pass, or both fail)
    status: str = "bracketed"
    #: bracketed: the largest value known to pass; rising: the largest known to fail
    low: float = math.nan
    #: bracketed: the smallest value known to fail above it; rising: the smallest known to pass
    high: float = math.nan
    converged: bool = False


def close_enough(low: float, high: float, integer: bool, rel_tol: float) -> bool:
    return high - low <= 1 if integer else high / low <= 1 + rel_tol


def bisect(passes: Callable[[float], bool], low: float, high: float, *, integer: bool, rel_tol: float,
           max_runs: int) -> Search:  # fmt: skip
    """Probe both ends, then halve the bracket between a pass and a fail until it is within
    tolerance or ``max_runs`` probes have run. Attainment usually falls as the knob rises (more
    load); where it rises instead (a larger batch cap shortens the queue, and so the TTFT), the
    same halving finds the smallest value that passes."""
    search = Search()

    def probe(value: float) -> bool:
        search.probes[value] = passes(value)
        return search.probes[value]

    low_passes, high_passes = probe(low), probe(high)
    if low_passes == high_passes:
        search.status = "high_passes" if high_passes else "low_fails"
        return search
    search.status = "bracketed" if low_passes else "rising"
    while not close_enough(low, high, integer, rel_tol) and len(search.probes) < max_runs:
        mid = (low + high) // 2 if integer else math.sqrt(low * high)
        if probe(mid) == low_passes:  # mid is on the low end's side of the crossing
            low = mid
        else:
            high = mid
    search.low, search.high = low, high
    search.converged = close_enough(low, high, integer, rel_tol)
    return search


def is_monotone(probes: dict[float, bool]) -> bool:
    """No passing probe above a failing one."""
    lowest_fail = min((v for v, ok in probes.items() if not ok), default=math.inf)
    return all(v < lowest_fail for v, ok in probes.items() if ok)


def expected_runs(low: float, high: float, integer: bool, rel_tol: float) -> int:
    """Probes a bracketed search takes: both ends, then one per halving."""
    span = high - low if integer else math.log(high / low) / math.log(1 + rel_tol)
    return 2 + max(0, math.ceil(math.log2(span))) if span > 1 else 2


def slo_text(slo: dict) -> str:
    return ", ".join(f"{key.removesuffix('_s')}<={fmt_seconds(value)}" for key, value in slo.items())


def _value_text(value: float, knob: Knob, digits: int) -> str:
    """``digits`` significant digits, trailing zeros kept (a bracket 4.19..4.30 reads as one)."""
    if knob.integer:
        return f"{int(value)}"
    return f"{value:.{max(0, digits - 1 - math.floor(math.log10(value)))}f}"


def _figure(curve: pd.DataFrame, search: Search, knob_name: str, knob: Knob, target: float, title: str):
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    x = curve["value"].to_numpy(dtype=float)
    passed = curve["passed"].to_numpy(dtype=bool)
    top.plot(x, curve["slo_attainment"] * 100, color="#2b8cbe", linewidth=1)
    top.scatter(x[passed], curve["slo_attainment"][passed] * 100, color="#31a354", zorder=3, label="pass")
    top.scatter(x[~passed], curve["slo_attainment"][~passed] * 100, color="#e34a33", zorder=3, label="fail")
    top.axhline(target * 100, color="black", linestyle="--", linewidth=1, label=f"target {target * 100:g} %")
    if search.status in ("bracketed", "rising"):
        top.axvspan(search.low, search.high, color="#fdbb84", alpha=0.5, label="final bracket")
    top.set_ylabel("SLO attainment (% of requests)")
    top.set_ylim(0, 105)
    top.legend(fontsize=8, loc="lower left")
    top.set_title(title, fontsize=10)
    bottom.plot(x, curve["goodput_requests_per_s"], "o-", color="#31a354", label="goodput")
    bottom.plot(x, curve["throughput_requests_per_s"], "s--", color="#636363", label="throughput")
    bottom.set_ylabel("requests/s")
    bottom.set_ylim(bottom=0)
    bottom.legend(fontsize=8, loc="upper left")
    bottom.set_xscale("log")  # rate probes are geometric; batch caps span orders of magnitude
    bottom.set_xlabel(f"{knob_name} ({knob.key}, {knob.unit})")
    fig.tight_layout()
    return fig


def _main(argv: list[str]) -> int:
    parser = Parser("kvbench slo-search", "The largest arrival rate or batch cap whose simulated runs meet "
                    "every SLO (slo.ttft_s, slo.tpot_s, slo.e2e_s overrides) for a fraction of requests, by bisection. "
                    "Exit status 1 when --low..--high does not bracket the largest such value (the line says what "
                    "was found instead), 2 on bad input.")  # fmt: skip
    parser.add_argument("--over", required=True, choices=sorted(KNOBS),
                        help="rate: workload.rate_per_s (Poisson arrivals); max_num_seqs: scheduler.max_num_seqs")
    parser.add_argument("--low", type=float, default=None, help="lower end (default 0.1 req/s or 1 seq)")
    parser.add_argument("--high", type=float, default=None, help="upper end (default 64 req/s or 1024 seqs)")
    parser.add_argument("--attainment", type=float, default=0.9,
                        help="fraction of requests that must meet every SLO (default 0.9)")
    parser.add_argument("--rel-tol", type=float, default=0.05,
                        help="rate: stop when high/low <= 1 + rel_tol (default 0.05)")
    parser.add_argument("--max-runs", type=int, default=20, help="most simulated runs (default 20)")
    parser.add_argument("--out", default=None, help="output folder (default results/slo/<date>/search-<time>/)")
    args, overrides = parser.parse(argv)
    out_dir = resolve_out_dir(args.out, "search")
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
    require(math.isfinite(args.rel_tol) and MIN_REL_TOL <= args.rel_tol <= 1, "--rel-tol", args.rel_tol,
            f"use a fraction from {MIN_REL_TOL:g} to 1, e.g. 0.05 (below {MIN_REL_TOL:g} the bracket's ends are "
            "closer than the rate's own digits)")  # fmt: skip
    require(2 <= args.max_runs <= MAX_RUNS, "--max-runs", args.max_runs,
            f"use an integer from 2 to {MAX_RUNS} (both ends are probed first; each probe is a whole run)")  # fmt: skip
    if not knob.integer:
        require(high / low <= MAX_RATE_SPAN, "--high", high, f"use a range of at most {MAX_RATE_SPAN:.0e} x --low={low:g}")
    for override in overrides:
        if override.split("=")[0].lstrip("+") == knob.key:
            raise ConfigError(f"{override} sets what --over {args.over} searches: drop it and give --low/--high")

    from kvbench.api import run
    from kvbench.app.run import setup

    # the whole config once, before any run: a bad override or value fails here, in one line
    cfg, _ = compose_checked([*overrides, f"{knob.key}={low}"])
    if args.over == "rate" and cfg.workload.get("arrival") != "poisson":
        raise ConfigError(f"--over rate sets workload.rate_per_s, which needs Poisson arrivals, but "
                          f"workload.arrival={cfg.workload.get('arrival')}: add workload.arrival=poisson "
                          "or pick a Poisson workload such as workload=sharegpt_like")  # fmt: skip
    s = setup(cfg)
    slo = {key: value for key, value in vars(s.slo).items() if value is not None}
    if not slo:
        raise ConfigError("no SLO given: add at least one of slo.ttft_s=<s> slo.tpot_s=<s> slo.e2e_s=<s>, "
                          "e.g. slo.ttft_s=2 slo.tpot_s=0.05")  # fmt: skip

    digits = 3 + max(0, math.ceil(-math.log10(args.rel_tol)) - 2)  # enough to tell the bracket's ends apart
    rows: list[dict] = []
    out = wide_console()
    estimate = min(args.max_runs, expected_runs(low, high, knob.integer, args.rel_tol))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=out, transient=True) as progress:
        task = progress.add_task("slo-search", total=estimate)

        def passes(value: float) -> bool:
            text = _value_text(value, knob, digits)
            progress.update(task, description=f"probe {len(rows) + 1}: {args.over}={text}")
            value_arg = int(value) if knob.integer else repr(float(value))
            result = run([*overrides, f"{knob.key}={value_arg}", "progress=false"])
            row = {"probe": len(rows) + 1, "value": value, **{k: result.summary[k] for k in PROBE_COLUMNS}}
            # NaN attainment (nothing finished) fails: the comparison is False
            row["passed"] = bool(row["slo_attainment"] >= args.attainment)
            rows.append(row)
            progress.console.print(
                f"probe {row['probe']}: {args.over}={text} {knob.unit}: attainment {row['slo_attainment']:.1%} "
                f"-> {'pass' if row['passed'] else 'fail'}", highlight=False)  # fmt: skip
            progress.update(task, advance=1, total=max(estimate, len(rows)))
            return row["passed"]

        search = bisect(passes, low, high, integer=knob.integer, rel_tol=args.rel_tol, max_runs=args.max_runs)

    curve = pd.DataFrame(rows).sort_values("value", kind="stable").reset_index(drop=True)
    curve.insert(0, "knob", knob.key)
    table = Table(title=f"kvbench slo-search over {knob.key}: {slo_text(slo)}, target {args.attainment * 100:g} %")
    for header in (args.over, "attainment", "goodput req/s", "throughput req/s", "TTFT p99 s", "TPOT p99 ms",
                   "E2E p99 s", "pass?", "probe #"):  # fmt: skip
        table.add_column(header, justify="right")
    for row in curve.itertuples():
        table.add_row(_value_text(row.value, knob, digits), f"{row.slo_attainment:.1%}", f"{row.goodput_requests_per_s:.2f}",
                      f"{row.throughput_requests_per_s:.2f}", f"{row.ttft_p99_s:.2f}", f"{row.tpot_p99_s * 1e3:.1f}",
                      f"{row.e2e_p99_s:.2f}", "pass" if row.passed else "fail", str(row.probe))  # fmt: skip
    out.print(table)

    goal = f"{slo_text(slo)} for {args.attainment * 100:g} % of requests"
    unit = f" {knob.unit}" if knob.unit == "req/s" else ""
    answer = None
    if search.status == "bracketed":
        answer = search.low
        out.print(f"[bold]largest {args.over} meeting {goal}: {_value_text(search.low, knob, digits)}{unit} "
                  f"(bracket {_value_text(search.low, knob, digits)}..{_value_text(search.high, knob, digits)})[/bold]",
                  highlight=False)  # fmt: skip
        if not search.converged:
            out.print(f"stopped at --max-runs={args.max_runs} before the bracket reached the tolerance: "
                      "raise --max-runs or narrow --low/--high", highlight=False)  # fmt: skip
    elif search.status == "rising":
        out.print(f"[bold]attainment rises with {args.over} here: --low={_value_text(low, knob, digits)}{unit} misses "
                  f"{goal} and --high={_value_text(high, knob, digits)}{unit} meets it; the smallest {args.over} "
                  f"meeting it is {_value_text(search.high, knob, digits)}{unit} (bracket "
                  f"{_value_text(search.low, knob, digits)}..{_value_text(search.high, knob, digits)}); the largest "
                  f"is not bracketed (every value probed from there to --high passes): try a larger --high[/bold]",
                  highlight=False)  # fmt: skip
        if not search.converged:
            out.print(f"stopped at --max-runs={args.max_runs} before the bracket reached the tolerance: "
                      "raise --max-runs or narrow --low/--high", highlight=False)  # fmt: skip
    elif search.status == "high_passes":
        out.print(f"[bold]even --high={_value_text(high, knob, digits)}{unit} meets {goal}: the range does not "
                  f"bracket the answer, which is above it; try a larger --high[/bold]", highlight=False)  # fmt: skip
    else:
        hint = "a smaller --low" if not knob.integer else "looser SLOs or a lower --attainment"
        out.print(f"[bold]even --low={_value_text(low, knob, digits)}{unit} misses {goal}: the range does not "
                  f"bracket the answer; try {hint}[/bold]", highlight=False)  # fmt: skip
    monotone = is_monotone(search.probes)
    if not monotone:
        out.print(f"[bold yellow]attainment is not monotone in {args.over} over these probes (a pass above a "
                  "fail): the bisection's answer is one crossing of the target, not necessarily the largest[/bold yellow]",
                  highlight=False)  # fmt: skip

    document = {
        "over": args.over, "key": knob.key, "status": search.status, "answer": answer,
        "smallest_passing": search.high if search.status == "rising" else None,
        "bracket": [search.low, search.high] if search.status in ("bracketed", "rising") else None,
        "converged": search.converged,
        "monotone": monotone, "midpoint": "arithmetic (integer)" if knob.integer else "geometric",
        "target_attainment": args.attainment, "rel_tol": args.rel_tol, "low": low, "high": high,
        "num_runs": len(rows), "max_runs": args.max_runs, "slo": slo, "overrides": overrides,
    }  # fmt: skip
    fig = _figure(curve, search, args.over, knob, args.attainment, f"slo-search: {goal}")
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
