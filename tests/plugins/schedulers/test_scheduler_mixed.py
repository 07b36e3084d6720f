"""``mixed``: each step decodes every running sequence and admits new prompts into the same step.

Scenarios run on the toy machine (see tests/toy.py for its hand-checkable step times).
"""

from __future__ import annotations

import pluggy
import pytest
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.schedulers import mixed
from kvbench_plugins.schedulers.mixed import MixedScheduler
from toy import decode_s, paged, prefill_s, request

from kvbench import hookspecs
from kvbench.errors import ConfigError


def test_kvbench_register_schedulers_registers_the_four_builtins():
    from kvbench_plugins.schedulers import chunked, prefill_first, static

    pm = pluggy.PluginManager("kvbench")
    pm.add_hookspecs(hookspecs)
    for module in (mixed, prefill_first, chunked, static):
        pm.register(module)
    names = sorted(cls.name for classes in pm.hook.kvbench_register_schedulers() for cls in classes)
    assert names == ["chunked", "mixed", "prefill_first", "static"]


@pytest.fixture
def preempted(toy_run):
    # A: 8 + 4 tokens; B: 8 + 12; both at t = 0; 3 blocks of 8 tokens. Step 0 admits both (a block
    # each); at step 1 A takes the last block for its 9th slot and B, needing one too, is the newest:
    # it preempts itself (recompute). Nobody is admitted in a step that preempted (as vLLM); at
    # steps 2 and 3 B is refused readmission until A finishes.
    return toy_run(MixedScheduler, RecomputePolicy, paged(24), [request(0, 8, 4), request(1, 8, 12)])


def test_steps_batch_contents_and_the_victim(preempted):
    plans = preempted.plans
    assert [len(p.prefills) for p in plans[:2]] == [2, 0]
    [(victim, kv_tokens, mechanism, fell_back, swap_out_bytes)] = plans[1].preemptions
    assert (victim.request_id, kv_tokens, mechanism, fell_back, swap_out_bytes) == (1, 8, "recompute", False, 0)
    assert [s.group.request_id for s in plans[1].decodes] == [0]
    assert plans[1].refusal is None
    assert [s.group.request_id for s in plans[2].decodes] == [0]  # steps 2 and 3: A alone
    assert plans[2].refusal.group.request_id == 1 and plans[2].refusal.reason.value == "no_memory"
    [chunk] = plans[4].prefills  # step 4: B readmitted with its prompt and its one generated token
    assert (
        chunk.seq.group.request_id,
        chunk.num_new_tokens,
        chunk.num_context_tokens,
        chunk.num_recomputed_tokens,
    ) == (1, 9, 0, 8)
    assert len(plans) == 15  # steps 0..14


def test_time_charged_to_each_step(preempted):
    r = preempted.row
    assert r(0)["duration_s"] == 2 * prefill_s(8) == 10.048
    assert r(1)["duration_s"] == decode_s(9)  # B was evicted before the step ran: only A decodes
    assert r(2)["num_steps"] == 2 and r(2)["duration_s"] == pytest.approx(decode_s(10) + decode_s(11))
    assert r(4)["duration_s"] == prefill_s(9) and r(4)["recompute_s"] == pytest.approx(prefill_s(9) * 8 / 9)
    assert r(5)["num_steps"] == 10  # B decodes alone until it finishes: one row, one new block inside it
    assert r(5)["duration_s"] == pytest.approx(sum(decode_s(kv) for kv in range(10, 20)))
    assert [row["saturated"] for row in map(r, (0, 1, 2, 4, 5))] == [False, True, True, False, False]


def test_requests_keep_their_tokens_and_count_the_recompute(preempted):
    a, b = preempted.request(0), preempted.request(1)
    assert a["finish_s"] == pytest.approx(2 * prefill_s(8) + decode_s(9) + decode_s(10) + decode_s(11))
    assert b["first_token_s"] == 2 * prefill_s(8)  # its first token stands: preemption loses cache, not tokens
    assert b["finish_s"] == pytest.approx(a["finish_s"] + prefill_s(9) + sum(decode_s(kv) for kv in range(10, 20)))
    assert (b["num_generated"], b["num_preemptions"], b["num_recompute_preemptions"]) == (12, 1, 1)
    assert (b["num_recomputed_tokens"], b["num_computed_tokens"]) == (8, 8 + 9 + 10)
    assert (a["num_preemptions"], a["num_computed_tokens"]) == (0, 8 + 3)


def test_a_long_prompt_stalls_the_decodes_it_is_batched_with(toy_run):
    # B (16 tokens) arrives while A decodes: mixed batching runs B's prefill and A's decode in one step
    run = toy_run(MixedScheduler, RecomputePolicy, paged(64), [request(0, 8, 3), request(1, 16, 1, arrival_s=1.0)])
    assert run.row(1)["duration_s"] == pytest.approx(prefill_s(16) + decode_s(9))
    assert run.request(0)["finish_s"] == pytest.approx(prefill_s(8) + prefill_s(16) + decode_s(9) + decode_s(10))


@pytest.mark.parametrize("decodes_in_budget", [False, True])
def test_decodes_in_the_budget_need_a_budget_that_covers_every_running_decode(decodes_in_budget):
    def build():
        return MixedScheduler(
            MixedScheduler.Config(max_num_seqs=16, max_num_batched_tokens=8, decodes_in_budget=decodes_in_budget),
            allocator=paged(64),
            policy=RecomputePolicy(),
            cost=None,
            host_pool=None,
        )

    if not decodes_in_budget:  # decodes outside the budget: a budget under the batch cap is fine
        assert build().config.max_num_batched_tokens == 8
        return
    with pytest.raises(ConfigError, match="max_num_batched_tokens=8 is invalid: decodes_in_budget needs at least"):
        build()
