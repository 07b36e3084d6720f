"""A deployment's workers, driven by hand: a prefill worker holds a request's KV until it is
released, a decode worker reserves blocks for a prefilled request, waits for its KV, and decodes
exactly its output tokens; ledgers sum to the budget at every step, nothing leaks, and the
event-driven and step-by-step workers write the same tables."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from deploy_workers import BLOCK, KV, check_deployment, check_worker, paged, worker
from hypothesis import given, settings
from hypothesis import strategies as st
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.preemption.swap import SwapPolicy
from kvbench_plugins.schedulers.chunked import ChunkedScheduler
from kvbench_plugins.schedulers.prefill_first import PrefillFirstScheduler

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.core.request import Request
from kvbench.deploy.interfaces import WorkerView
from kvbench.deploy.worker import Admitted, Finished, FirstToken, Prefilled, Worker
from kvbench.errors import ConfigError
from kvbench.testing.schedulers import allocators


def co_simulate(requests, prefill, decode, delay_s, *, check=True, max_turns=100_000):
    """A test-only deployment loop: request i goes to prefill worker i mod N at its arrival; when
    its prompt is computed, to decode worker j (in turn) as prefilled; once the decode worker has
    reserved its blocks, its KV takes ``delay_s`` after the later of that and the prefill's end,
    then lands there and is released on the prefill side. The worker with the earliest next event
    advances, up to the earliest next event of the others (nothing they do can come earlier)."""
    by_id = {r.request_id: r for r in requests}
    for i, r in enumerate(requests):
        prefill[i % len(prefill)].push(r, r.arrival_s)
    workers = [*prefill, *decode]
    prefilled: dict[int, tuple[Prefilled, Worker]] = {}
    events: list = []
    num_decoded = 0
    for _ in range(max_turns):
        nexts = [(w.next_event_s(), i) for i, w in enumerate(workers)]
        active = [(t, i) for t, i in nexts if t is not None]
        if not active:
            break
        t, i = min(active)
        horizon_s = min((tj for tj, j in active if j != i), default=math.inf)
        w = workers[i]
        turn = w.advance(horizon_s)
        if check:
            check_worker(w)
        for e in turn:
            events.append((w.role, e))
            if isinstance(e, Prefilled):
                prefilled[e.request_id] = (e, w)
                decode[num_decoded % len(decode)].push(by_id[e.request_id], e.end_s)
                num_decoded += 1
            elif isinstance(e, Admitted):
                done, source = prefilled[e.request_id]
                end_s = max(e.at_s, done.end_s) + delay_s
                w.land(e.request_id, end_s)
                source.release(e.request_id, end_s)
    else:
        raise AssertionError("the loop made no progress")
    return events, [w.finish() for w in workers]


def test_prefill_holds_the_kv_until_it_is_released():
    p = worker("prefill", paged(16))
    p.push(Request(0, 0.0, 10, 40, (5,)), 0.0)
    events = p.advance(math.inf)
    (done,) = events
    assert isinstance(done, Prefilled) and done.start_s == 0.0 and done.end_s == p.clock_s > 0
    assert done.kv_bytes == 3 * BLOCK * KV  # 10 tokens in blocks of 4: the blocks a transfer moves
    held = p.scheduler.allocator.ledger()
    assert held.token_bytes == 10 * KV and held.total_bytes == held.budget_bytes
    assert p.next_event_s() is None  # nothing to do until the transfer ends
    p.release(0, done.end_s + 0.5)
    assert p.next_event_s() == done.end_s + 0.5
    assert p.advance(math.inf) == []
    assert p.scheduler.allocator.ledger().allocated_bytes == 0
    record = p.finish()
    assert record.requests["num_generated"].tolist() == [1]
    with pytest.raises(ValueError, match="holds no KV"):
        p.release(0, 1.0)


def test_held_kv_makes_the_next_request_wait_for_its_release():
    p = worker("prefill", paged(4))  # 16 tokens: one 12-token prompt at a time
    p.push(Request(0, 0.0, 12, 20, (3,)), 0.0)
    p.push(Request(1, 0.0, 12, 20, (3,)), 0.0)
    (first,) = p.advance(math.inf)
    assert p.advance(math.inf) == []  # the second is refused: the first's KV is held
    assert p.next_event_s() is None
    p.release(0, 1.0)
    (second,) = p.advance(math.inf)
    assert second.request_id == 1 and second.start_s == 1.0


def test_decode_reserves_waits_for_its_kv_then_decodes_exactly_its_output():
    d = worker("decode", paged(16))
    request = Request(7, 0.0, 10, 40, (4,))
    d.push(request, 0.25)
    assert d.next_event_s() == 0.25
    (admitted,) = d.advance(math.inf)
    assert admitted == Admitted(7, 0.25)
    led = d.scheduler.allocator.ledger()
    assert led.token_bytes == 10 * KV  # the allocator's own view: slots taken
    view = d.view(0)
    assert isinstance(view, WorkerView) and view.num_running == 1 and view.num_waiting == 0
    assert d.next_event_s() is None  # nothing to compute before the KV lands
    d.land(7, 0.5)
    events = []
    while d.next_event_s() is not None:
        events += d.advance(math.inf)
    assert [type(e) for e in events] == [FirstToken, Finished]
    assert events[0].at_s > 0.5
    record = d.finish()
    r = record.requests
    assert r["num_generated"].tolist() == [4] and r["admitted_s"].tolist() == [0.25]
    assert r["cached_prompt_tokens"].tolist() == [9]  # landed, not computed here
    assert r["num_computed_tokens"].tolist() == [1 + 3]  # the last prompt position, then 3 decodes
    assert d.scheduler.allocator.ledger().allocated_bytes == 0


def test_a_reserved_request_shows_as_reserved_future_in_the_step_ledger():
    d = worker("decode", paged(16))
    d.push(Request(0, 0.0, 4, 40, (20,)), 0.0)
    d.advance(math.inf)
    d.land(0, 0.0)
    d.advance(math.inf)  # request 0 runs
    d.push(Request(1, 0.0, 8, 40, (3,)), d.clock_s)
    (admitted,) = d.advance(math.inf)  # reserved in a step that decodes request 0
    assert isinstance(admitted, Admitted)
    d.land(1, admitted.at_s + 1.0)
    while d.next_event_s() is not None:
        d.advance(math.inf)
    steps = d.finish().steps.set_index("start_s")
    row = steps.loc[admitted.at_s]
    assert row["token_bytes"] == 5 * KV  # request 0: its prompt and output token 1; request 1 holds none yet
    assert row["reserved_future_bytes"] >= 8 * KV
    assert row[list(LEDGER_FIELDS)].sum() == d.scheduler.allocator.budget_bytes


def test_decode_refuses_to_land_what_it_has_not_reserved():
    d = worker("decode", paged(16))
    with pytest.raises(ValueError, match="no blocks reserved"):
        d.land(3, 1.0)


def test_fan_outs_are_refused_in_one_line():
    with pytest.raises(ValueError, match="one-branch requests only"):
        worker("prefill", paged(16)).push(Request(0, 0.0, 4, 40, (2, 2)), 0.0)


def test_a_request_that_never_fits_the_decode_side_is_refused():
    with pytest.raises(ConfigError):
        worker("decode", paged(2)).push(Request(0, 0.0, 4, 40, (20,)), 0.0)


def test_cached_prefix_tokens_reads_the_prefix_cache():
    hashes = (11, 12, 13)
    plain = worker("prefill", paged(16))
    cached = worker("prefill", paged(16, prefix_caching=True))
    first = Request(0, 0.0, 12, 40, (2,), prefix_hashes=hashes, hash_block_tokens=BLOCK)
    second = Request(1, 0.0, 12, 40, (2,), prefix_hashes=hashes, hash_block_tokens=BLOCK)
    for w in (plain, cached):
        assert w.view(0).cached_prefix_tokens(second) == 0
        w.push(first, 0.0)
        w.advance(math.inf)
        w.release(0, w.clock_s)
        w.advance(math.inf)
    assert plain.view(0).cached_prefix_tokens(second) == 0
    # whole blocks only, and not the last one: it holds the token computed for the logits
    assert cached.view(1).cached_prefix_tokens(second) == 8


@pytest.mark.parametrize("event_driven", [True, False])
def test_one_prefill_one_decode_deploy_a_small_workload(event_driven):
    requests = [Request(i, 0.01 * i, 10 + 3 * i, 100, (5 + i,)) for i in range(6)]
    prefill = [worker("prefill", paged(64), event_driven=event_driven)]
    decode = [worker("decode", paged(12), event_driven=event_driven)]  # 48 tokens: requests wait for memory
    events, records = co_simulate(requests, prefill, decode, 0.001)
    check_deployment(requests, prefill, decode, events, records)
    firsts = {e.request_id: e.at_s for _, e in events if isinstance(e, FirstToken)}
    ends = {e.request_id: e.end_s for _, e in events if isinstance(e, Prefilled)}
    assert all(firsts[i] > ends[i] + 0.001 for i in firsts)  # after the transfer
    assert records[1].refusals["request_id"].nunique() >= 1  # some waited for decode memory


def test_event_driven_and_step_by_step_workers_write_the_same_tables():
    requests = [Request(i, 0.002 * i, 6 + (5 * i) % 17, 200, (3 + (7 * i) % 40,)) for i in range(10)]
    tables = []
    for event_driven in (True, False):
        prefill = [worker("prefill", paged(40), event_driven=event_driven) for _ in range(2)]
        decode = [worker("decode", paged(30), event_driven=event_driven)]
        events, records = co_simulate(requests, prefill, decode, 0.003)
        check_deployment(requests, prefill, decode, events, records)
        tables.append((events, records))
    assert tables[0][0] == tables[1][0]
    for a, b in zip(tables[0][1], tables[1][1]):
        for name in ("requests", "steps", "refusals"):
            pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert sum(len(r.steps) for r in tables[0][1]) > 0


#: (arrival gap, prompt, output) of a request
REQUESTS = st.lists(
    st.tuples(st.sampled_from([0.0, 0.0, 0.002, 0.05]), st.integers(1, 40), st.integers(1, 30)), min_size=1, max_size=8
)


@settings(max_examples=40, deadline=None)
@given(
    rows=REQUESTS,
    num_prefill=st.integers(1, 2),
    num_decode=st.integers(1, 3),
    delay_s=st.sampled_from([0.0005, 0.004, 0.1]),
    decode_tokens=st.sampled_from([72, 96, 160]),
    allocator=st.sampled_from(["paged", "paged_prefix_caching", "naive", "per_request", "hybrid_paged_state"]),
    scheduler=st.sampled_from([ChunkedScheduler, PrefillFirstScheduler]),
    policy=st.sampled_from([RecomputePolicy, SwapPolicy]),
)
def test_random_deployments_lose_nothing_and_leak_nothing(
    rows, num_prefill, num_decode, delay_s, decode_tokens, allocator, scheduler, policy
):
    requests, arrival_s = [], 0.0
    for i, (gap_s, prompt, output) in enumerate(rows):
        arrival_s += gap_s
        requests.append(Request(i, arrival_s, prompt, prompt + output, (output,)))
    tables = []
    for event_driven in (True, False):

        def make(role, tokens):
            return worker(
                role, allocators(tokens)[allocator], event_driven=event_driven, scheduler=scheduler, policy=policy
            )

        prefill = [make("prefill", 160) for _ in range(num_prefill)]
        decode = [make("decode", decode_tokens) for _ in range(num_decode)]
        try:
            events, records = co_simulate(requests, prefill, decode, delay_s)
        except ConfigError:  # a request longer than the allocator's S_max: refused up front
            return
        check_deployment(requests, prefill, decode, events, records)
        tables.append(records)
    for a, b in zip(*tables):
        for name in ("requests", "steps", "refusals"):
            pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)


def test_no_step_starts_after_the_horizon():
    request = Request(0, 0.0, 6, 80, (60,))
    boundaries = []  # every step boundary, from a worker that takes every step on its own
    one_by_one = worker("decode", paged(32), event_driven=False)
    one_by_one.push(request, 0.0)
    one_by_one.advance(math.inf)
    one_by_one.land(0, 0.0)
    while one_by_one.next_event_s() is not None:
        one_by_one.advance(math.inf)
        boundaries.append(one_by_one.clock_s)
    w = worker("decode", paged(32))
    w.push(request, 0.0)
    w.advance(math.inf)
    w.land(0, 0.0)
    horizon_s, num_turns = 0.0, 0
    while w.next_event_s() is not None:
        horizon_s = max(horizon_s, w.next_event_s()) + 0.1  # some five steps
        w.advance(horizon_s)
        k = boundaries.index(w.clock_s)
        assert k == 0 or boundaries[k - 1] <= horizon_s, "a step started after the horizon"
        num_turns += 1
    assert 1 < num_turns < len(boundaries)  # runs of steps, cut at each horizon
    assert w.finish().requests["num_generated"].tolist() == [60]
