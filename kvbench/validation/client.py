"""The benchmark client a silicon row is replayed with, and what each replay records per request.

The sample does not say how many requests each benchmark sent, whether any were warm-up, or how
the first requests were spread: its ``silicon_data_source`` names where a row comes from (a dated
source file, a database dump of a benchmark workflow with the engine's container image, or a
gap-analysis CSV per GPU, framework, version and model) and, on some rows, the client's
``silicon_concurrency``; no row names the client tool, a request count or a warm-up
(docs/engine.md, "The client's shape"). So these are options with defaults that say
what they assume (:class:`ClientShape`):

* ``waves``: the client sends ``waves x concurrency`` requests (default 5);
* ``warmup_waves``: the requests of the first K waves are left out of the means (default 0: ``vllm
  bench serve`` counts every request it sends; its initial single-prompt test run is apart, not
  counted);
* ``desync``: the first wave's sends are spread evenly over ``desync x`` one request's unloaded
  latency (kvbench's own replay of the row at concurrency 1), instead of all at t=0 (default 0).
  At 1 the slots start at the phases of a fully desynchronised closed loop (each at a uniform
  phase of one request's lifetime); more than 1 would leave a slot idle before its first send,
  which no closed loop does, so it is refused.

Each replay records, per counted request, its TTFT and TPOT and how many engine steps it spent
between its send and its first token and between its first and last token
(:func:`request_stats`). A closed-loop client with the first wave at t=0 sends only at step ends,
so adding ``h`` seconds to every step moves no event to another step: TTFT grows by exactly
``h x steps to the first token`` and TPOT by ``h x steps between / (osl - 1)``
(:mod:`kvbench.validation.overhead` fits ``h`` this way without replaying again). With
``desync > 0`` the first wave's sends are at fixed times, so a step overhead can move one of them
into another step: the formula is then an approximation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvbench.errors import ConfigError

#: the defaults: today's replay (five waves, every request counted, the first wave at t=0)
WAVES = 5
WARMUP_WAVES = 0
DESYNC = 0.0


@dataclass(frozen=True)
class ClientShape:
    """How the replay's closed-loop client sends and counts requests (see the module's docstring)."""

    waves: int = WAVES
    warmup_waves: int = WARMUP_WAVES
    desync: float = DESYNC

    def validate(self) -> None:
        """One line (ConfigError) for the first bad value."""
        if not (isinstance(self.waves, int) and self.waves >= 1):
            raise ConfigError(f"--waves {self.waves!r} is invalid: use an integer >= 1")
        if not (isinstance(self.warmup_waves, int) and 0 <= self.warmup_waves < self.waves):
            raise ConfigError(
                f"--warmup-waves {self.warmup_waves!r} is invalid: use an integer from 0 to --waves - 1 "
                f"({self.waves - 1}), so that some requests are counted"
            )
        if not (isinstance(self.desync, (int, float)) and math.isfinite(self.desync) and 0 <= self.desync <= 1):
            raise ConfigError(
                f"--desync {self.desync!r} is invalid: use a fraction in [0, 1] of one request's unloaded latency "
                "(0: the first wave at t=0; 1: a fully desynchronised start)"
            )

    def describe(self) -> str:
        return (
            f"client: {self.waves} waves of the concurrency sent, the first {self.warmup_waves} left out of the "
            f"means, the first wave spread over {self.desync:g} x one request's unloaded latency"
        )


@dataclass(frozen=True)
class RequestStats:
    """Means over the counted requests of one replay (the executor's step overhead as run)."""

    ttft_ms: float
    tpot_ms: float
    #: engine steps between a request's send and its first token (inclusive of that step)
    ttft_steps: float
    #: engine steps between its first and last token, divided by its output tokens - 1
    tpot_steps: float
    counted: int  #: requests in the means


NAN_STATS = RequestStats(math.nan, math.nan, math.nan, math.nan, 0)


def step_starts(steps) -> tuple[np.ndarray, np.ndarray]:
    """Each step-table row's start and the steps before it (a row is a step or a span of quiet
    steps: ``num_steps`` of them)."""
    start_s = np.asarray(steps["start_s"], dtype=np.float64)
    num_steps = np.asarray(steps["num_steps"], dtype=np.int64)
    return start_s, np.concatenate(([0], np.cumsum(num_steps)))


def _steps_before(start_s: np.ndarray, before: np.ndarray, at_s: np.ndarray) -> np.ndarray:
    """Steps that started strictly before each time in ``at_s``. Every event of a closed loop is
    at a row's end (a send at 0 or at a finish, a first token at a prefill's step, a finish at a
    span's last step), so no span is cut by one."""
    return before[np.searchsorted(start_s, at_s, side="left")]


def request_stats(requests, steps, skip_requests: int) -> RequestStats:
    """Means of TTFT, TPOT and the steps each spent, over the finished requests after the first
    ``skip_requests`` sent (vllm bench serve's definitions: TPOT is ``(E2E - TTFT) / (output - 1)``
    over requests with more than one output token)."""
    request_id = np.asarray(requests["request_id"], dtype=np.int64)
    order = np.argsort(request_id, kind="stable")
    arrival_s = np.asarray(requests["arrival_s"], dtype=np.float64)[order]
    first_s = np.asarray(requests["first_token_s"], dtype=np.float64)[order]
    finish_s = np.asarray(requests["finish_s"], dtype=np.float64)[order]
    tokens = np.asarray(requests["max_branch_output_tokens"], dtype=np.int64)[order]
    keep = np.arange(len(order)) >= skip_requests
    keep &= finish_s >= 0
    if not keep.any():
        return NAN_STATS
    arrival_s, first_s, finish_s, tokens = arrival_s[keep], first_s[keep], finish_s[keep], tokens[keep]
    ttft_s = first_s - arrival_s
    many = tokens > 1
    tpot_s = (finish_s - first_s)[many] / (tokens[many] - 1)
    ttft_steps = tpot_steps = math.nan
    if steps is not None and "start_s" in steps and len(steps["start_s"]):
        start_s, before = step_starts(steps)
        first_step = _steps_before(start_s, before, first_s)
        ttft_steps = float(np.mean(first_step - _steps_before(start_s, before, arrival_s)))
        between = _steps_before(start_s, before, finish_s) - first_step
        tpot_steps = float(np.mean(between[many] / (tokens[many] - 1))) if many.any() else math.nan
    return RequestStats(
        float(np.mean(ttft_s)) * 1e3,
        float(np.mean(tpot_s)) * 1e3 if many.any() else math.nan,
        ttft_steps,
        tpot_steps,
        int(keep.sum()),
    )
