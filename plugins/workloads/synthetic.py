"""The ``synthetic`` workload source: fixed or lognormal lengths; all-at-once, Poisson or
closed-loop arrivals.

Presets in ``conf/workload/`` (``lecture_chat``, ``lognormal``, ``exercise2_mix``) are this source
with different options.

Declared S_max. Every request declares an S_max (the workload's ``s_max_tokens`` column): either
``s_max_tokens`` for all, or a class drawn from ``s_max_mix``. A declared S_max is the request's own
promise about its length, so kvbench keeps it: drawn (lognormal) lengths are clipped into the
request's class, prompt to ``S_max - min_tokens`` and then output to ``S_max - prompt``. A request
that draws a long prompt in a small class is therefore truncated, which is exactly the failure
mode of per-request S_max the lecture's exercise 2 describes (under-guessers are cut short,
over-guessers waste their reservation). Fixed lengths are never clipped: they must fit the
smallest declared S_max, or the config is rejected.

Shared prefixes. ``shared_prefix_tokens > 0`` gives every request the same first prompt tokens (a
system prompt) and fills the workload's prefix hashes, one id per ``hash_block_tokens`` prompt
tokens (see :func:`shared_prefix_hashes`), so a prefix-caching allocator can reuse them; 0 leaves
the hashes empty, and nothing changes for existing runs.

Reproducibility. Random numbers are drawn in a fixed order (arrival gaps, S_max classes, prompt
lengths, output lengths) from the generator the engine passes in; ``all_at_once`` and
``closed_loop`` arrivals, a one-class mix and fixed lengths draw nothing. One seed therefore gives
one workload.

Closed loop. ``arrival: closed_loop`` is a client with ``max_concurrency`` requests in flight that
sends the next one the moment one finishes (``vllm bench serve --max-concurrency``). Its requests
all carry arrival 0 and the workload carries ``max_concurrency``: the engine releases them as
earlier ones finish, and records each one's arrival as the time it was sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvbench import hookimpl
from kvbench.errors import ConfigError, require
from kvbench.workload.arrivals import (
    ARRIVAL_KINDS,
    CLOSED_LOOP,
    MAX_ARRIVAL_S,
    SmaxClass,
    arrival_times_s,
    draw_s_max,
    validate_arrivals,
    validate_s_max_mix,
)
from kvbench.workload.source import Workload, WorkloadSource

LENGTH_KINDS = ("fixed", "lognormal")
#: the longest stretch of Poisson arrivals, in seconds (see SyntheticConfig.validate)
FAN_OUTS = ("sample", "beam")
#: the shared arrival processes, and a closed-loop client
ARRIVALS = (*ARRIVAL_KINDS, CLOSED_LOOP)
_KEY = "workload"


@dataclass
class SyntheticConfig:
    """Options of the ``synthetic`` workload (the ``workload`` config group)."""

    #: how many requests the run serves
    num_requests: int = 1000
    #: fixed: every request has exactly prompt_tokens / output_tokens; lognormal: drawn per request
    lengths: str = "fixed"
    #: prompt length in tokens (fixed), or the median prompt length (lognormal)
    prompt_tokens: int = 512
    #: output length in tokens (fixed), or the median output length (lognormal)
    output_tokens: int = 128
    #: lognormal shape of prompt lengths: the sigma of log(length); 0 gives the median every time
    prompt_sigma: float = 1.0
    #: lognormal shape of output lengths
    output_sigma: float = 1.0
    #: shortest drawn prompt or output, in tokens (lognormal only)
    min_tokens: int = 1
    #: longest drawn prompt in tokens, or null for no clip beyond S_max (lognormal only)
    max_prompt_tokens: int | None = None
    #: longest drawn output in tokens, or null for no clip beyond S_max (lognormal only)
    max_output_tokens: int | None = None
    #: all_at_once: every request arrives at t=0; poisson: exponential gaps at rate_per_s;
    #: closed_loop: max_concurrency requests in flight, the next sent when one finishes
    arrival: str = "all_at_once"
    #: mean request rate in requests/s; required (> 0) for poisson, ignored otherwise
    rate_per_s: float | None = None
    #: requests in flight; required (>= 1) for closed_loop, ignored otherwise
    max_concurrency: int | None = None
    #: closed_loop only: the client's first max_concurrency sends spread evenly over this many
    #: seconds (request i at i x window / max_concurrency) instead of all at t=0, a desynchronised
    #: start; the later sends still follow the finishes. 0: the whole first wave at t=0
    first_wave_window_s: float = 0.0
    #: the declared S_max (prompt + output tokens) of every request when s_max_mix is null
    s_max_tokens: int = 4096
    #: declared S_max classes, each {s_max_tokens, fraction}, fractions summing to 1; each request
    #: draws its class; null: every request declares s_max_tokens (which a mix overrides)
    s_max_mix: list[SmaxClass] | None = None
    #: branches per request: the branches share the prompt, fork after its prefill and each emit
    #: their own output
    num_branches: int = 1
    #: sample: parallel sampling (with lognormal lengths each branch draws its own length);
    #: beam: a beam search of width num_branches (every beam emits the request's output length,
    #: and the beams are re-forked as they go, see beam_fork_probability)
    fan_out: str = "sample"
    #: beam search only: the chance that, after a step, a beam is replaced by a copy of another
    #: beam (its own continuation dropped). An assumption, not a measurement (kvbench has no token
    #: model): sweep it. 0 makes a beam search share only its prompt, as parallel sampling does.
    beam_fork_probability: float = 0.5
    #: every request's first shared_prefix_tokens prompt tokens are the same across requests (a
    #: system prompt); a shorter prompt is shared whole. 0: no content ids, nothing is shared
    shared_prefix_tokens: int = 0
    #: the granule of the prefix hashes, in prompt tokens (kvbench.core.prefix); used when
    #: shared_prefix_tokens > 0
    hash_block_tokens: int = 8

    def declared_s_max_tokens(self) -> list[int]:
        """Every S_max a request of this workload can declare."""
        if self.s_max_mix:
            return [cls.s_max_tokens for cls in self.s_max_mix]
        return [self.s_max_tokens]

    def validate(self) -> None:
        """Raise a one-line ConfigError for the first invalid option."""
        require(self.num_requests >= 1, f"{_KEY}.num_requests", self.num_requests, "use an integer >= 1")
        allowed = f"choose one of {', '.join(LENGTH_KINDS)}"
        require(self.lengths in LENGTH_KINDS, f"{_KEY}.lengths", self.lengths, allowed)
        for key in ("prompt_tokens", "output_tokens", "min_tokens"):
            value = getattr(self, key)
            require(value >= 1, f"{_KEY}.{key}", value, "use an integer >= 1")
        for key in ("prompt_sigma", "output_sigma"):
            value = getattr(self, key)
            require(math.isfinite(value) and value >= 0, f"{_KEY}.{key}", value, "use a lognormal sigma >= 0")
        for key in ("max_prompt_tokens", "max_output_tokens"):
            value = getattr(self, key)
            ok = value is None or value >= self.min_tokens
            require(ok, f"{_KEY}.{key}", value, f"use null or an integer >= workload.min_tokens={self.min_tokens}")
        require(self.num_branches >= 1, f"{_KEY}.num_branches", self.num_branches, "use an integer >= 1")
        require(self.fan_out in FAN_OUTS, f"{_KEY}.fan_out", self.fan_out, f"choose one of {', '.join(FAN_OUTS)}")
        require(
            math.isfinite(self.beam_fork_probability) and 0 <= self.beam_fork_probability <= 1,
            f"{_KEY}.beam_fork_probability",
            self.beam_fork_probability,
            "use a probability in [0, 1]",
        )
        require(
            self.shared_prefix_tokens >= 0,
            f"{_KEY}.shared_prefix_tokens",
            self.shared_prefix_tokens,
            "use an integer >= 0 (0: no shared prefix)",
        )
        require(
            self.hash_block_tokens >= 1,
            f"{_KEY}.hash_block_tokens",
            self.hash_block_tokens,
            "use an integer >= 1 (the prefix-hash granule in tokens)",
        )
        validate_arrivals(self.arrival, self.rate_per_s, _KEY, ARRIVALS, self.max_concurrency)
        window_s = self.first_wave_window_s
        require(
            isinstance(window_s, (int, float)) and math.isfinite(window_s) and 0 <= window_s <= MAX_ARRIVAL_S,
            f"{_KEY}.first_wave_window_s",
            window_s,
            "use seconds >= 0 (0: the first wave at t=0)",
        )
        if self.arrival == "poisson":
            # at a rate of 1e-300/s every step time would vanish into the arrival times (see MAX_ARRIVAL_S)
            span_s = self.num_requests / self.rate_per_s
            require(
                span_s <= MAX_ARRIVAL_S,
                f"{_KEY}.rate_per_s",
                self.rate_per_s,
                f"{self.num_requests} requests would arrive over ~{span_s:.3g} s; use a rate >= "
                f"workload.num_requests / {MAX_ARRIVAL_S:.0e} s",
            )
        require(self.s_max_tokens >= 2, f"{_KEY}.s_max_tokens", self.s_max_tokens, "use an integer >= 2")
        if self.s_max_mix is not None:
            validate_s_max_mix(self.s_max_mix, f"{_KEY}.s_max_mix")
        self._validate_lengths_fit()

    def _validate_lengths_fit(self) -> None:
        smallest = min(self.declared_s_max_tokens())
        where = (
            f"the smallest class of {_KEY}.s_max_mix ({smallest})"
            if self.s_max_mix
            else f"{_KEY}.s_max_tokens={smallest}"
        )
        if self.lengths == "fixed":
            if self.prompt_tokens > smallest:
                raise ConfigError(
                    f"{_KEY}.prompt_tokens={self.prompt_tokens} is longer than {where}: a request's prompt and "
                    "at least one output token must fit its declared S_max; shorten the prompt or raise S_max"
                )
            total = self.prompt_tokens + self.output_tokens
            if total > smallest:
                raise ConfigError(
                    f"{_KEY}.prompt_tokens + {_KEY}.output_tokens = {total} is longer than {where}: fixed "
                    "lengths are never clipped, so they must fit every declared S_max"
                )
            return
        # Drawn lengths are clipped into each class; the floors must fit the smallest class.
        if 2 * self.min_tokens > smallest:
            raise ConfigError(
                f"{_KEY}.min_tokens={self.min_tokens} does not fit {where}: a prompt and an output of "
                "min_tokens each must fit every declared S_max"
            )
        largest = max(self.declared_s_max_tokens())
        if self.prompt_tokens >= largest:
            raise ConfigError(
                f"{_KEY}.prompt_tokens={self.prompt_tokens} (the median prompt) is not shorter than the largest "
                f"declared S_max ({largest}): most prompts would be clipped; lower the median or raise S_max"
            )


class SyntheticWorkload(WorkloadSource):
    """Requests with fixed or lognormal lengths, arriving all at once, as a Poisson process or
    from a closed-loop client."""

    name = "synthetic"
    Config = SyntheticConfig

    @classmethod
    def carries_prefix_hashes(cls, config: SyntheticConfig) -> bool:
        return config.shared_prefix_tokens > 0

    def __init__(self, config: SyntheticConfig | None = None) -> None:
        config = config if config is not None else SyntheticConfig()
        # Cheap, and gives programmatic users the same one-line errors as the CLI.
        config.validate()
        super().__init__(config)

    def generate(self, rng: np.random.Generator) -> Workload:
        """The run's requests, sorted by arrival; the same ``rng`` state gives the same workload."""
        cfg: SyntheticConfig = self.config
        n = cfg.num_requests
        arrival_s = arrival_times_s(cfg.arrival, n, cfg.rate_per_s, rng)
        if cfg.s_max_mix:
            s_max_tokens = draw_s_max(cfg.s_max_mix, n, rng)
        else:
            s_max_tokens = np.full(n, cfg.s_max_tokens, dtype=np.int64)
        branches = cfg.num_branches
        beam = cfg.fan_out == "beam" and branches > 1
        drawn_branches = 1 if beam else branches  # a beam search's beams all emit its output length

        branch_output_tokens = None
        if cfg.lengths == "fixed":
            prompt_tokens = np.full(n, cfg.prompt_tokens, dtype=np.int64)
            output_tokens = np.full(n, cfg.output_tokens, dtype=np.int64)
        else:
            # The largest S_max also bounds the draws, so a heavy tail cannot overflow int64.
            largest = max(cfg.declared_s_max_tokens())
            upper = min(cfg.max_prompt_tokens or largest, largest)
            prompt_tokens = _lognormal_tokens(cfg.prompt_tokens, cfg.prompt_sigma, cfg.min_tokens, upper, n, rng)
            upper = min(cfg.max_output_tokens or largest, largest)
            # one draw per branch, request by request (a single column when there is one branch)
            drawn = _lognormal_tokens(
                cfg.output_tokens, cfg.output_sigma, cfg.min_tokens, upper, n * drawn_branches, rng
            )
            # Clip into each request's own declared S_max (see the module docstring): leave room
            # for at least min_tokens of output, then let the output fill what remains.
            prompt_tokens = np.minimum(prompt_tokens, s_max_tokens - cfg.min_tokens)
            drawn = np.minimum(drawn.reshape(n, drawn_branches), (s_max_tokens - prompt_tokens)[:, None])
            output_tokens = drawn.max(axis=1)
            branch_output_tokens = drawn if drawn_branches > 1 else None

        # Stable, so requests with equal arrival times keep their generation order.
        order = np.argsort(arrival_s, kind="stable")
        arrival_s = arrival_s[order]
        if cfg.arrival == CLOSED_LOOP and cfg.first_wave_window_s > 0:
            # a closed loop's arrival_s is only the earliest send: the first wave's sends are
            # staggered, the later ones (0) go out as earlier requests finish
            first = min(cfg.max_concurrency, n)
            arrival_s[:first] = np.arange(first) * (cfg.first_wave_window_s / cfg.max_concurrency)
        shared = cfg.shared_prefix_tokens
        return Workload(
            arrival_s=arrival_s,
            prompt_tokens=prompt_tokens[order],
            output_tokens=output_tokens[order],
            s_max_tokens=s_max_tokens[order],
            num_branches=None if branches == 1 else np.full(n, branches, dtype=np.int64),
            branch_output_tokens=None if branch_output_tokens is None else branch_output_tokens[order].reshape(-1),
            beam_fork_probability=cfg.beam_fork_probability if beam else 0.0,
            prefix_hashes=shared_prefix_hashes(prompt_tokens[order], shared, cfg.hash_block_tokens) if shared else None,
            hash_block_tokens=cfg.hash_block_tokens if shared else 0,
            max_concurrency=cfg.max_concurrency if cfg.arrival == CLOSED_LOOP else None,
        )


def shared_prefix_hashes(prompt_tokens: np.ndarray, shared_tokens: int, granule_tokens: int) -> list[tuple[int, ...]]:
    """Each prompt's granule ids when every prompt starts with the same ``shared_tokens`` tokens.

    A granule whose tokens all lie in the shared prefix gets the id ``g`` (its index), the same in
    every request: it is the same text, and so is every block ending in it. That holds for a last,
    partial granule too (a prompt shorter than the prefix is shared whole). Every other granule
    holds some of the request's own tokens and gets a fresh id, numbered after the shared ones so
    that no two differ-in-content granules collide; no random numbers are drawn.
    """
    next_id = -(-shared_tokens // granule_tokens)  # the shared ids are 0 .. ceil(shared / granule) - 1
    hashes = []
    for prompt in prompt_tokens.tolist():
        granules = -(-prompt // granule_tokens)
        # granule g ends at min((g + 1) * granule, prompt): shared iff that end is within the prefix
        num_shared = granules if prompt <= shared_tokens else shared_tokens // granule_tokens
        own = granules - num_shared
        hashes.append((*range(num_shared), *range(next_id, next_id + own)))
        next_id += own
    return hashes


def _lognormal_tokens(
    median_tokens: int, sigma: float, min_tokens: int, max_tokens: int, n: int, rng: np.random.Generator
) -> np.ndarray:
    """``n`` lengths (int64) from a lognormal with the given median, rounded, clipped to [min, max]."""
    draws = rng.lognormal(mean=math.log(median_tokens), sigma=sigma, size=n)
    return np.clip(np.rint(draws), min_tokens, max_tokens).astype(np.int64)


@hookimpl
def kvbench_register_workloads() -> list[type]:
    """Register the ``synthetic`` workload source."""
    return [SyntheticWorkload]
