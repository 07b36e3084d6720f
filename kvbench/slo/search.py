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

from kvbench.output.figures import pyplot
from kvbench.slo.common import (
    fmt_seconds,
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
PROBE_COLUMNS = (
    "slo_attainment",
    "goodput_requests_per_s",
    "throughput_requests_per_s",
    "ttft_p99_s",
    "tpot_p99_s",
    "e2e_p99_s",
    "num_requests",
    "num_finished",
    "num_preemptions",
)


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


def bisect(
    passes: Callable[[float], bool], low: float, high: float, *, integer: bool, rel_tol: float, max_runs: int
) -> Search:
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


def value_text(value: float, knob: Knob, digits: int) -> str:
    """``digits`` significant digits, trailing zeros kept (a bracket 4.19..4.30 reads as one)."""
    if knob.integer:
        return f"{int(value)}"
    return f"{value:.{max(0, digits - 1 - math.floor(math.log10(value)))}f}"


def figure(curve: pd.DataFrame, search: Search, knob_name: str, knob: Knob, target: float, title: str):
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
