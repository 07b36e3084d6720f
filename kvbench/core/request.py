"""Requests: what a workload asks for, immutable once the run starts."""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.workload.source import Workload


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the workload: when it arrives, how long it is, how many completions it wants.

    ``branch_output_tokens`` holds each branch's length: one entry for an ordinary request, ``n``
    for parallel sampling or a beam search of width ``n``, whose branches share the prompt and fork
    after its prefill. A beam search (``beam_fork_probability > 0``) also re-forks its beams as it
    goes: after each step, each beam is replaced with that probability by a copy of another beam
    (kvbench has no token model, so which beams survive is drawn from ``seed``).
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    s_max_tokens: int  #: the declared S_max: prompt + output of every branch stays within it
    branch_output_tokens: tuple[int, ...]
    beam_fork_probability: float = 0.0
    seed: int = 0
    #: one id per granule of ``hash_block_tokens`` prompt tokens, chained over the prefix (see
    #: :mod:`kvbench.core.prefix`); () when the workload says nothing of content: nothing is shared
    prefix_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 0
    #: the scheduler's priority queue runs lower values first (vLLM's convention); 0 for all by default
    priority: int = 0

    @property
    def num_branches(self) -> int:
        return len(self.branch_output_tokens)

    @property
    def max_output_tokens(self) -> int:
        """The longest branch: the request runs until it has emitted this many tokens."""
        return max(self.branch_output_tokens)

    @property
    def final_kv_tokens(self) -> int:
        """KV slots its longest branch holds when it finishes (its last token is never fed back)."""
        return self.prompt_tokens + self.max_output_tokens - 1


def requests_from_workload(workload: Workload, seed: int = 0) -> list[Request]:
    """The workload's rows as requests, in arrival order (``request_id`` = row); ``seed`` (the
    run's) seeds each beam search's draws together with its request id."""
    branches = workload.branch_output_tokens_per_request()
    beam = workload.beam_fork_probability
    hashes = workload.prefix_hashes or [()] * workload.num_requests
    granule = workload.hash_block_tokens if workload.prefix_hashes else 0
    priorities = workload.priority.tolist() if workload.priority is not None else [0] * workload.num_requests
    return [
        Request(i, arrival_s, prompt, s_max, outputs, beam, seed, tuple(prefix), granule, priority)
        for i, (arrival_s, prompt, s_max, outputs, prefix, priority) in enumerate(
            zip(
                workload.arrival_s.tolist(),
                workload.prompt_tokens.tolist(),
                workload.s_max_tokens.tolist(),
                branches,
                hashes,
                priorities,
            )
        )
    ]
