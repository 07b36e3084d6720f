"""Helpers every workload source shares: arrival processes and the declared-S_max mix.

A source says how long prompts and outputs are; *when* requests arrive and *which S_max each one
declares* are the same question for every source, so they are answered here once. Both helpers
take the caller's ``numpy.random.Generator`` so that one seed reproduces the whole workload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.errors import ConfigError, require

#: arrival processes a source may name in its config
ARRIVAL_KINDS = ("all_at_once", "poisson")
#: a closed-loop client (``vllm bench serve --max-concurrency``): ``max_concurrency`` requests in
#: flight, the next sent when one finishes. Not an arrival process: the times are only known as the
#: run goes, so the engine releases the requests (``Engine(max_in_flight=...)``) and the source
#: only carries ``max_concurrency``; a source that can do so adds it to the kinds it accepts
CLOSED_LOOP = "closed_loop"
#: the latest arrival a run accepts, in seconds from its start: 10^9 s is about 32 years, longer
#: than any trace spans. The clock is a float64 in seconds, whose resolution falls as it grows: at
#: 1e9 s one unit in the last place is 1.2e-7 s, 1e-4 of a millisecond step; near 1e300 a whole
#: request vanishes into its arrival time (arrival + TTFT == arrival) and latencies read exactly 0
MAX_ARRIVAL_S = 1e9

# Fractions that sum to 1 within this tolerance are accepted (YAML users write 0.7/0.25/0.05,
# whose float sum is not exactly 1).
_FRACTION_SUM_TOLERANCE = 1e-6


@dataclass
class SmaxClass:
    """One class of a declared-S_max mix: a request in it promises prompt + output <= s_max_tokens."""

    #: the declared S_max of requests in this class, in tokens (prompt + output)
    s_max_tokens: int = 4096
    #: the fraction of requests that fall in this class; a mix's fractions sum to 1
    fraction: float = 1.0


def validate_arrivals(
    kind: str,
    rate_per_s: float | None,
    key_prefix: str,
    kinds: tuple[str, ...] = ARRIVAL_KINDS,
    max_concurrency: int | None = None,
) -> None:
    """Raise a one-line ConfigError unless ``kind`` is one of ``kinds``, poisson has a positive
    rate and closed_loop a ``max_concurrency`` >= 1.

    ``rate_per_s`` is ignored but for ``poisson`` and ``max_concurrency`` but for ``closed_loop``,
    so a preset's value does not have to be unset when a user overrides only the arrival kind.
    """
    require(kind in kinds, f"{key_prefix}.arrival", kind, f"choose one of {', '.join(kinds)}")
    if kind == "poisson":
        ok = rate_per_s is not None and math.isfinite(rate_per_s) and rate_per_s > 0
        allowed = "use a positive request rate (requests/s) for poisson arrivals"
        require(ok, f"{key_prefix}.rate_per_s", rate_per_s, allowed)
    if kind == CLOSED_LOOP:
        ok = max_concurrency is not None and max_concurrency >= 1
        allowed = "use an integer >= 1 (requests in flight) for closed_loop arrivals"
        require(ok, f"{key_prefix}.max_concurrency", max_concurrency, allowed)


def check_arrival_span(arrival_s: np.ndarray, cause: str) -> None:
    """Refuse a workload whose last request arrives later than MAX_ARRIVAL_S; ``cause`` names the
    options that set the times (a rate, a rate scale, the file)."""
    if len(arrival_s) and float(arrival_s[-1]) > MAX_ARRIVAL_S:
        raise ConfigError(
            f"the last request arrives {float(arrival_s[-1]):.3g} s after the start, beyond the "
            f"{MAX_ARRIVAL_S:.0e} s (about 32 years) a run accepts: {cause}"
        )


def validate_s_max_mix(mix: Sequence[SmaxClass], key: str) -> None:
    """Raise a one-line ConfigError unless every class has S_max >= 2 and positive fractions sum to 1."""
    require(len(mix) >= 1, key, [], "give at least one {s_max_tokens, fraction} class, or null for no mix")
    for i, cls in enumerate(mix):
        # S_max >= 2: a request needs at least one prompt and one output token.
        require(cls.s_max_tokens >= 2, f"{key}[{i}].s_max_tokens", cls.s_max_tokens, "use an integer >= 2")
        ok = math.isfinite(cls.fraction) and cls.fraction > 0
        require(ok, f"{key}[{i}].fraction", cls.fraction, "use a positive fraction")
    total = sum(cls.fraction for cls in mix)
    if abs(total - 1.0) > _FRACTION_SUM_TOLERANCE:
        raise ConfigError(f"{key} fractions sum to {total:.6g}, not 1: make the classes' fractions sum to 1")


def arrival_times_s(kind: str, n: int, rate_per_s: float | None, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of ``n`` requests in seconds from the start of the run (float64, non-decreasing).

    ``all_at_once``: every request arrives at 0 (the offline / throughput setting), and no random
    numbers are drawn; so does ``closed_loop``, whose times are only the earliest (the engine
    sends each when an earlier one finishes). ``poisson``: gaps are exponential with mean ``1 / rate_per_s`` and the first
    request arrives after the first gap, not at 0 (as in vLLM's serving benchmark), so the times are
    ``cumsum(gaps)``.
    """
    if kind in ("all_at_once", CLOSED_LOOP):
        return np.zeros(n, dtype=np.float64)
    if kind == "poisson":
        if rate_per_s is None or not rate_per_s > 0:
            raise ValueError(f"poisson arrivals need a positive rate_per_s, got {rate_per_s!r}")
        gaps_s = rng.exponential(scale=1.0 / rate_per_s, size=n)
        return np.cumsum(gaps_s, dtype=np.float64)
    raise ValueError(f"unknown arrival kind {kind!r}; expected one of {(*ARRIVAL_KINDS, CLOSED_LOOP)}")


def draw_s_max(mix: Sequence[SmaxClass], n: int, rng: np.random.Generator) -> np.ndarray:
    """Each request's declared S_max (int64), drawn independently with the mix's fractions.

    Draws are independent per request, so class counts vary around ``fraction * n`` (a real
    stream of requests does not arrive in exact proportions). A one-class mix draws nothing.
    """
    values = np.array([cls.s_max_tokens for cls in mix], dtype=np.int64)
    if len(values) == 1:
        return np.full(n, values[0], dtype=np.int64)
    p = np.array([cls.fraction for cls in mix], dtype=np.float64)
    # NOTE: renormalize so a sum of 0.9999999 passes numpy's own (tighter) check in choice().
    index = rng.choice(len(values), size=n, p=p / p.sum())
    return values[index]
