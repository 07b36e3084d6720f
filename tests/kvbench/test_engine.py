"""The decode loop on the simulated H100: the lecture's numbers, exactness, no request lost."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvbench.api import run
from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.errors import ConfigError
from kvbench.metrics.summary import SloConfig, summarize

FAST = ["wandb.mode=disabled", "progress=false", "kernel=torch"]


def lecture(*overrides, num_requests=400):
    return run([*FAST, "workload=lecture_chat", f"workload.num_requests={num_requests}", *overrides])


@pytest.fixture(scope="module")
def naive():
    return lecture("allocator=naive")


@pytest.fixture(scope="module")
def paged():
    return lecture("allocator=paged", "allocator.block_size_tokens=16", num_requests=600)


def test_naive_holds_exactly_29_sequences_at_13_to_16_percent(naive):
    s = naive.summary
    assert s["peak_concurrency"] == 29
    assert 0.13 <= s["utilization_saturated"] <= 0.16
    assert s["num_preemptions"] == 0


def test_naive_with_s_max_32k_holds_3():
    s = lecture("allocator=naive", "allocator.s_max_tokens=32768", num_requests=12).summary
    assert s["peak_concurrency"] == 3


def test_paged_block_16_holds_180_or_more_at_95_percent(paged):
    s = paged.summary
    assert s["peak_concurrency"] >= 180
    assert s["utilization_saturated"] >= 0.95
    assert s["mean_tail_waste_tokens_per_seq"] < 16


def test_every_request_finishes_with_exactly_its_output_length(paged, naive):
    for result in (paged, naive):
        r = result.requests
        assert (r["num_generated"] == r["output_tokens"]).all()
        assert (r["finish_s"] >= r["first_token_s"]).all() and (r["first_token_s"] > r["arrival_s"]).all()


def test_preempted_requests_still_finish_exactly():
    # a tiny budget forces recompute preemptions: paged admits on the prompt, then runs out
    result = lecture(
        "allocator=paged", "hardware.kv_budget_bytes=2e9", "scheduler.watermark_fraction=0", num_requests=60
    )
    r = result.requests
    assert r["num_preemptions"].sum() > 0
    assert result.summary["num_preemptions"] == r["num_preemptions"].sum()
    assert (r["num_generated"] == r["output_tokens"]).all()
    assert (r.loc[r["num_preemptions"] > 0, "num_recomputed_tokens"] > 0).all()
    assert 0 < result.summary["recompute_tax"] < 1


def test_memory_ledger_sums_to_the_budget_every_step(paged):
    steps = paged.steps
    total = steps[list(LEDGER_FIELDS)].sum(axis=1)
    one_step = steps["num_steps"] == 1  # a single step's ledger is exact; a span's is a time-weighted mean
    assert (total[one_step] == paged.summary["kv_budget_bytes"]).all()
    assert total.to_numpy() == pytest.approx(paged.summary["kv_budget_bytes"], rel=1e-12)


def test_ttft_decomposes_into_queueing_prefill_and_scheduling(paged):
    r = paged.requests
    ttft = r["first_token_s"] - r["arrival_s"]
    parts = (
        (r["admitted_s"] - r["boundary_s"])
        + (r["first_token_s"] - r["admitted_s"])
        + (r["boundary_s"] - r["arrival_s"])
    )
    assert ttft.to_numpy() == pytest.approx(parts.to_numpy())


def test_same_config_and_seed_give_identical_summaries():
    args = ("allocator=per_request", "workload=exercise2_mix", "model=llama2-7b-32k", "workload.num_requests=150")
    assert comparable(run([*FAST, *args]).summary) == comparable(run([*FAST, *args]).summary)


def test_per_request_exercise2_mix_observes_external_fragmentation():
    result = run(
        [*FAST, "allocator=per_request", "workload=exercise2_mix", "model=llama2-7b-32k", "workload.num_requests=600"]
    )
    refusals = result.refusals
    fragmented = refusals[refusals["reason"] == "fragmented"]
    assert len(fragmented) >= 1
    assert result.summary["num_fragmentation_refusals"] == fragmented["num_steps"].sum()
    # enough bytes were free, but the refused request's reservation did not fit in any single hole
    assert (fragmented["free_bytes"] >= fragmented["reservation_bytes"]).all()
    assert (fragmented["largest_hole_bytes"] < fragmented["reservation_bytes"]).all()
    no_memory = refusals[refusals["reason"] == "no_memory"]
    assert (no_memory["free_bytes"] < no_memory["reservation_bytes"]).all()


def test_uncalibrated_kernel_runs_at_full_bandwidth_and_says_so(paged):
    assert paged.summary["calibration"] == "uncalibrated"
    assert paged.summary["decode_efficiency"] == 1.0


def test_a_watermark_larger_than_the_free_space_never_blocks_an_empty_batch():
    # 1 GB holds one 640-token sequence (0.34 GB) but not with 90 % of the budget kept free
    result = lecture(
        "allocator=paged", "hardware.kv_budget_bytes=1e9", "scheduler.watermark_fraction=0.9", num_requests=5
    )
    assert (result.requests["num_generated"] == result.requests["output_tokens"]).all()
    assert result.summary["peak_concurrency"] == 1


# --- every allocator x scheduler x preemption: nothing lost, and both loops write the same tables --

ALLOCATORS = ["naive", "orca_oracle", "paged"]
SCHEDULERS = ["mixed", "prefill_first", "chunked", "static"]
PREEMPTIONS = ["recompute", "swap", "length_aware"]
# 2.5 GB of KV holds 4,768 Llama-2-7B tokens: one 4K naive slot, and far less than 40 lognormal
# requests (medians 512 + 128, tails to 4K) want at once, so paged runs preempt all the time; a 1 GB
# host pool holds 1,907 tokens of swapped KV, so some swaps fall back to recompute
HEAVY = [
    "workload=lognormal",
    "workload.num_requests=40",
    "hardware.kv_budget_bytes=2.5e9",
    "hardware.host_swap_bytes=1e9",
    "scheduler.max_num_seqs=64",
]


def both_loops(*overrides):
    event = run([*FAST, *overrides, "event_driven=true"])
    step = run([*FAST, *overrides, "event_driven=false"])
    for table in ("requests", "steps", "refusals"):
        pd.testing.assert_frame_equal(getattr(event, table), getattr(step, table), check_exact=True)
    assert comparable(event.summary) == comparable(step.summary)
    return event


def comparable(summary: dict) -> dict:
    """A summary without its wall-clock keys, NaN as None (so that equal summaries compare equal)."""
    wall_clock = ("sim_wall_s", "loop_wall_s", "simulated_requests_per_wall_s")
    return {k: None if v != v else v for k, v in summary.items() if k not in wall_clock}


@pytest.mark.parametrize("preemption", PREEMPTIONS)
@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_every_combination_emits_every_token_and_both_loops_agree(allocator, scheduler, preemption):
    result = both_loops(*HEAVY, f"allocator={allocator}", f"scheduler={scheduler}", f"preemption={preemption}")
    r = result.requests
    assert (r["num_generated"] == r["output_tokens"]).all() and (r["finish_s"] > 0).all()
    s = result.summary
    assert s["num_preemptions"] == s["num_recompute_preemptions"] + s["num_swap_preemptions"]
    if allocator == "paged":
        assert s["num_preemptions"] > 0, "the heavy workload must preempt"
        if preemption == "swap":
            assert s["num_swap_preemptions"] > 0 and s["num_swap_fallbacks"] > 0
            assert 0 < s["swap_pool_peak_bytes"] <= 1e9


#: the speed goals' arrival-heavy regime (vLLM v0's scheduling on real traces): a roomy budget, where
#: each arrival that may be admitted ends a run of decode steps, and a tight one (about 11,400 tokens:
#: four arXiv prompts), where the queue blocks, arrivals join behind it inside runs and the batch preempts
ARRIVAL_HEAVY = [
    "allocator=paged",
    "scheduler=prefill_first",
    "preemption=recompute",
    "workload.num_requests=250",
    "workload.too_long=clip",  # every row replayed (the Azure trace has prompts beyond Llama-2's 4,096)
]
ARRIVAL_TRACES = {"arxiv": ["workload=arxiv", "workload.rate_per_s=3"], "azure_conv": ["workload=azure_conv"]}


@pytest.mark.parametrize("budget", ["roomy", "tight"])
@pytest.mark.parametrize("trace", sorted(ARRIVAL_TRACES))
def test_both_loops_agree_on_arrival_heavy_traces(trace, budget):
    tight = ["hardware.kv_budget_bytes=6e9"] if budget == "tight" else []
    result = both_loops(*ARRIVAL_HEAVY, *ARRIVAL_TRACES[trace], *tight)
    r, s = result.requests, result.summary
    assert len(r) == 250 and (r["num_generated"] == r["output_tokens"]).all()
    assert s["num_steps"] > 5 * len(result.steps)  # long runs of decode steps between events
    assert (s["num_preemptions"] > 0) == (budget == "tight")


@pytest.mark.parametrize("allocator, budget", [("paged", "2.5e9"), ("naive", "9e9"), ("orca_oracle", "9e9")])
def test_a_fan_out_workload_loses_no_branch(allocator, budget):
    # contiguous allocators reserve three whole ranges per request, so they need a larger budget
    result = both_loops(
        *HEAVY,
        "workload.num_branches=3",
        "workload.num_requests=12",
        f"allocator={allocator}",
        f"hardware.kv_budget_bytes={budget}",
        "preemption=swap",
    )
    r = result.requests
    assert (r["num_branches"] == 3).all() and (r["num_generated"] == r["output_tokens"]).all()
    assert result.summary["num_copies"] > 0  # copy-on-write, or the prompt copied into each branch
    if allocator == "paged":
        assert result.summary["num_swap_preemptions"] > 0


#: vLLM's prefix cache (every full block keyed) on 100 lognormal requests that share a 1,000-token
#: system prompt, in 2.5 GB: requests preempted by recompute come back to partly evicted blocks
VLLM_SHARED_PREFIX = [
    "engine=vllm_v1",
    "allocator=paged_cached",
    "allocator.cache_generated_blocks=true",
    "workload=lognormal",
    "workload.num_requests=100",
    "workload.shared_prefix_tokens=1000",
    "hardware.kv_budget_bytes=2.5e9",
]


def test_both_loops_agree_with_recomputed_copies_of_cached_blocks_kept_cached():
    kept = both_loops(*VLLM_SHARED_PREFIX)  # engine=vllm_v1 sets engine.cache_duplicate_blocks
    private = run([*FAST, *VLLM_SHARED_PREFIX, "engine.cache_duplicate_blocks=false"])
    assert kept.summary["num_preemptions"] == private.summary["num_preemptions"] > 0
    # the copies wait their turn in the evictable queue, so one readmitted request finds one
    # 16-token block fewer of its own than where they were freed at once
    served = (kept.requests["recompute_cached_tokens"] - private.requests["recompute_cached_tokens"]).tolist()
    assert sorted(served)[0] == -16 and sum(1 for tokens in served if tokens) == 1


# --- lecture 10.4: copy-on-write fan-out, out of a run ------------------------------------------

# a 4K prompt plus its outputs is longer than Llama-2-7B's 4,096 positions: its 32K variant has the
# same 512 KiB of KV per token
FAN_OUT = [*FAST, "workload=lecture_chat", "workload.num_requests=1", "model=llama2-7b-32k"]
SLOT = 524_288  # Llama-2-7B KV bytes per token


def fan_out(prompt_tokens: int, output_tokens: int, num_branches: int, s_max_tokens: int) -> list[str]:
    """One request: a prompt of ``prompt_tokens`` forking into ``num_branches`` branches of
    ``output_tokens``, with an S_max of ``s_max_tokens``."""
    return [
        *FAN_OUT,
        f"workload.prompt_tokens={prompt_tokens}",
        f"workload.output_tokens={output_tokens}",
        f"workload.num_branches={num_branches}",
        f"workload.s_max_tokens={s_max_tokens}",
    ]


def test_eight_branches_off_a_4k_prompt_hold_6144_tokens_shared_not_34816():
    n8 = fan_out(4096, 256, 8, s_max_tokens=4352)
    shared = run([*n8, "allocator=paged"]).summary
    unshared = run([*n8, "allocator=per_request", "allocator.reserve=oracle"]).summary
    # paged: the prompt's 256 blocks once, plus 16 blocks per branch for its 255 cached tokens
    assert shared["peak_allocated_bytes"] == (4096 + 8 * 256) * SLOT
    assert shared["peak_token_bytes"] == (4096 + 8 * 255) * SLOT  # the last token is never fed back
    assert shared["num_copies"] == 0  # the prompt fills whole blocks: no copy-on-write
    # contiguous: every branch reserves prompt + output, and the prompt is copied into 7 of them
    assert unshared["peak_allocated_bytes"] == 8 * (4096 + 256) * SLOT
    assert unshared["num_copies"] == 7 and unshared["copy_bytes"] == 7 * 4096 * SLOT
    assert unshared["peak_allocated_bytes"] / shared["peak_allocated_bytes"] == pytest.approx(5.67, abs=0.005)
    # the paged run says it itself: 256 prompt blocks held by 8 branches, 8 x 272 blocks without sharing
    assert shared["peak_shared_blocks"] == 4096 // 16
    assert shared["peak_unshared_bytes"] == 8 * (4096 + 256) * SLOT == unshared["peak_allocated_bytes"]
    assert shared["sharing_saving"] == (8 * (4096 + 256)) / (4096 + 8 * 256)
    # a contiguous allocator copies the prompt: nothing shared, nothing saved
    assert (unshared["peak_shared_blocks"], unshared["sharing_saving"]) == (0, 1.0)
    assert unshared["peak_unshared_bytes"] == unshared["peak_allocated_bytes"]


def test_sixteen_branches_off_8k_fit_shared_and_not_unshared():
    n16 = fan_out(8192, 512, 16, s_max_tokens=8704)
    shared = run([*n16, "allocator=paged"]).summary
    assert shared["peak_allocated_bytes"] == (8192 + 16 * 512) * SLOT == 8_589_934_592  # 8.6 GB
    with pytest.raises(ConfigError, match="cannot hold all its branches at once"):
        run([*n16, "allocator=per_request", "allocator.reserve=oracle"])  # 16 x 8,704 x 512 KiB = 73.0 GB > 62.5


def test_a_branch_diverging_inside_a_shared_block_copies_it():
    # a 4,100-token prompt ends 4 tokens into its last block: each of 4 branches copies that block
    # once (copy-on-write) when it writes its first token there
    s = run([*fan_out(4100, 8, 4, s_max_tokens=4200), "allocator=paged"]).summary
    assert s["num_copies"] == 3  # the last branch to write finds the block its own again
    assert s["copy_bytes"] == 3 * 16 * SLOT and s["copy_s"] > 0
    # at the fork the 257 prompt blocks (the partly filled one too) are held by all 4 branches
    assert s["peak_shared_blocks"] == 257
    # the peak without sharing: 4 branches of 4,107 cached tokens in 257 blocks each
    assert s["peak_unshared_bytes"] == 4 * 257 * 16 * SLOT


def test_a_beam_search_shares_what_its_beams_share_and_copies_the_rest():
    beam = [*fan_out(4096, 256, 8, s_max_tokens=4352), "workload.fan_out=beam"]
    sampled = run([*beam, "workload.fan_out=sample", "allocator=paged"]).summary
    # never re-forked, 8 beams are 8 samples: they share the prompt only
    assert comparable(run([*beam, "workload.beam_fork_probability=0", "allocator=paged"]).summary) == comparable(
        sampled
    )
    paged = both_loops(*beam, "allocator=paged").summary
    # re-forked beams share their common history too, and each re-fork copies one partly filled block
    assert paged["peak_allocated_bytes"] < sampled["peak_allocated_bytes"]
    assert paged["num_copies"] > 0 and paged["copy_bytes"] == paged["num_copies"] * 16 * SLOT
    contiguous = both_loops(*beam, "allocator=per_request", "allocator.reserve=oracle").summary
    # without paging, every re-fork copies a beam's whole context into another's range
    assert contiguous["copy_bytes"] > 100 * paged["copy_bytes"]
    assert contiguous["copy_s"] > 100 * paged["copy_s"]


# --- the vLLM paper's baselines -------------------------------------------------------------------

PAPER = [*FAST, "model=opt-13b", "hardware=a100-40gb", "workload=sharegpt_like", "workload.num_requests=300"]


def test_orca_max_batches_7_with_8_85_percent_unusable_and_pow2_and_oracle_differ():
    by_allocator = {a: run([*PAPER, f"allocator={a}"]).summary for a in ("orca_max", "orca_pow2", "orca_oracle")}
    orca_max = by_allocator["orca_max"]
    assert orca_max["peak_concurrency"] == 7 and orca_max["mean_concurrency_saturated"] == pytest.approx(7.0)
    # 983 granules of 16 tokens = 512 + 256 + 128 + 64 + 16 + 4 + 2 + 1; a 2,048-token reservation
    # takes the first three as 7 blocks and none of the 87 granules left
    assert orca_max["frac_external"] == pytest.approx(0.0885, abs=5e-4)
    peaks = [by_allocator[a]["peak_concurrency"] for a in ("orca_max", "orca_pow2", "orca_oracle")]
    assert peaks[0] < peaks[1] < peaks[2]


def test_a_workload_longer_than_the_model_is_one_line():
    with pytest.raises(ConfigError, match="S_max up to 4096 tokens, beyond model 'opt-13b''s 2048 positions"):
        run([*FAST, "model=opt-13b", "hardware=a100-40gb", "workload.num_requests=5"])


@pytest.mark.parametrize("event_driven", [True, False])
def test_the_step_table_grows_with_events_not_with_decoded_tokens(event_driven):
    # 30,000 decode steps of one batch are one row, whether the loop took them one by one or at
    # once: memory for the per-step table is bounded by arrivals, finishes and preemptions
    long = run(
        [
            *FAST,
            "model=llama2-7b-32k",
            "workload=synthetic",
            "workload.num_requests=2",
            "workload.prompt_tokens=100",
            "workload.output_tokens=30000",
            "workload.s_max_tokens=30100",
            f"event_driven={str(event_driven).lower()}",
        ]
    )
    assert (long.requests["num_generated"] == 30000).all()
    assert len(long.steps) <= 3 and long.steps["num_steps"].sum() == 30000


# --- a closed-loop client (workload.arrival=closed_loop): max_concurrency requests in flight ------

#: the HEAVY lognormal workload, sent by a client that keeps 12 requests in flight: lengths differ,
#: so finishes (and the sends they trigger) are spread out, and paged preempts under the 2.5 GB budget
CLOSED_LOOP = [*HEAVY, "workload.arrival=closed_loop", "+workload.max_concurrency=12"]


def in_flight_and_left(result, t_s: float) -> tuple[int, int]:
    """Requests sent and not finished at time ``t_s``, and requests not finished, from the request
    table (one finished at ``t_s`` is out, one sent at ``t_s`` is in)."""
    r = result.requests
    unfinished = r["finish_s"] > t_s
    return int((unfinished & (r["arrival_s"] <= t_s)).sum()), int(unfinished.sum())


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("allocator, budget", [("paged", "2.5e9"), ("naive", "9e9")])
def test_a_closed_loop_run_holds_its_concurrency_and_both_loops_agree(allocator, budget, preemption):
    overrides = (f"allocator={allocator}", f"hardware.kv_budget_bytes={budget}", f"preemption={preemption}")
    result = both_loops(*CLOSED_LOOP, *overrides)
    for t_s in (0.0, *result.steps["start_s"]):  # every step boundary (a span's inner ones change nothing)
        in_flight, left = in_flight_and_left(result, t_s)
        assert in_flight == min(12, left), f"at t = {t_s} s"
    r = result.requests
    assert (r["num_generated"] == r["output_tokens"]).all()
    # sent at a step boundary: no scheduling delay, and TTFT counts from the send
    assert (r["boundary_s"] == r["arrival_s"]).all() and (r["first_token_s"] > r["arrival_s"]).all()
    if allocator == "paged":
        assert result.summary["num_preemptions"] > 0, "the closed loop must still preempt"


def test_the_next_request_is_sent_when_an_earlier_one_finishes():
    r = run([*FAST, *CLOSED_LOOP]).requests
    arrival_s, finish_s = r["arrival_s"].to_numpy(), r["finish_s"].to_numpy()
    assert (arrival_s[:12] == 0).all()
    # the j-th finish (in time) sends request 12 + j, at that very time
    assert (arrival_s[12:] == np.sort(finish_s)[: len(r) - 12]).all()
    assert (np.diff(arrival_s[12:]) > 0).any(), "the finishes must be spread out"
    for k in range(len(r) - 12):
        assert arrival_s[k + 12] in set(finish_s[: k + 12]), f"request {k + 12} was sent when none had finished"


def test_the_closed_loop_preset_holds_16_in_flight_the_whole_run():
    result = run([*FAST, "workload=closed_loop"])
    r = result.requests
    assert len(r) == 64 and (r["num_generated"] == 1024).all()
    assert result.summary["peak_concurrency"] == 16
    s = summarize(
        r,
        result.steps,
        budget_bytes=result.summary["kv_budget_bytes"],
        kv_bytes_per_token=result.summary["kv_bytes_per_token"],
        slo=SloConfig(),
        max_concurrency=16,
    )
    # 16 in flight until the last 16 have been sent, then the ramp-down (a step admits 8,192 prompt
    # tokens, 8 of the 1,024-token prompts, so the last 8 finish a step after the 8 before them)
    assert s["max_concurrency"] == 16 and 15.99 < s["mean_requests_in_flight"] < 16


@pytest.mark.parametrize("value", ["null", "0"])
def test_a_closed_loop_without_a_concurrency_is_one_line(value):
    with pytest.raises(ConfigError) as exc:
        run([*FAST, "workload=closed_loop", f"workload.max_concurrency={value}"])
    message = str(exc.value)
    assert message.startswith(f"workload.max_concurrency={'None' if value == 'null' else value} is invalid: ")
    assert "\n" not in message


def test_a_closed_loop_wider_than_the_workload_is_all_at_once():
    lognormal = [*FAST, "workload=lognormal", "workload.num_requests=20"]
    closed = run([*lognormal, "workload.arrival=closed_loop", "+workload.max_concurrency=20"])
    offline = run(lognormal)
    for table in ("requests", "steps"):
        pd.testing.assert_frame_equal(getattr(closed, table), getattr(offline, table), check_exact=True)


@pytest.mark.parametrize("event_driven", [False, True])
def test_requests_waiting_at_t0_are_made_only_as_the_queue_reaches_them(toy_run, monkeypatch, event_driven):
    # 500 requests at t = 0 on a toy machine of 8 blocks of 8 tokens (a request needs 1 block for
    # its prompt, 2 at the end): behind an FCFS head they wait as a count, not as 500 groups
    from kvbench_plugins.preemption.recompute import RecomputePolicy
    from kvbench_plugins.schedulers.prefill_first import PrefillFirstScheduler
    from toy import paged, request

    import kvbench.engine
    from kvbench.core.sequence import SequenceGroup

    made: list[SequenceGroup] = []
    live_when_made: list[int] = []

    class CountedGroup(SequenceGroup):
        __slots__ = ()

        def __init__(self, *args) -> None:
            super().__init__(*args)
            made.append(self)
            live_when_made.append(sum(1 for g in made if g.finish_s < 0))

    monkeypatch.setattr(kvbench.engine, "SequenceGroup", CountedGroup)
    result = toy_run(
        PrefillFirstScheduler,
        RecomputePolicy,
        paged(64),
        [request(i, 8, 4) for i in range(500)],
        event_driven=event_driven,
    )
    requests = result.record.requests
    assert len(made) == 500 and (requests["num_generated"] == 4).all()
    assert requests["boundary_s"].eq(0.0).all()  # they all arrived at the first step boundary
    # a group is made when the queue's head is a new arrival: preempted requests went back in
    # front of it and were readmitted, so the live ones hold memory (at most 8) plus the new one
    assert max(live_when_made) == 9  # (before: 500, every request made when it arrived)
