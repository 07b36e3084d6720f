"""Builders and checks shared by the tests of a disaggregated deployment's workers and loop: small
paged workers over the tiny model, and the invariants every worker must keep."""

from __future__ import annotations

import numpy as np
import pandas as pd
from kvbench_plugins.allocators.paged import PagedAllocator, PagedConfig
from kvbench_plugins.preemption.recompute import RecomputePolicy
from kvbench_plugins.schedulers.chunked import ChunkedScheduler

from kvbench.core.ledger import LEDGER_FIELDS
from kvbench.deploy.worker import Admitted, Finished, FirstToken, Prefilled, Worker
from kvbench.testing import build_engine, check_invariants
from kvbench.testing.schedulers import TINY_MODEL

KV = TINY_MODEL.kv_bytes_per_token  # 64 bytes a token
BLOCK = 4  # tokens a block of the paged workers below


def paged(budget_blocks: int, prefix_caching: bool = False) -> PagedAllocator:
    config = PagedConfig(BLOCK, prefix_caching=prefix_caching)
    return PagedAllocator(config, budget_bytes=budget_blocks * BLOCK * KV, kv_bytes_per_token=KV)


def worker(role, allocator, *, event_driven=True, scheduler=ChunkedScheduler, policy=RecomputePolicy) -> Worker:
    config = scheduler.Config(max_num_seqs=8, max_num_batched_tokens=64)
    engine = build_engine(scheduler, policy, allocator, scheduler_config=config, event_driven=event_driven)
    return Worker(engine.scheduler, engine.executor, role=role, event_driven=event_driven)


def check_worker(w: Worker) -> None:
    """The allocator agrees with the scheduler about every sequence it holds: running, swapped
    out (none on the device), reserved for a transfer, or held for one; its ledger sums to the budget."""
    s = w.scheduler
    live = [seq for g in s.running for seq in g.held_seqs()]
    live += [g.seqs[0] for g in s._reserved.values()]
    num_tokens = {seq.seq_id: seq.num_computed_tokens for seq in live}
    finals = {seq.seq_id: seq.end_tokens - 1 for seq in live}
    for seq_id, _ in s.held_kv.values():
        num_tokens[seq_id] = s.allocator.num_tokens(seq_id)
        finals[seq_id] = num_tokens[seq_id]
    check_invariants(s.allocator, num_tokens, finals)


def check_deployment(requests, prefill, decode, events, records) -> None:
    ids = sorted(r.request_id for r in requests)
    outputs = {r.request_id: r.max_output_tokens for r in requests}
    for kind in (Prefilled, Admitted, FirstToken, Finished) if events is not None else ():  # (None: not kept)
        assert sorted(e.request_id for _, e in events if isinstance(e, kind)) == ids, kind.__name__
    for w, record in zip([*prefill, *decode], records):
        r = record.requests
        if w.role == "prefill":
            assert (r["num_generated"] == 1).all()
        else:
            assert r["num_generated"].tolist() == [outputs[i] for i in r["request_id"]]
            assert (r["first_token_s"] > r["admitted_s"]).all() and (r["finish_s"] >= r["first_token_s"]).all()
        steps = record.steps
        total = steps[list(LEDGER_FIELDS)].sum(axis=1).to_numpy()
        budget = w.scheduler.allocator.budget_bytes
        assert np.allclose(total, budget, rtol=1e-12, atol=0), "a step's ledger does not sum to the budget"
        assert (total[(steps["num_steps"] == 1).to_numpy()] == budget).all()
        assert steps["num_computed_tokens"].sum() == r["num_computed_tokens"].sum()
        assert w.scheduler.allocator.ledger().allocated_bytes == 0, "memory was not given back"
        assert not w.scheduler.held_kv and not w.scheduler.num_awaiting_kv()
        assert w.scheduler.host_pool.used_bytes == 0
    decoded = pd.concat([rec.requests for w, rec in zip([*prefill, *decode], records) if w.role == "decode"])
    assert sorted(decoded["request_id"]) == ids, "a request was lost or decoded twice"
