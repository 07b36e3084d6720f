"""What a differential check hands a peer engine and gets back: plain values, no engine types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PeerRequest:
    request_id: int
    prompt_tokens: int
    #: tokens generated (ignore_eos: exactly this many)
    output_tokens: int
    #: the request joins the waiting queue at the first step boundary at or after this time
    arrival_s: float
    #: the prompt's token ids (len == prompt_tokens); requests share a prefix only where these agree
    token_ids: tuple[int, ...]
    #: lower runs first under a priority policy (vLLM's convention)
    priority: int = 0


@dataclass(frozen=True)
class PeerCaps:
    """The caps both sides run under, in the peer's own terms."""

    #: blocks the engine would carve from the KV budget (vLLM: its null block is one of them)
    num_blocks: int
    block_size_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool = True
    #: vLLM's long_prefill_token_threshold (0: none)
    long_prefill_token_threshold: int = 0
    prefix_caching: bool = False
    #: vLLM's scheduling policy: "fcfs" or "priority"
    policy: str = "fcfs"
    #: share of the blocks kept free when admitting (vLLM's watermark: int(fraction x num_blocks))
    watermark_fraction: float = 0.0
    #: every step lasts this long on both sides (the check compares decisions, not timings)
    step_s: float = 0.01


@dataclass
class PeerStep:
    #: request id -> tokens computed for it this step (prefill chunk length, or 1 for a decode)
    scheduled: dict[int, int]
    #: requests preempted while this step was scheduled
    preempted: list[int] = field(default_factory=list)
    #: requests whose last token was produced by this step
    finished: list[int] = field(default_factory=list)


@dataclass
class PeerTrace:
    engine: str  # e.g. "vllm 0.33.0"
    steps: list[PeerStep]
    #: blocks in use at the end of each step (for the peak)
    blocks_used: list[int] = field(default_factory=list)

    def finish_steps(self) -> dict[int, int]:
        return {rid: i for i, step in enumerate(self.steps) for rid in step.finished}

    def num_preemptions(self) -> int:
        return sum(len(step.preempted) for step in self.steps)


def check_progress(engine: str, num_steps: int, max_steps: int, num_finished: int, num_requests: int) -> None:
    """RuntimeError, naming how far it got, once a peer's loop has run ``max_steps`` steps: a
    scheduler that stopped finishing requests must fail the check, not run for ever."""
    if num_steps >= max_steps:
        raise RuntimeError(f"{engine}: {num_finished} of {num_requests} requests finished after {max_steps} steps")


def join_arrivals(
    requests: list[PeerRequest], next_arrival: int, clock_s: float, idle: bool, add: Callable[[int], None]
) -> tuple[int, float]:
    """kvbench's engine clock (kvbench/engine.py), for a peer's loop: when idle, jump to the next
    arrival; then ``add(i)`` every request (in list order) that has arrived by this step boundary.
    Returns the next request to arrive and the clock."""
    if idle:
        clock_s = max(clock_s, requests[next_arrival].arrival_s)
    while next_arrival < len(requests) and requests[next_arrival].arrival_s <= clock_s:
        add(next_arrival)
        next_arrival += 1
    return next_arrival, clock_s
