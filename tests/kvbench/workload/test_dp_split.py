"""One attention-DP rank's share of a deployment's requests (round robin in arrival order)."""

import numpy as np
import pytest

from kvbench.workload.dp_split import rank_share
from kvbench.workload.source import Workload


def _workload(n: int, **extra) -> Workload:
    return Workload(
        arrival_s=np.arange(n, dtype=np.float64),
        prompt_tokens=np.arange(1, n + 1, dtype=np.int64),
        output_tokens=np.full(n, 4, dtype=np.int64),
        s_max_tokens=np.arange(1, n + 1, dtype=np.int64) + 4,
        **extra,
    )


def test_one_rank_is_the_whole_workload():
    w = _workload(5, max_concurrency=3)
    assert rank_share(w, 1) is w


def test_ranks_split_round_robin_and_cover_every_request_once():
    w = _workload(10, max_concurrency=7)
    shares = [rank_share(w, 4, r) for r in range(4)]
    assert shares[0].prompt_tokens.tolist() == [1, 5, 9]
    assert sorted(np.concatenate([s.prompt_tokens for s in shares]).tolist()) == list(range(1, 11))
    # 7 in flight over 4 ranks: requests 0..6 go to ranks 0,1,2,3,0,1,2
    assert [s.max_concurrency for s in shares] == [2, 2, 2, 1]
    assert sum(s.num_requests for s in shares) == 10


def test_branches_and_hashes_follow_their_requests():
    w = _workload(
        4,
        num_branches=np.array([1, 2, 3, 1], dtype=np.int64),
        branch_output_tokens=np.array([4, 4, 3, 4, 2, 1, 4], dtype=np.int64),
        prefix_hashes=[(1,), (2,), (3,), (4,)],
        hash_block_tokens=16,
    )
    second = rank_share(w, 2, 1)
    assert second.num_branches.tolist() == [2, 1]
    assert second.branch_output_tokens.tolist() == [4, 3, 4]
    assert second.prefix_hashes == [(2,), (4,)]
    assert second.branch_output_tokens_per_request() == [(4, 3), (4,)]


def test_a_rank_outside_the_deployment_is_refused():
    with pytest.raises(ValueError, match="rank 2 is not one of 2 ranks"):
        rank_share(_workload(3), 2, 2)
