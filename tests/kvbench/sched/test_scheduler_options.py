"""The scheduler's semantic options (the ones the engine presets bundle), each on a case small
enough to check by hand. Toy machine: 8-token blocks (tests/support/toy.py)."""

from __future__ import annotations

import pytest
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.schedulers.chunked import ChunkedScheduler
from kvbench_plugins.schedulers.mixed import MixedScheduler
from kvbench_plugins.schedulers.prefill_first import PrefillFirstScheduler
from toy import paged, request, scheduled

from kvbench.errors import ConfigError
from kvbench.sched.queue import PriorityQueue, ShortestPromptQueue


@pytest.fixture
def steps_of(toy_run):
    """``steps_of(scheduler, budget_tokens, requests, **options)``: each step's tokens per request
    of a recompute run of ``requests`` on ``budget_tokens`` of paged KV (the cases below vary the
    scheduler and its options, never the policy or the allocator)."""

    def steps(scheduler, budget_tokens, requests, **options) -> list[dict[int, int]]:
        return scheduled(toy_run(scheduler, RecomputePolicy, paged(budget_tokens), requests, **options))

    return steps


@pytest.mark.parametrize("full", [False, True])
def test_whole_prompt_admission_checks_every_block_of_the_prompt(steps_of, full):
    # 4 blocks of 8. A (prompt 8, output 9) runs; B's 24-token prompt needs 3 blocks, its first
    # 8-token chunk 1. Step 1: A decodes (its 2nd block), 2 blocks are left: the first chunk fits,
    # the whole prompt does not
    steps = steps_of(
        ChunkedScheduler,
        32,
        [request(0, 8, 9), request(1, 24, 1, arrival_s=0.001)],
        max_num_batched_tokens=9,
        max_num_seqs=2,
        full_prompt_admission=full,
    )
    assert steps[0] == {0: 8}
    if full:
        # B waits until A finishes (step 9 ends A: 9 tokens), then runs its prompt in chunks
        assert all(1 not in s for s in steps[:9])
        assert steps[9] == {1: 9}
    else:
        assert steps[1] == {0: 1, 1: 8}


def test_the_watermark_in_whole_blocks_rounds_down_as_vllm():
    alloc = paged(8 * 150)  # 150 blocks
    policy = RecomputePolicy()
    make = lambda blocks: ChunkedScheduler(  # noqa: E731
        ChunkedScheduler.Config(watermark_fraction=0.01, watermark_in_blocks=blocks, max_num_seqs=8),
        allocator=alloc,
        policy=policy,
        cost=None,
        host_pool=None,
    )
    block_bytes = alloc.block_size_tokens * alloc.kv_bytes_per_token
    assert make(True).watermark_bytes == 1 * block_bytes  # int(0.01 x 150) = 1 block
    assert make(False).watermark_bytes == int(0.01 * alloc.budget_bytes)  # 1.5 blocks of bytes


def test_a_long_prefill_is_capped_only_while_others_compete(steps_of):
    # threshold 4: A alone (step 0) takes the whole 16-token budget; from step 1, B waits and A is
    # capped at 4 a step, and B's chunks too
    steps = steps_of(
        ChunkedScheduler,
        256,
        [request(0, 40, 1), request(1, 6, 1, arrival_s=0.001)],
        max_num_batched_tokens=16,
        max_num_seqs=2,
        long_prefill_token_threshold=4,
    )
    assert steps[0] == {0: 16}
    assert steps[1] == {0: 4, 1: 4}
    assert steps[2] == {0: 4, 1: 2}


def test_decodes_in_budget_leave_a_prompt_that_no_longer_fits_waiting(steps_of):
    # budget 8: A decodes (1 token) while B's 8-token prompt arrives. Without the option B runs
    # beside A's decode; with it the decode leaves 7, so B waits until A finishes
    for strict, b_step in ((False, 1), (True, 3)):
        steps = steps_of(
            MixedScheduler,
            256,
            [request(0, 4, 3), request(1, 8, 1, arrival_s=0.001)],
            max_num_batched_tokens=8,
            max_num_seqs=2,
            decodes_in_budget=strict,
        )
        assert [i for i, s in enumerate(steps) if s.get(1) == 8] == [b_step]


def test_decodes_in_budget_refuses_a_request_that_could_never_be_admitted(toy_run):
    with pytest.raises(ConfigError, match="can never be admitted whole within scheduler.max_num_batched_tokens=8"):
        toy_run(
            MixedScheduler,
            RecomputePolicy,
            paged(256),
            [request(0, 7, 3)],  # readmitted after 2 tokens: 9 tokens in one step
            max_num_batched_tokens=8,
            max_num_seqs=2,
            decodes_in_budget=True,
        )


def test_the_per_step_cap_decodes_the_first_sequences_and_lets_the_rest_wait(steps_of):
    # cap 2 per step, nothing caps the running set: three prompts are admitted over two prefill
    # steps (2, then 1), and decode steps run the first two until they finish
    steps = steps_of(
        PrefillFirstScheduler,
        256,
        [request(0, 4, 3), request(1, 4, 3), request(2, 4, 2)],
        max_num_batched_tokens=64,
        max_num_seqs=2,
        step_seq_cap=True,
    )
    assert steps[:5] == [{0: 4, 1: 4}, {2: 4}, {0: 1, 1: 1}, {0: 1, 1: 1}, {2: 1}]


def test_head_only_chunking_chunks_the_steps_first_prompt_over_several_steps(steps_of):
    # budget 10: A's 25-token prompt goes 10, 10, 5; B (4 tokens) joins the step of A's last chunk
    # (it fits what is left, whole), C (8) does not and waits for the next prefill step
    steps = steps_of(
        PrefillFirstScheduler,
        256,
        [request(0, 25, 2), request(1, 4, 2), request(2, 8, 2)],
        max_num_batched_tokens=10,
        max_num_seqs=8,
        head_only_chunking=True,
        decodes_in_budget=True,
    )
    assert steps[:4] == [{0: 10}, {0: 10}, {0: 5, 1: 4}, {2: 8}]


def test_the_priority_queue_admits_the_lowest_priority_value_first(toy_run):
    # one sequence at a time: arrivals 0, 1, 2 with priorities 2, 0, 1 -> A first (alone), then B, then C
    run = toy_run(
        MixedScheduler,
        RecomputePolicy,
        paged(256),
        [request(0, 4, 2, priority=2), request(1, 4, 2, priority=0, arrival_s=0.0), request(2, 4, 2, priority=1)],
        max_num_seqs=1,
        queue=PriorityQueue(),
    )
    first = [next(iter(s)) for s in scheduled(run) if any(n == 4 for n in s.values())]
    assert first == [1, 2, 0]


def test_the_shortest_prompt_queue_overtakes_a_long_head(toy_run):
    run = toy_run(
        MixedScheduler,
        RecomputePolicy,
        paged(256),
        [request(0, 30, 2), request(1, 5, 2), request(2, 12, 2)],
        max_num_seqs=1,
        queue=ShortestPromptQueue(),
    )
    first = [k for s in scheduled(run) for k, n in s.items() if n > 1]
    assert first == [1, 2, 0]


@pytest.mark.parametrize("queue_class", [PriorityQueue, ShortestPromptQueue])
def test_an_arrival_that_may_overtake_ends_a_run_of_quiet_steps(toy_run, queue_class):
    # 6 blocks of 8. A (prompt 8) decodes 40 tokens in one long quiet run (its prefill ends at 5 s,
    # each decode takes about 0.7 s); B (41 tokens: 6 blocks) waits, refused, for A to finish. C (2
    # tokens, first in either queue) arrives at 8 s: it is admitted at the next step boundary,
    # ahead of the refused B, so the event-driven run must stop there too
    requests = [request(0, 8, 40), request(1, 41, 4, priority=5), request(2, 2, 2, priority=0, arrival_s=8.0)]
    runs = [
        toy_run(
            MixedScheduler, RecomputePolicy, paged(48), requests, max_num_seqs=2, queue=queue_class(), event_driven=e
        )
        for e in (False, True)
    ]
    step_by_step, event_driven = (run.request(2) for run in runs)
    assert step_by_step["admitted_s"] < runs[0].request(0)["finish_s"]  # C overtook B, while A ran
    assert event_driven["admitted_s"] == step_by_step["admitted_s"]
    assert runs[0].record.requests.equals(runs[1].record.requests)


@pytest.mark.parametrize("generated", [False, True])
def test_a_preempted_request_finds_its_own_blocks_again_when_every_full_block_is_cached(toy_run, generated):
    # 5 blocks of 8, prefix caching on, prompts without prefix hashes. A and B (8 + 16) each take
    # a 3rd block at their 17th token: A takes the last free one, B (the newest) is preempted with
    # 16 KV tokens in 2 full blocks. With cache_generated_blocks those blocks keep B's own keys:
    # readmitted when A finishes, B reuses both (16 tokens served back, not prompt hits) and
    # computes 1; without, it computes all 17 again
    from kvbench_plugins.allocators.paged import PagedAllocator, PagedConfig
    from toy import TOY_KV_BYTES

    alloc = PagedAllocator(
        PagedConfig(8, True, generated), budget_bytes=40 * TOY_KV_BYTES, kv_bytes_per_token=TOY_KV_BYTES
    )
    run = toy_run(MixedScheduler, RecomputePolicy, alloc, [request(0, 8, 16), request(1, 8, 16)])
    b = run.request(1)
    assert b["num_preemptions"] == 1 and b["cached_prompt_tokens"] == 0
    assert (b["recompute_cached_tokens"], b["num_recomputed_tokens"]) == ((16, 0) if generated else (0, 16))
    assert b["num_computed_tokens"] == (23 if generated else 39)  # 8 + 15 decodes (+ 16 recomputed)


def test_caching_generated_blocks_needs_prefix_caching():
    from kvbench.api import build

    with pytest.raises(
        ConfigError,
        match="allocator.cache_generated_blocks=True is invalid: use true with allocator.prefix_caching=true",
    ):
        build(["allocator.cache_generated_blocks=true"])
