"""Attention data parallelism: which of a deployment's requests one attention-DP rank serves.

Under attention data parallelism (``model.attention_dp = D``) each of D ranks runs its own batch
with its own KV cache, and the MoE layers between them see every rank's tokens. The router that
spreads requests over the ranks is SGLang's default ``--load-balance-method round_robin``: request
``i`` (in arrival order, which is also a closed-loop client's send order) goes to rank ``i mod D``.

kvbench simulates one rank, rank 0, and prices its MoE layers at D times its tokens
(:mod:`kvbench.exec.profiled`): the ranks are symmetric when their requests are alike, as under a
closed-loop client sending requests of equal lengths, which is how the public measurements were
taken. A closed-loop client of concurrency C keeps C requests in flight over all ranks; round
robin gives rank 0 ``ceil(C / D)`` of the first C, and keeps it near that share as requests finish.
What this leaves out: the imbalance between ranks a skewed workload would cause (a rank with longer
requests is the step's straggler, and every rank waits for it at the MoE layers).
"""

from __future__ import annotations

import dataclasses
import math

from kvbench.workload.source import Workload


def rank_share(workload: Workload, num_ranks: int, rank: int = 0) -> Workload:
    """The requests rank ``rank`` of ``num_ranks`` serves (every ``num_ranks``-th from ``rank``),
    with its share of a closed-loop client's concurrency; the workload itself when one rank."""
    if num_ranks == 1:
        return workload
    if not 0 <= rank < num_ranks:
        raise ValueError(f"rank {rank} is not one of {num_ranks} ranks")
    rows = slice(rank, None, num_ranks)
    branches = workload.branches()
    branch_outputs = None
    if workload.branch_output_tokens is not None:  # the flat branch column: pick each kept request's run
        starts = branches.cumsum() - branches
        kept = range(workload.num_requests)[rows]
        flat = workload.branch_output_tokens
        branch_outputs = flat[[i for r in kept for i in range(starts[r], starts[r] + branches[r])]]
    concurrency = workload.max_concurrency
    if concurrency is not None:
        concurrency = max(1, math.ceil((concurrency - rank) / num_ranks))
    return dataclasses.replace(
        workload,
        arrival_s=workload.arrival_s[rows],
        prompt_tokens=workload.prompt_tokens[rows],
        output_tokens=workload.output_tokens[rows],
        s_max_tokens=workload.s_max_tokens[rows],
        num_branches=None if workload.num_branches is None else workload.num_branches[rows],
        branch_output_tokens=branch_outputs,
        prefix_hashes=None if workload.prefix_hashes is None else workload.prefix_hashes[rows],
        priority=None if workload.priority is None else workload.priority[rows],
        max_concurrency=concurrency,
    )
