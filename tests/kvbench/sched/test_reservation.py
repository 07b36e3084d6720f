"""Admission against the output running requests will still write (kvbench.sched.reservation):
SGLang's new-token ratio with its prefill/decode alternation, and TRT-LLM's GUARANTEED_NO_EVICT
capacity rule with its max_num_tokens. Neither engine's scheduler runs on a CPU, so each case is
a schedule worked out by hand from their source (SGLang's schedule_policy.py / scheduler.py,
TRT-LLM's capacityScheduler.cpp / microBatchScheduler.cpp; docs/schedulers.md names the versions). Toy machine: tests/support/toy.py;
1-token blocks where the arithmetic is SGLang's (it pages one token at a time)."""

from __future__ import annotations

import pytest
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.schedulers.mixed import MixedScheduler
from kvbench_plugins.schedulers.prefill_first import PrefillFirstScheduler
from toy import paged, request, scheduled

from kvbench.errors import ConfigError
from kvbench.memory.allocator import SeqShape
from kvbench.sched.options import SchedulerConfig

SGLANG = dict(chunked_prefill=True, admission_reserve="new_token_ratio")
TRTLLM = dict(decodes_in_budget=True, admission_reserve="full_output", max_num_seqs=8)
#: SGLang's default fall per decode step: (0.7 - 0.7 x 0.14) / 600
DECAY = (0.7 - 0.7 * 0.14) / 600


def assert_every_request_finished(run, requests) -> None:
    done = run.record.requests.set_index("request_id")
    assert sorted(done.index) == [r.request_id for r in requests]
    assert (done["finish_s"] > 0).all()
    for r in requests:  # prompt and every output token computed: nobody lost
        assert done.loc[r.request_id, "output_tokens"] == r.max_output_tokens


# --- SGLang ---------------------------------------------------------------------------------------


def test_sglang_never_mixes_prefill_and_decode_a_new_prompt_stalls_the_decodes(toy_run):
    # A (8 + 5) runs; B (8 + 3) arrives during A's prefill. Step 1 prefills B alone while A waits
    # (vLLM's budget would run A's decode beside it), then both decode
    requests = [request(0, 8, 5), request(1, 8, 3, arrival_s=0.001)]
    run = toy_run(PrefillFirstScheduler, RecomputePolicy, paged(256), requests, max_num_batched_tokens=64, **SGLANG)
    steps = scheduled(run)
    assert steps[:4] == [{0: 8}, {1: 8}, {0: 1, 1: 1}, {0: 1, 1: 1}]
    assert all(not (plan.prefills and plan.decodes) for plan in run.plans)
    assert_every_request_finished(run, requests)


def test_sglang_chunks_whichever_prompt_overflows_the_budget_not_only_the_first(toy_run):
    # budget 10: A's 25-token prompt goes 10, 10, 5; B (4) joins A's last chunk whole and C (8)
    # takes the 1 token left, continuing alone at the next prefill step (nano-vllm's head-only
    # chunking would leave C waiting); only then do the three decode
    requests = [request(0, 25, 2), request(1, 4, 2), request(2, 8, 2)]
    run = toy_run(PrefillFirstScheduler, RecomputePolicy, paged(256), requests, max_num_batched_tokens=10, **SGLANG)
    assert scheduled(run) == [{0: 10}, {0: 10}, {0: 5, 1: 4, 2: 1}, {2: 7}, {0: 1, 1: 1, 2: 1}]
    assert_every_request_finished(run, requests)


@pytest.mark.parametrize(("b_output", "admitted_at"), [(35, 1), (36, 50)])
def test_the_new_token_ratio_blocks_admission_exactly_when_the_reservation_exceeds_free_kv(
    toy_run, b_output, admitted_at
):
    # 100 one-token blocks. A (10 + 50) prefills at step 0 and holds 10. At step 1 A reserves
    # 0.7 x 49 = 34.3 tokens of output, leaving 90 - 34.3 = 55.7: B (20 + 35 = 55) is admitted,
    # B (20 + 36 = 56) is not (SGLang refuses at >=). Each decode step then takes 1 token and frees
    # only ~0.7 of reservation, so the larger B waits until A's 50th token (step 49) frees A
    requests = [request(0, 10, 50), request(1, 20, b_output, arrival_s=0.001)]
    run = toy_run(PrefillFirstScheduler, RecomputePolicy, paged(100, 1), requests, max_num_batched_tokens=64, **SGLANG)
    steps = scheduled(run)
    assert [i for i, s in enumerate(steps) if s.get(1) == 20] == [admitted_at]
    assert all(1 not in s for s in steps[:admitted_at])
    assert run.engine.scheduler.new_token_ratio == pytest.approx(0.7 - (len(steps) - 2) * DECAY)
    assert_every_request_finished(run, requests)


def test_the_ratio_falls_alike_step_by_step_and_over_projected_runs_of_decode_steps(toy_run):
    requests = [request(0, 10, 50), request(1, 20, 36, arrival_s=0.001), request(2, 5, 700, arrival_s=0.002)]
    runs = [
        toy_run(
            PrefillFirstScheduler,
            RecomputePolicy,
            paged(1000, 1),
            requests,
            max_num_batched_tokens=64,
            event_driven=e,
            **SGLANG,
        )
        for e in (False, True)
    ]
    step_by_step, projected = runs
    assert step_by_step.record.requests.equals(projected.record.requests)
    ratios = [run.engine.scheduler.new_token_ratio for run in runs]
    assert ratios[0] == pytest.approx(ratios[1])
    assert ratios[0] == pytest.approx(0.7 * 0.14)  # 700 decode steps: past the 600 to the floor


class RatioRecorder(PrefillFirstScheduler):
    """Keeps the new-token ratio after each step's decisions."""

    def schedule(self, clock_s):
        plan = super().schedule(clock_s)
        self.ratios = [*getattr(self, "ratios", []), self.new_token_ratio]
        return plan


def test_a_retraction_resets_the_ratio_from_the_survivors(toy_run):
    # 100 one-token blocks, ratio 0.1 (floor 0.014). A (10 + 60) prefills at step 0; at step 1 it
    # reserves 0.1 x 59 = 5.9, so B (10 + 60 = 70 < 84.1) is admitted. Both then decode 2 tokens
    # a step: after 40 decode steps the 100 blocks are full, and at step 42 A's growth retracts B
    # (the newest). A has written 41 tokens of its 60, so the ratio becomes
    # (41 + 10 x 1) / (60 + 1) with retract_decode_steps=10
    requests = [request(0, 10, 60), request(1, 10, 60, arrival_s=0.001)]
    run = toy_run(
        RatioRecorder,
        RecomputePolicy,
        paged(100, 1),
        requests,
        max_num_batched_tokens=64,
        new_token_ratio_init=0.1,
        retract_decode_steps=10,
        **SGLANG,
    )
    preempted = [i for i, plan in enumerate(run.plans) if plan.preemptions]
    assert preempted[0] == 42
    ratios = run.engine.scheduler.ratios
    assert ratios[41] == pytest.approx(0.1 - 40 * (0.1 - 0.014) / 600)
    assert ratios[42] == pytest.approx(51 / 61)
    assert_every_request_finished(run, requests)


def test_a_request_that_could_never_pass_the_reservation_is_refused_up_front(toy_run):
    with pytest.raises(
        ConfigError,
        match=r"request 0 \(prompt 10 \+ output 30 tokens, declared S_max 40\) can never be admitted under "
        r"scheduler.admission_reserve=new_token_ratio: its prompt and output \(40 tokens\) must be fewer than "
        r"the 40 tokens of the empty KV budget",
    ):
        toy_run(PrefillFirstScheduler, RecomputePolicy, paged(40, 1), [request(0, 10, 30)], **SGLANG)


def test_a_late_arrival_is_checked_against_the_empty_budget_not_what_is_free_when_it_arrives():
    # a closed loop's requests are checked as they are made: 90 of 100 one-token blocks are held
    # when B (10 + 20) is; B fits the empty budget, so it is not refused (it waits its turn)
    alloc = paged(100, 1)
    config = PrefillFirstScheduler.Config(watermark_fraction=0.0, **SGLANG)
    scheduler = PrefillFirstScheduler(config, allocator=alloc, policy=RecomputePolicy(), cost=None, host_pool=None)
    assert alloc.allocate(999, SeqShape(90, 100, 90, 1, 90)) == 0
    scheduler.check_fits([request(1, 10, 20)])
    with pytest.raises(ConfigError, match="must be fewer than the 100 tokens of the empty KV budget"):
        scheduler.check_fits([request(2, 10, 90)])


# --- TRT-LLM --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("b_output", "b_admitted"), [(33, True), (34, False)])
def test_guaranteed_no_evict_admits_when_the_whole_request_fits_beside_what_running_ones_need(
    toy_run, b_output, b_admitted
):
    # 8 blocks of 8. A (8 + 17) ends with 24 tokens of KV: 3 blocks, 1 held after its prefill, 2
    # still to come. B's whole request must fit the 7 free blocks less those 2: 5 blocks, 40
    # tokens. B (8 + 33) ends at 40 and is admitted beside A; B (8 + 34) ends at 41 and waits
    requests = [request(0, 8, 17), request(1, 8, b_output)]
    run = toy_run(MixedScheduler, RecomputePolicy, paged(64), requests, max_num_batched_tokens=64, **TRTLLM)
    assert (scheduled(run)[0] == {0: 8, 1: 8}) is b_admitted
    assert_every_request_finished(run, requests)


def test_guaranteed_no_evict_never_preempts_where_kvbench_s_own_rule_does(toy_run):
    # 8 blocks of 8 and four requests of 8 + 24 (4 blocks each at their end). kvbench's rule admits
    # all four (1 block each) and then preempts as they grow; GUARANTEED_NO_EVICT admits two, then
    # the next two as those finish, and nobody is ever preempted
    requests = [request(i, 8, 24) for i in range(4)]
    own = toy_run(MixedScheduler, RecomputePolicy, paged(64), requests, max_num_batched_tokens=64)
    trt = toy_run(MixedScheduler, RecomputePolicy, paged(64), requests, max_num_batched_tokens=64, **TRTLLM)
    assert any(plan.preemptions for plan in own.plans)
    assert not any(plan.preemptions for plan in trt.plans)
    steps = scheduled(trt)
    assert steps[0] == {0: 8, 1: 8}
    assert [i for i, s in enumerate(steps) if s.get(2) == 8] == [24]  # after A and B's 24th token
    assert_every_request_finished(trt, requests)


def test_guaranteed_no_evict_decides_alike_step_by_step_and_over_projected_runs(toy_run):
    # a refused head waits through long quiet runs: the room left beside the running requests'
    # blocks to completion does not change while they decode, so the runs may be projected
    requests = [request(i, 8, 24 + 5 * i, arrival_s=0.5 * i) for i in range(6)]
    runs = [
        toy_run(
            MixedScheduler, RecomputePolicy, paged(96), requests, max_num_batched_tokens=64, event_driven=e, **TRTLLM
        )
        for e in (False, True)
    ]
    assert any(plan.refusal for plan in runs[0].plans)  # a head waited
    assert len(runs[1].plans) < len(runs[0].plans)  # and runs of steps were projected
    assert runs[0].record.requests.equals(runs[1].record.requests)
    assert not any(plan.preemptions for run in runs for plan in run.plans)


def test_max_num_tokens_caps_every_step_context_and_generation_together(toy_run):
    # 16 tokens a step: generation tokens first, then whole prompts while they fit. Step 1: A and
    # B decode (2), C (8) fits the 14 left, D (8) does not and waits for step 2 (3 decodes + 8)
    requests = [
        request(0, 6, 6),
        request(1, 6, 6),
        request(2, 8, 6, arrival_s=0.001),
        request(3, 8, 6, arrival_s=0.001),
    ]
    run = toy_run(MixedScheduler, RecomputePolicy, paged(256), requests, max_num_batched_tokens=16, **TRTLLM)
    steps = scheduled(run)
    assert steps[:3] == [{0: 6, 1: 6}, {0: 1, 1: 1, 2: 8}, {0: 1, 1: 1, 2: 1, 3: 8}]
    assert all(sum(s.values()) <= 16 for s in steps)
    assert_every_request_finished(run, requests)


def test_under_guaranteed_no_evict_only_the_prompt_must_fit_a_step(toy_run):
    # nothing is ever preempted, so no readmission computes a prompt and its output in one step: a
    # 16-token prompt with 8 output tokens runs under a 16-token budget (kvbench's own rule with
    # decodes in the budget refuses it: a readmission would need 16 + 7 tokens)
    requests = [request(0, 16, 8)]
    run = toy_run(MixedScheduler, RecomputePolicy, paged(256), requests, max_num_batched_tokens=16, **TRTLLM)
    assert scheduled(run)[0] == {0: 16}
    assert_every_request_finished(run, requests)
    plain = dict(TRTLLM, admission_reserve="none")
    with pytest.raises(ConfigError, match="can never be admitted whole within scheduler.max_num_batched_tokens=16"):
        toy_run(MixedScheduler, RecomputePolicy, paged(256), requests, max_num_batched_tokens=16, **plain)


# --- options ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"admission_reserve": "sglang"}, "scheduler.admission_reserve='sglang' is invalid: choose one of none, "),
        ({"new_token_ratio_init": 0}, "scheduler.new_token_ratio_init=0 is invalid: use a ratio in (0, 1]"),
        ({"new_token_ratio_init": 1.5}, "scheduler.new_token_ratio_init=1.5 is invalid"),
        ({"new_token_ratio_min_factor": -0.1}, "scheduler.new_token_ratio_min_factor=-0.1 is invalid"),
        ({"new_token_ratio_decay_steps": 0}, "scheduler.new_token_ratio_decay_steps=0 is invalid: use an integer >= 1"),
        ({"clip_max_new_tokens": 0}, "scheduler.clip_max_new_tokens=0 is invalid"),
        ({"retract_decode_steps": -1}, "scheduler.retract_decode_steps=-1 is invalid: use an integer >= 0"),
        ({"chunked_prefill": "yes"}, "scheduler.chunked_prefill='yes' is invalid: use true or false"),
        ({"chunked_prefill": True, "head_only_chunking": True}, "scheduler.chunked_prefill=True is invalid"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(options, message):
    with pytest.raises(ConfigError) as caught:
        SchedulerConfig(**options).validate()
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_the_defaults_reserve_nothing():
    cfg = SchedulerConfig()
    assert cfg.admission_reserve == "none" and not cfg.chunked_prefill
