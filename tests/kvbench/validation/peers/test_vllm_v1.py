"""kvbench.validation.peers.vllm_v1: vLLM 0.33.0's own V1 scheduler, step by step, on cases worked by hand.

Every expected trace follows vllm/v1/core/sched/scheduler.py (Scheduler.schedule and
update_from_output) and vllm/v1/core/kv_cache_manager.py (allocate_slots) of vLLM 0.33.0; the
comments give the reasoning. Runs where tools/install_vllm_scheduler.sh made the venv.
"""

from __future__ import annotations

import itertools

import pytest

from kvbench.validation.peers import vllm_v1
from kvbench.validation.peers.types import PeerCaps, PeerRequest, PeerStep

pytestmark = pytest.mark.skipif(vllm_v1.unavailable_reason() is not None, reason=str(vllm_v1.unavailable_reason()))

BLOCK = 16
STEP_S = 0.01

_fresh_token_ids = itertools.count(1000)


def request(
    rid: int, prompt_tokens: int, output_tokens: int, arrival_s: float = 0.0, token_ids=None, priority: int = 0
) -> PeerRequest:
    """A request whose prompt shares no token with any other (unless token_ids says otherwise)."""
    if token_ids is None:
        token_ids = tuple(next(_fresh_token_ids) for _ in range(prompt_tokens))
    return PeerRequest(rid, prompt_tokens, output_tokens, arrival_s, tuple(token_ids), priority)


def caps(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=256, **kwargs) -> PeerCaps:
    return PeerCaps(num_blocks, BLOCK, max_num_seqs, max_num_batched_tokens, step_s=STEP_S, **kwargs)


def step(scheduled, preempted=(), finished=()) -> PeerStep:
    return PeerStep(dict(scheduled), list(preempted), list(finished))


def test_version_and_availability():
    assert vllm_v1.unavailable_reason() is None
    assert vllm_v1.VERSION == "0.33.0"
    trace = vllm_v1.run([request(0, 10, 1)], caps())
    assert trace.engine == "vllm 0.33.0"
    assert trace.steps == [step({0: 10}, finished=[0])]  # one output token: the prefill's
    assert trace.blocks_used == [1]  # held once scheduled; freed in update_from_output, the same step


@pytest.mark.parametrize("num_blocks", [3, 4])
def test_the_null_block_is_one_of_num_blocks(num_blocks):
    """Two 16-token prompts (1 block each), 2 outputs: the first decode of each needs a second
    block. 3 blocks leave 2 beside the null block: 0 needs a block, none is free, and the last of
    running (1) is preempted for it. 4 blocks leave 3: 0 takes the free one, 1 finds none and is
    itself the last of running, so it preempts itself. Either way 1 loses its block, no waiting
    request is admitted in a step that preempted, 0 finishes, and at the next step 1 is admitted
    again and computes its prompt and its generated token (17) at once, sampling its second token."""
    trace = vllm_v1.run([request(0, 16, 2), request(1, 16, 2)], caps(num_blocks=num_blocks))
    assert trace.steps == [
        step({0: 16, 1: 16}),
        step({0: 1}, preempted=[1], finished=[0]),
        step({1: 17}, finished=[1]),
    ]
    # blocks held once each step is scheduled (before its finished requests are freed): 0's two,
    # then 1's two for its 17 tokens
    assert trace.blocks_used == [2, 2, 2]


def test_one_block_more_than_the_usable_ones_needed_avoids_the_preemption():
    """5 blocks (4 usable): both first decodes get their second block."""
    trace = vllm_v1.run([request(0, 16, 2), request(1, 16, 2)], caps(num_blocks=5))
    assert trace.steps == [step({0: 16, 1: 16}), step({0: 1, 1: 1}, finished=[0, 1])]
    assert trace.blocks_used == [2, 4]


def test_admission_needs_blocks_for_the_whole_prompt():
    """scheduler_reserve_full_isl (on by default): 4 blocks (3 usable), a 32-token budget. 0 (16
    tokens) is admitted and leaves 2 blocks and 16 tokens of budget: enough for a first chunk of
    1's 48-token prompt (1 block), but 1 is admitted only once its whole prompt (3 blocks) fits."""
    trace = vllm_v1.run([request(0, 16, 3), request(1, 48, 1)], caps(num_blocks=4, max_num_batched_tokens=32))
    assert trace.steps == [
        step({0: 16}),
        step({0: 1}),  # 0's first decode takes its second block: 1 free
        step({0: 1}, finished=[0]),
        step({1: 32}),  # 3 blocks free: admitted, chunked at the budget
        step({1: 16}, finished=[1]),
    ]
    assert trace.blocks_used == [1, 2, 2, 2, 3]


def test_the_whole_prompt_check_reserves_nothing():
    """5 blocks (4 usable): now 1's whole prompt fits at step 0 and its first chunk takes the rest
    of the budget (16 tokens, 1 block). At step 1, 0's decode takes a block first (running is
    served in order), and 1's next chunk (31 tokens, up to 47: 2 more blocks) finds 1: 1 is the last
    of running and preempts itself. At step 2 its 48 tokens need 3 blocks and 2 are free."""
    trace = vllm_v1.run([request(0, 16, 3), request(1, 48, 1)], caps(num_blocks=5, max_num_batched_tokens=32))
    assert trace.steps == [
        step({0: 16, 1: 16}),
        step({0: 1}, preempted=[1]),
        step({0: 1}, finished=[0]),
        step({1: 32}),
        step({1: 16}, finished=[1]),
    ]
    assert trace.blocks_used == [2, 2, 2, 2, 3]  # step 1: 3 held until 1 preempts itself


@pytest.mark.parametrize("chunked_prefill", [False, True])
def test_without_chunking_decodes_take_the_budget_first(chunked_prefill):
    """Budget 32. Two requests decode (1 token each); 2's 31-token prompt arrives at step 2 and finds
    30 tokens of budget. vLLM serves no prompt as long as max_model_len (its input processor
    refuses it: the output needs a slot) and, chunking off, refuses max_model_len above the budget:
    a prompt of budget - 1 tokens is the longest it can run, so two decodes are needed to make it
    wait. Chunked, it takes the 30 tokens left at once."""
    requests = [request(0, 8, 4), request(1, 8, 4), request(2, 31, 1, arrival_s=0.015)]
    trace = vllm_v1.run(requests, caps(max_num_batched_tokens=32, chunked_prefill=chunked_prefill))
    if chunked_prefill:
        assert trace.steps == [
            step({0: 8, 1: 8}),
            step({0: 1, 1: 1}),
            step({0: 1, 1: 1, 2: 30}),
            step({0: 1, 1: 1, 2: 1}, finished=[0, 1, 2]),
        ]
    else:
        assert trace.steps == [
            step({0: 8, 1: 8}),
            step({0: 1, 1: 1}),  # clock 0.01: 2 has not arrived
            step({0: 1, 1: 1}),  # 31 > 30 tokens left: 2 waits
            step({0: 1, 1: 1}, finished=[0, 1]),  # still 30 left when the step is scheduled
            step({2: 31}, finished=[2]),
        ]


def test_without_chunking_a_request_longer_than_the_budget_is_refused():
    with pytest.raises(ValueError, match="max_num_batched_tokens >= max_model_len"):
        vllm_v1.run([request(0, 32, 1)], caps(max_num_batched_tokens=32, chunked_prefill=False))


def test_long_prefill_token_threshold_caps_chunks_of_waiting_and_running_requests():
    """Threshold 16, budget 256: 0's 40-token prompt goes 16, 16, 8 (the cap holds for the running
    chunk too); 1's 8 tokens are under it."""
    trace = vllm_v1.run([request(0, 40, 1), request(1, 8, 3)], caps(long_prefill_token_threshold=16))
    assert trace.steps == [
        step({0: 16, 1: 8}),
        step({0: 16, 1: 1}),
        step({0: 8, 1: 1}, finished=[0, 1]),
    ]


def test_long_prefill_token_threshold_is_off_for_the_only_request():
    """The cap is taken only while more than one request is running or waiting."""
    assert vllm_v1.run([request(0, 40, 1)], caps(long_prefill_token_threshold=16)).steps == [
        step({0: 40}, finished=[0])
    ]
    # 1 finishes at step 0, so at step 1 0 is alone and takes its remaining 24 tokens at once
    trace = vllm_v1.run([request(0, 40, 1), request(1, 8, 1)], caps(long_prefill_token_threshold=16))
    assert trace.steps == [step({0: 16, 1: 8}, finished=[1]), step({0: 24}, finished=[0])]


def test_arrivals_join_at_the_step_boundary_and_an_idle_engine_jumps_to_the_next():
    requests = [
        request(0, 8, 2, 0.0),
        request(1, 8, 1, 0.01),  # exactly at step 1's boundary
        request(2, 8, 2, 1.0),
        request(3, 8, 1, 1.005),  # between two boundaries: the next one (1.01)
    ]
    trace = vllm_v1.run(requests, caps())
    assert trace.steps == [
        step({0: 8}),  # clock 0.00
        step({0: 1, 1: 8}, finished=[0, 1]),  # 0.01
        step({2: 8}),  # idle at 0.02: the clock jumps to 1.0 (no empty steps)
        step({2: 1, 3: 8}, finished=[2, 3]),  # 1.01
    ]


def test_priority_preempts_the_lowest_priority_even_if_already_scheduled():
    """3 blocks (2 usable). 0 (priority 1) runs first; 1 (priority 0) joins at step 1. At step 2,
    0's decode fits in its block and is scheduled; 1's needs a second block and none is free. The
    victim is the running request with the largest (priority, arrival): 0, already scheduled, is
    taken back and preempted, and 1 gets its block. First come, first served takes the last of
    running instead: 1 itself."""
    requests = [request(0, 14, 4, 0.0, priority=1), request(1, 16, 2, 0.01, priority=0)]
    priority = vllm_v1.run(requests, caps(num_blocks=3, policy="priority"))
    assert priority.steps == [
        step({0: 14}),
        step({0: 1, 1: 16}),
        step({1: 1}, preempted=[0], finished=[1]),
        step({0: 16}),  # its prompt and 2 generated tokens, sampling its third
        step({0: 1}, finished=[0]),
    ]
    assert priority.blocks_used == [1, 2, 2, 1, 2]
    fcfs = vllm_v1.run(requests, caps(num_blocks=3, policy="fcfs"))
    assert fcfs.steps == [
        step({0: 14}),
        step({0: 1, 1: 16}),
        step({0: 1}, preempted=[1]),
        step({0: 1}, finished=[0]),  # 1 needs 2 blocks for 17 tokens; 0 took the one it freed
        step({1: 17}, finished=[1]),
    ]


def test_requests_of_one_arrival_are_stamped_in_row_order():
    """Two 16-token prompts with the same priority and arrival, 3 blocks (2 usable), as in
    test_the_null_block_is_one_of_num_blocks. vLLM's priority victim is the largest (priority,
    arrival_time), the first running of equal ones: with one stamp for both it would be 0, which
    preempts itself. A server stamps them as they come, the second after the first, so the victim
    is 1, as kvbench's lowest_priority victim takes the later row."""
    trace = vllm_v1.run([request(0, 16, 2), request(1, 16, 2)], caps(num_blocks=3, policy="priority"))
    assert trace.steps == [
        step({0: 16, 1: 16}),
        step({0: 1}, preempted=[1], finished=[0]),
        step({1: 17}, finished=[1]),
    ]


def test_prefix_cache_hits_whole_blocks_short_of_the_last_token():
    """0's 48-token prompt fills 3 blocks. 1 shares its first 32 tokens: 2 blocks hit, 8 tokens
    computed. 2 is the same 48 tokens: the hit stops short of the last token (it must be computed to
    sample), and hits are whole blocks, so 32 tokens hit and 16 are computed again."""
    shared = tuple(range(32))
    requests = [
        request(0, 48, 3, 0.0, shared + tuple(range(100, 116))),
        request(1, 40, 1, 0.01, shared + tuple(range(200, 208))),
        request(2, 48, 1, 0.01, shared + tuple(range(100, 116))),
    ]
    trace = vllm_v1.run(requests, caps(prefix_caching=True))
    assert trace.steps == [
        step({0: 48}),
        step({0: 1, 1: 8, 2: 16}, finished=[1, 2]),
        step({0: 1}, finished=[0]),
    ]
    # step 1: 0 holds 4 (its first decode took one), 1 and 2 one of their own each (the hits are
    # 0's); after it they have finished and freed theirs, and step 2 holds 0's 4
    assert trace.blocks_used == [3, 6, 4]


def test_requests_must_fit_the_pool():
    """A request whose prompt and output (less the last token) need more blocks than the pool has
    beside the null block would never finish."""
    with pytest.raises(ValueError, match="needs 3 blocks"):
        vllm_v1.run([request(0, 32, 2)], caps(num_blocks=3))


def test_max_num_seqs_caps_the_running_set():
    """max_num_seqs 2: 2 waits while 0 and 1 run (even with budget and blocks to spare), and joins
    the step after they finish (their slots free in update_from_output)."""
    trace = vllm_v1.run([request(0, 8, 2), request(1, 8, 2), request(2, 8, 2)], caps(max_num_seqs=2))
    assert trace.steps == [
        step({0: 8, 1: 8}),
        step({0: 1, 1: 1}, finished=[0, 1]),
        step({2: 8}),
        step({2: 1}, finished=[2]),
    ]


def test_long_prefill_token_threshold_chunks_even_with_chunked_prefill_off():
    """The waiting loop caps the prompt at the threshold before it checks, chunking off, that the
    prompt fits the budget: the capped chunk fits, so the prompt is chunked all the same."""
    requests = [request(0, 40, 1), request(1, 8, 3)]
    trace = vllm_v1.run(
        requests, caps(max_num_batched_tokens=64, chunked_prefill=False, long_prefill_token_threshold=16)
    )
    assert trace.steps == [
        step({0: 16, 1: 8}),
        step({0: 16, 1: 1}),
        step({0: 8, 1: 1}, finished=[0, 1]),
    ]


def test_priority_ties_break_on_arrival_then_on_the_request_id_in_numeric_order():
    """Request.__lt__ orders the priority queue by (priority, arrival_time, request_id); the ids
    are strings, which the driver zero-pads so that 9 comes before 10 (kvbench's order), not
    "10" before "9". max_num_seqs 1 lets one in at a time."""
    requests = [request(9, 8, 1), request(10, 8, 1), request(11, 8, 1, arrival_s=0.0, priority=-1)]
    trace = vllm_v1.run(requests, caps(max_num_seqs=1, policy="priority"))
    assert trace.steps == [
        step({11: 8}, finished=[11]),
        step({9: 8}, finished=[9]),
        step({10: 8}, finished=[10]),
    ]


def test_max_steps_stops_a_run():
    with pytest.raises(RuntimeError, match="0 of 1 requests finished after 1 steps"):
        vllm_v1.run([request(0, 8, 2)], caps(), max_steps=1)
