"""The built-in routers' choices, and the one-line refusal of a router that names no worker."""

from __future__ import annotations

import pytest

from kvbench.app.disagg import build_router
from kvbench.core.request import Request
from kvbench.deploy.interfaces import WorkerView
from kvbench.deploy.routers import checked_route
from kvbench.errors import ConfigError

REQUEST = Request(request_id=0, arrival_s=0.0, prompt_tokens=64, s_max_tokens=80, branch_output_tokens=(16,))


def view(index, *, waiting=0, running=0, free=1000, cached=0, role="prefill"):
    return WorkerView(
        index=index,
        role=role,
        num_waiting=waiting,
        num_running=running,
        free_kv_bytes=free,
        cached_prefix_tokens=lambda request, n=cached: n,
    )


def router(name):
    return build_router({"name": name})


def test_round_robin_takes_each_worker_in_turn_with_one_turn_per_role():
    rr = router("round_robin")
    prefill = [view(i) for i in range(3)]
    decode = [view(i, role="decode") for i in range(2)]
    picks = []
    for _ in range(4):
        picks.append(("prefill", checked_route(rr, REQUEST, "prefill", prefill)))
        picks.append(("decode", checked_route(rr, REQUEST, "decode", decode)))
    assert [p for r, p in picks if r == "prefill"] == [0, 1, 2, 0]
    assert [p for r, p in picks if r == "decode"] == [0, 1, 0, 1]


def test_least_loaded_counts_waiting_and_running_then_free_bytes_then_index():
    ll = router("least_loaded")
    assert ll.route(REQUEST, "decode", [view(0, waiting=2), view(1, running=1), view(2, waiting=1, running=1)]) == 1
    # a tie on load: the most free KV bytes wins, whatever the list's order
    assert ll.route(REQUEST, "decode", [view(0, running=1, free=10), view(1, waiting=1, free=50)]) == 1
    assert ll.route(REQUEST, "decode", [view(1, waiting=1, free=50), view(0, running=1, free=10)]) == 1
    # a tie on both: the lowest index
    assert ll.route(REQUEST, "decode", [view(2, running=1), view(1, waiting=1)]) == 1


def test_prefix_aware_prefers_the_longest_cached_prefix_and_breaks_ties_by_load():
    pa = router("prefix_aware")
    assert pa.route(REQUEST, "prefill", [view(0, cached=16), view(1, cached=48, running=5), view(2)]) == 1
    # equal prefixes (or no prefix cache anywhere): as least_loaded routes
    assert pa.route(REQUEST, "prefill", [view(0, cached=32, running=2), view(1, cached=32, running=1)]) == 1
    assert pa.route(REQUEST, "prefill", [view(0, running=1, free=5), view(1, running=1, free=9)]) == 1


class _Wrong:
    name = "wrong"

    def __init__(self, answer):
        self.answer = answer

    def route(self, request, role, workers):
        return self.answer


@pytest.mark.parametrize("answer", [5, -1, 2, None, True, 1.0])
def test_a_router_that_names_no_worker_is_refused_in_one_line(answer):
    with pytest.raises(ConfigError) as refused:
        checked_route(_Wrong(answer), REQUEST, "decode", [view(0, role="decode"), view(1, role="decode")])
    message = str(refused.value)
    assert "\n" not in message
    assert f"router 'wrong' named decode worker {answer!r}; the deployment has 2" in message


def test_an_unknown_router_name_lists_the_routers():
    with pytest.raises(ConfigError, match="round_robin"):
        build_router({"name": "nearest"})
