"""``chunked``: one token budget per step, shared by decodes and prompt chunks."""

from __future__ import annotations

import pytest
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.schedulers.chunked import ChunkedScheduler
from toy import decode_s, paged, prefill_s, request

from kvbench.errors import ConfigError


def test_a_prompt_is_split_at_the_budget_and_each_chunk_attends_to_what_came_before(toy_run):
    # budget 6 tokens: A's 8-token prompt takes steps 0 (6) and 1 (2, over 6 cached); B's 4-token
    # prompt fits the 4 tokens left in step 1; step 2 decodes both
    run = toy_run(
        ChunkedScheduler,
        RecomputePolicy,
        paged(64),
        [request(0, 8, 2), request(1, 4, 2)],
        max_num_batched_tokens=6,
        max_num_seqs=4,
    )
    chunks = [[(c.seq.group.request_id, c.num_new_tokens, c.num_context_tokens) for c in p.prefills] for p in run.plans]
    assert chunks == [[(0, 6, 0)], [(0, 2, 6), (1, 4, 0)], []]
    durations = run.record.steps["duration_s"].tolist()
    assert durations == pytest.approx([prefill_s(6), prefill_s(2, 6) + prefill_s(4), decode_s(9 + 5)])
    assert run.request(0)["first_token_s"] == run.request(1)["first_token_s"] == pytest.approx(sum(durations[:2]))


def test_decodes_go_first_and_a_chunk_takes_what_they_leave(toy_run):
    # A decodes while B's 20-token prompt arrives: each step spends 1 token on A's decode, 7 on B
    run = toy_run(
        ChunkedScheduler,
        RecomputePolicy,
        paged(64),
        [request(0, 4, 6), request(1, 20, 1, arrival_s=0.1)],
        max_num_batched_tokens=8,
        max_num_seqs=2,
    )
    b_chunks = [c.num_new_tokens for p in run.plans for c in p.prefills if c.seq.group.request_id == 1]
    assert b_chunks == [7, 7, 6]
    assert all(len(p.decodes) == 1 for p in run.plans[1:4])


def test_the_budget_must_cover_every_running_decode():
    with pytest.raises(
        ConfigError, match="scheduler.max_num_batched_tokens=8 is invalid: chunked prefill needs at least"
    ):
        ChunkedScheduler(
            ChunkedScheduler.Config(max_num_seqs=16, max_num_batched_tokens=8),
            allocator=paged(64),
            policy=RecomputePolicy(),
            cost=None,
            host_pool=None,
        )
