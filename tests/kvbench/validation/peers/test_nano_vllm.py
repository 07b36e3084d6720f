"""kvbench.validation.peers.nano_vllm: nano-vllm's own scheduler, step by step, on cases worked by hand.

Every expected trace below follows nano-vllm's Scheduler.schedule/postprocess and BlockManager
(kvbench/validation/peers/_nanovllm) line by line; the comments give the reasoning.
"""

from __future__ import annotations

import itertools

import pytest

from kvbench.validation.peers import nano_vllm
from kvbench.validation.peers.types import PeerCaps, PeerRequest, PeerStep

pytestmark = pytest.mark.skipif(nano_vllm.unavailable_reason() is not None, reason=str(nano_vllm.unavailable_reason()))

BLOCK = 256  # the block size upstream nano-vllm takes (a multiple of 256)
STEP_S = 0.01

_fresh_token_ids = itertools.count(1000)


def request(rid: int, prompt_tokens: int, output_tokens: int, arrival_s: float = 0.0, token_ids=None) -> PeerRequest:
    """A request whose prompt shares no token with any other (unless token_ids says otherwise)."""
    if token_ids is None:
        token_ids = tuple(next(_fresh_token_ids) for _ in range(prompt_tokens))
    return PeerRequest(rid, prompt_tokens, output_tokens, arrival_s, tuple(token_ids))


def caps(num_blocks=16, max_num_seqs=8, max_num_batched_tokens=4096, **kwargs) -> PeerCaps:
    return PeerCaps(num_blocks, BLOCK, max_num_seqs, max_num_batched_tokens, step_s=STEP_S, **kwargs)


def step(scheduled, preempted=(), finished=()) -> PeerStep:
    return PeerStep(dict(scheduled), list(preempted), list(finished))


def test_version_and_availability():
    assert nano_vllm.unavailable_reason() is None
    assert nano_vllm.VERSION == "0.2.0 (bb823b3)"
    trace = nano_vllm.run([request(0, 10, 1)], caps())
    assert trace.engine == "nano-vllm 0.2.0 (bb823b3)"
    assert trace.steps == [step({0: 10}, finished=[0])]  # one output token: the prefill's


def test_max_num_seqs_caps_each_step_not_the_running_set():
    """Three running, max_num_seqs 2: the decode steps take the first two of the running queue
    until they finish; the third, prefilled a step later, waits."""
    trace = nano_vllm.run([request(0, 10, 3), request(1, 10, 3), request(2, 10, 3)], caps(max_num_seqs=2))
    assert trace.steps == [
        step({0: 10, 1: 10}),  # the prefill loop stops at max_num_seqs
        step({2: 10}),  # a waiting request that fits is prefilled before any decode: now 3 running
        step({0: 1, 1: 1}),  # decodes: 0 and 1 only, 2 is running and left out
        step({0: 1, 1: 1}, finished=[0, 1]),  # the decoded ones go back to the front of running
        step({2: 1}),
        step({2: 1}, finished=[2]),
    ]
    assert trace.blocks_used == [2, 3, 3, 1, 1, 0]


def test_only_the_first_prefill_of_a_step_is_chunked():
    """Budget 300: a 700-token prompt at the head is chunked 300, 300, 100 over three steps and
    holds all its 3 blocks from the first; the short prompt behind it fits in the last step's rest."""
    trace = nano_vllm.run([request(0, 700, 2), request(1, 50, 2)], caps(max_num_batched_tokens=300))
    assert trace.steps == [
        step({0: 300}),  # a partial chunk gets no token (postprocess skips it)
        step({0: 300}),
        step({0: 100, 1: 50}),
        step({0: 1, 1: 1}, finished=[0, 1]),
    ]
    assert trace.blocks_used == [3, 3, 4, 0]


def test_a_long_prompt_behind_another_waits_rather_than_filling_the_rest_of_the_budget():
    trace = nano_vllm.run([request(0, 50, 2), request(1, 700, 2)], caps(max_num_batched_tokens=300))
    assert trace.steps == [
        step({0: 50}),  # 250 tokens left, but 1 is not first in the step: not chunked, not admitted
        step({1: 300}),
        step({1: 300}),
        step({1: 100}),  # 0 has been running since step 0: a step with a prefill has no decodes
        step({0: 1, 1: 1}, finished=[0, 1]),
    ]


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_blocks_are_hashed_after_the_step(prefix_caching):
    """Three requests with one 600-token prompt (2 full blocks and a partial one). 0 and 1 are
    admitted in the same step: no block is hashed yet, so they share nothing. 2 arrives during
    step 0 and is admitted at step 1: it finds both full blocks (the last block is never looked up)
    and prefills the 88 tokens of its partial block."""
    prompt = tuple(range(600))
    requests = [request(0, 600, 2, 0.0, prompt), request(1, 600, 2, 0.0, prompt), request(2, 600, 2, 0.005, prompt)]
    trace = nano_vllm.run(requests, caps(prefix_caching=prefix_caching))
    new_tokens, blocks = (88, 7) if prefix_caching else (600, 9)
    assert trace.steps == [
        step({0: 600, 1: 600}),
        step({2: new_tokens}),
        step({0: 1, 1: 1, 2: 1}, finished=[0, 1, 2]),
    ]
    assert trace.blocks_used == [6, blocks, 0]


def test_a_fully_cached_prompt_recomputes_its_last_block():
    """512 tokens, 2 full blocks: only the first is looked up, so the second (256 tokens) is
    prefilled again."""
    prompt = tuple(range(512))
    requests = [request(0, 512, 3, 0.0, prompt), request(1, 512, 1, 0.005, prompt)]
    trace = nano_vllm.run(requests, caps(prefix_caching=True))
    assert trace.steps[1] == step({1: 256}, finished=[1])


def test_preemption_takes_the_last_of_running_and_puts_it_first_in_waiting():
    """4 blocks, three 256-token prompts (1 block each, every next token needs a new block). At the
    first decode 0 takes the free block; 1 needs one more: the last of running (2) is preempted and
    its block goes to 1. 2 waits at the head of the queue (it now needs 2 blocks for 257 tokens)
    until 0 and 1 finish, then prefills its prompt and its generated token again."""
    trace = nano_vllm.run([request(0, 256, 3), request(1, 256, 3), request(2, 256, 3)], caps(num_blocks=4))
    assert trace.steps == [
        step({0: 256, 1: 256, 2: 256}),
        step({0: 1, 1: 1}, preempted=[2]),
        step({0: 1, 1: 1}, finished=[0, 1]),  # 2 does not fit, so the step decodes
        step({2: 257}),
        step({2: 1}, finished=[2]),
    ]
    assert trace.blocks_used == [3, 4, 0, 2, 0]
    assert trace.num_preemptions() == 1


def test_a_request_preempting_itself_when_it_is_the_last_running():
    """3 blocks, two 256-token prompts: at the first decode 0 takes the last free block; 1 has no
    one behind it in running, so it preempts itself."""
    trace = nano_vllm.run([request(0, 256, 3), request(1, 256, 2)], caps(num_blocks=3))
    assert trace.steps[:3] == [
        step({0: 256, 1: 256}),
        step({0: 1}, preempted=[1]),
        step({0: 1}, finished=[0]),
    ]
    assert trace.steps[3:] == [step({1: 257}, finished=[1])]  # its second token comes from the new prefill


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_a_preempted_request_finds_its_own_freed_blocks(prefix_caching):
    """5 blocks; 0 and 1 have 256-token prompts, 2 a 400-token one (2 blocks, the first full and
    hashed after step 0). At the first decode 0 and 1 each need a block: 2 is preempted and frees
    its partial block, then its full one (deallocate goes in reverse); 1 takes the partial one. The
    full block keeps its hash while free, so 2's new prefill recomputes only 401 - 256 tokens."""
    requests = [request(0, 256, 3), request(1, 256, 3), request(2, 400, 3)]
    trace = nano_vllm.run(requests, caps(num_blocks=5, prefix_caching=prefix_caching))
    assert trace.steps == [
        step({0: 256, 1: 256, 2: 400}),
        step({0: 1, 1: 1}, preempted=[2]),
        step({0: 1, 1: 1}, finished=[0, 1]),
        step({2: 145 if prefix_caching else 401}),
        step({2: 1}, finished=[2]),
    ]


def test_arrivals_join_at_the_next_step_boundary_and_an_idle_engine_jumps_to_the_next():
    requests = [request(0, 10, 3, 0.0), request(1, 10, 2, 0.015), request(2, 10, 1, 0.5)]
    trace = nano_vllm.run(requests, caps())
    assert trace.steps == [
        step({0: 10}),  # clock 0.00
        step({0: 1}),  # 0.01: 1 has not arrived
        step({1: 10}),  # 0.02: 1 joins and is prefilled; 0 waits
        step({0: 1, 1: 1}, finished=[0, 1]),  # 0.03
        step({2: 10}, finished=[2]),  # idle at 0.04: the clock jumps to 0.5 (no empty steps)
    ]


def test_decode_takes_a_new_block_when_the_length_is_one_past_a_block():
    """allow_any_block_size: 16-token blocks. A 16-token prompt fills one block; the first decode
    (17 tokens) takes a second block and the next 15 decodes fit in it."""
    small = PeerCaps(num_blocks=4, block_size_tokens=16, max_num_seqs=8, max_num_batched_tokens=4096)
    trace = nano_vllm.run([request(0, 16, 18)], small, allow_any_block_size=True)
    assert trace.steps[0] == step({0: 16})
    assert trace.blocks_used[:2] == [1, 2]
    assert trace.blocks_used[16] == 2 and trace.blocks_used[-1] == 0
    assert trace.finish_steps() == {0: 17}  # the prefill's token and 17 decodes


def test_the_block_size_class_attribute_is_put_back():
    from kvbench.validation.peers._nanovllm.sequence import Sequence

    small = PeerCaps(num_blocks=4, block_size_tokens=16, max_num_seqs=8, max_num_batched_tokens=4096)
    nano_vllm.run([request(0, 16, 2)], small, allow_any_block_size=True)
    assert Sequence.block_size == 256


@pytest.mark.parametrize(
    ("requests", "peer_caps", "message"),
    [
        ([request(0, 10, 1)], caps(policy="priority"), "first come, first served"),
        ([request(0, 10, 1)], PeerCaps(8, 16, 8, 4096), "multiples of 256"),
        ([request(0, 10, 1)], caps(long_prefill_token_threshold=512), "long_prefill_token_threshold"),
        ([request(0, 600, 1)], caps(num_blocks=2), "needs 3 blocks"),
        ([request(0, 10, 1), request(0, 10, 1)], caps(), "unique"),
        ([request(0, 10, 0)], caps(), "output_tokens >= 1"),
        ([request(0, 700, 2)], caps(max_num_batched_tokens=300, chunked_prefill=False), "chunked request 0"),
    ],
)
def test_caps_nano_vllm_cannot_honour(requests, peer_caps, message):
    with pytest.raises(ValueError, match=message):
        nano_vllm.run(requests, peer_caps)


def test_one_token_blocks_are_refused_even_when_any_size_is_allowed():
    one = PeerCaps(num_blocks=64, block_size_tokens=1, max_num_seqs=8, max_num_batched_tokens=4096)
    with pytest.raises(ValueError, match="1-token blocks"):
        nano_vllm.run([request(0, 10, 2)], one, allow_any_block_size=True)


def test_chunked_prefill_off_holds_while_nothing_is_chunked():
    trace = nano_vllm.run([request(0, 300, 2)], caps(max_num_batched_tokens=300, chunked_prefill=False))
    assert trace.steps == [step({0: 300}), step({0: 1}, finished=[0])]
    # a threshold at or above the budget never binds
    assert nano_vllm.run([request(0, 300, 2)], caps(long_prefill_token_threshold=4096)).steps == trace.steps


def test_max_steps():
    with pytest.raises(RuntimeError, match="after 3 steps"):
        nano_vllm.run([request(0, 10, 10)], caps(), max_steps=3)
