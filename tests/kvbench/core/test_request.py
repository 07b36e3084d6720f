"""A workload's requests are made when the run reaches them, and are the requests the rows say."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from kvbench.api import run
from kvbench.core.request import Request, RequestList, distinct_shapes, requests_from_workload
from kvbench.workload.source import Workload


def workload(**columns) -> Workload:
    n = 5
    base = dict(
        arrival_s=np.array([0.0, 0.5, 0.5, 1.25, 3.0]),
        prompt_tokens=np.array([16, 32, 16, 8, 16]),
        output_tokens=np.array([4, 8, 4, 2, 4]),
        s_max_tokens=np.array([64, 64, 64, 64, 64]),
    )
    base.update(columns)
    assert all(len(v) == n for k, v in base.items() if isinstance(v, np.ndarray) and k != "branch_output_tokens")
    return Workload(**base)


def eager(w: Workload, seed: int) -> list[Request]:
    """The requests as they were made before: every row at once, from the workload's columns."""
    branches = w.branch_output_tokens_per_request()
    hashes = w.prefix_hashes or [()] * w.num_requests
    granule = w.hash_block_tokens if w.prefix_hashes else 0
    priority = w.priority.tolist() if w.priority is not None else [0] * w.num_requests
    return [
        Request(i, a, p, s, o, w.beam_fork_probability, seed, tuple(h), granule, pr)
        for i, (a, p, s, o, h, pr) in enumerate(
            zip(w.arrival_s.tolist(), w.prompt_tokens.tolist(), w.s_max_tokens.tolist(), branches, hashes, priority)
        )
    ]


@pytest.mark.parametrize(
    "columns",
    [
        {},
        {"num_branches": np.array([1, 3, 1, 2, 1])},
        {
            "num_branches": np.array([1, 2, 1, 1, 2]),
            "branch_output_tokens": np.array([4, 8, 6, 4, 2, 4, 3]),
            "beam_fork_probability": 0.5,
        },
        {
            "priority": np.array([3, 0, 1, 0, 2]),
            "prefix_hashes": [(1, 2), (1,), (), (7,), (1, 2)],
            "hash_block_tokens": 8,
        },
    ],
)
def test_the_list_makes_exactly_the_requests_every_row_says(columns):
    w = workload(**columns)
    lazy = requests_from_workload(w, seed=7)
    assert isinstance(lazy, RequestList) and len(lazy) == 5
    assert list(lazy) == eager(w, 7) == lazy[0:5] == [lazy[i] for i in range(5)]
    assert lazy[-1] == lazy[4] and lazy[1:3] == eager(w, 7)[1:3]
    assert list(lazy.first_seq_ids) == np.concatenate(([0], np.cumsum(w.branches())[:-1])).tolist()
    with pytest.raises(IndexError):
        lazy[5]


def test_requests_carry_python_numbers_read_from_the_workloads_own_columns():
    """The list reads the workload's columns where they lie: a 100,000-request workload of one
    completion each costs it no copy of a column (8 B a request each; 800 kB here), and every
    request still carries plain Python numbers, not numpy scalars."""
    n = 100_000
    w = Workload(
        arrival_s=np.linspace(0.0, 50.0, n),
        prompt_tokens=np.full(n, 16, dtype=np.int64),
        output_tokens=np.arange(1, n + 1, dtype=np.int64),
        s_max_tokens=np.full(n, 2 * n, dtype=np.int64),
        priority=np.zeros(n, dtype=np.int64),
    )
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        lazy = requests_from_workload(w)
        held_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held_bytes < 8 * n / 4  # a few small objects, far below one column's copy
    last = lazy[n - 1]
    assert (last.request_id, last.prompt_tokens, last.branch_output_tokens, last.s_max_tokens) == (
        n - 1,
        16,
        (n,),
        2 * n,
    )
    assert last.arrival_s == 50.0 and type(last.arrival_s) is float and type(last.prompt_tokens) is int
    assert all(type(v) is int for v in (last.s_max_tokens, last.priority, *last.branch_output_tokens))
    assert list(lazy.first_seq_ids[:3]) == [0, 1, 2] and lazy.arrival_s[1] == w.arrival_s[1]
    # a column of another type is converted once, to the same numbers
    converted = requests_from_workload(Workload(**{**w.__dict__, "prompt_tokens": np.full(n, 16, dtype=np.int32)}))
    assert converted[7] == lazy[7] and type(converted[7].prompt_tokens) is int


@pytest.mark.parametrize(
    "hashes",
    [None, [(), (), (), (), ()], [(), (), (4, 5), (), ()], [(1, 2), (1,), (), (7,), (1, 2)]],
    ids=["no_column", "all_empty", "one", "most"],
)
def test_whether_any_request_has_prefix_hashes_is_what_the_requests_say(hashes):
    w = workload(prefix_hashes=hashes, hash_block_tokens=8 if hashes else 0)
    lazy = requests_from_workload(w)
    assert lazy.any_prefix_hashes() == any(r.prefix_hashes for r in eager(w, 0))


def test_one_request_of_each_shape_the_first_of_it_in_order():
    w = workload()
    shapes = distinct_shapes(requests_from_workload(w))
    # rows 0, 2 and 4 share (16, (4,), 64): the first of them stands for all three
    assert [r.request_id for r in shapes] == [0, 1, 3]
    assert [r.request_id for r in distinct_shapes(eager(w, 0))] == [0, 1, 3]


def test_a_finished_request_is_not_kept_by_the_run():
    """The run keeps a finished request's row, not its objects: what it holds grows with the
    requests in flight, not with the run. The loop runs with the cyclic collector off, so a
    recorded group must leave no cycle (group -> its sequences -> group) for reference counting to
    free it."""
    from kvbench.core.sequence import SequenceGroup
    from kvbench.metrics.recorder import Recorder

    recorder = Recorder(1)
    group = SequenceGroup(Request(0, 0.0, 8, 64, (4,)), 0)
    [seq] = group.seqs
    recorder.record_request(group)
    record = recorder.finish()
    assert group.seqs == [] and not gc.get_referents(group).count(seq), "no path from the group back to its sequence"
    assert record.requests["request_id"].tolist() == [0] and record.requests["prompt_tokens"].tolist() == [8]


def test_the_request_table_is_in_request_order_whatever_order_they_finished_in():
    s = run(["wandb.mode=disabled", "progress=false", "workload=lognormal", "workload.num_requests=60"])
    table = s.requests
    assert table["request_id"].tolist() == list(range(60))
    assert (table["finish_s"].diff().dropna() < 0).any(), "some request finished before an earlier one"
