"""The deployment's loop with its real routers and links: random layouts, routers, transfer modes
and link speeds lose no request and leak no block, each worker's ledger sums to its budget at
every step, and every request's path runs in order; a router that names a worker the deployment
lacks is refused in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
from deploy_workers import check_deployment, paged, worker
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.app.disagg import build_router
from kvbench.core.request import Request
from kvbench.deploy.links import FifoKvLink
from kvbench.deploy.loop import Deployment, kv_in_flight
from kvbench.errors import ConfigError

ROUTERS = ("round_robin", "least_loaded", "prefix_aware")


def link(bytes_per_s: float, overlap: str, latency_s: float = 0.0) -> FifoKvLink:
    return FifoKvLink(bytes_per_s=bytes_per_s, latency_s=latency_s, source="test", overlap=overlap)


def deploy(requests, *, num_prefill, num_decode, router, transfer, bytes_per_s, decode_blocks, max_in_flight=None):
    prefill = [worker("prefill", paged(64, prefix_caching=router == "prefix_aware")) for _ in range(num_prefill)]
    decode = [worker("decode", paged(decode_blocks)) for _ in range(num_decode)]
    deployment = Deployment(
        prefill,
        decode,
        build_router({"name": router}),
        [link(bytes_per_s, transfer) for _ in prefill],
        transfer=transfer,
        num_layers=2,
        max_in_flight=max_in_flight,
    )
    return prefill, decode, deployment.run(requests)


def check_paths(requests, record) -> None:
    """Every request's path through the deployment, in the order it must happen."""
    p = record.paths.to_pandas().set_index("request_id")
    assert sorted(p.index) == sorted(r.request_id for r in requests)
    assert (p["prefill_start_s"] >= p["arrival_s"]).all()
    assert (p["prefill_end_s"] > p["prefill_start_s"]).all()
    assert (p["transfer_end_s"] >= p["prefill_end_s"]).all(), "the KV landed before its prompt was computed"
    assert (p["transfer_end_s"] >= p["decode_admitted_s"]).all(), "the KV landed before its blocks were reserved"
    assert (p["first_token_s"] > p["transfer_end_s"]).all(), "a first token before the KV landed"
    assert (p["finish_s"] >= p["first_token_s"]).all()
    assert (p["kv_transfer_bytes"] > 0).all()


@settings(max_examples=30, deadline=None)
@given(
    num_prefill=st.integers(1, 3),
    num_decode=st.integers(1, 3),
    router=st.sampled_from(ROUTERS),
    transfer=st.sampled_from(("after_prefill", "layerwise")),
    bytes_per_s=st.sampled_from((1e3, 1e5, 1e30)),
    decode_blocks=st.integers(24, 60),
    closed=st.booleans(),
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 30), st.floats(0, 0.05)), min_size=1, max_size=12),
)
def test_random_deployments_lose_nothing_and_leak_nothing(
    num_prefill, num_decode, router, transfer, bytes_per_s, decode_blocks, closed, lengths
):
    arrival_s = np.cumsum([gap for _, _, gap in lengths])
    requests = [
        Request(
            i,
            float(t),
            prompt,
            prompt + output,
            (output,),
            prefix_hashes=tuple(range(prompt // 4)),
            hash_block_tokens=4,
        )
        for i, ((prompt, output, _), t) in enumerate(zip(lengths, arrival_s))
    ]
    prefill, decode, record = deploy(
        requests,
        num_prefill=num_prefill,
        num_decode=num_decode,
        router=router,
        transfer=transfer,
        bytes_per_s=bytes_per_s,
        decode_blocks=decode_blocks,
        max_in_flight=3 if closed else None,
    )
    check_paths(requests, record)
    check_deployment(requests, prefill, decode, None, [*record.prefill, *record.decode])


def test_the_link_prices_what_the_loop_sends():
    """A slow link: each transfer takes its bytes over the bandwidth, one after another on a link."""
    requests = [Request(i, 0.0, 16, 20, (4,)) for i in range(3)]
    _, _, record = deploy(
        requests,
        num_prefill=1,
        num_decode=1,
        router="round_robin",
        transfer="after_prefill",
        bytes_per_s=1e4,
        decode_blocks=60,
    )
    p = record.paths.to_pandas().sort_values("transfer_start_s")
    took_s = (p["transfer_end_s"] - p["transfer_start_s"]).to_numpy()
    assert np.allclose(took_s, p["kv_transfer_bytes"].to_numpy() / 1e4, rtol=1e-12)
    starts, ends = p["transfer_start_s"].to_numpy(), p["transfer_end_s"].to_numpy()
    assert (starts[1:] >= ends[:-1] - 1e-12).all(), "two transfers shared one link at once"
    times, in_flight = kv_in_flight(record.paths)
    assert in_flight.max() == p["kv_transfer_bytes"].max()  # one at a time
    assert in_flight[-1] == 0


def test_layerwise_transfers_hide_behind_the_prefill():
    """Decode first: the blocks are reserved before the prompt is computed, so a link fast enough
    for a layer per layer's compute lands the KV right after the last layer."""
    requests = [Request(0, 0.0, 32, 40, (4,))]
    _, _, after = deploy(
        requests,
        num_prefill=1,
        num_decode=1,
        router="round_robin",
        transfer="after_prefill",
        bytes_per_s=1e6,
        decode_blocks=60,
    )
    _, _, layer = deploy(
        requests,
        num_prefill=1,
        num_decode=1,
        router="round_robin",
        transfer="layerwise",
        bytes_per_s=1e6,
        decode_blocks=60,
    )
    a, w = after.paths.to_pandas().iloc[0], layer.paths.to_pandas().iloc[0]
    assert w["decode_admitted_s"] <= w["prefill_start_s"]
    exposed_after = a["transfer_end_s"] - a["prefill_end_s"]
    exposed_layer = w["transfer_end_s"] - w["prefill_end_s"]
    assert math.isclose(exposed_after, a["kv_transfer_bytes"] / 1e6, rel_tol=1e-9)
    assert exposed_layer < exposed_after


class _Stray:
    name = "stray"

    def route(self, request, role, workers):
        return len(workers) + 4


def test_a_router_that_names_a_missing_worker_is_refused_in_one_line():
    prefill, decode = [worker("prefill", paged(64))], [worker("decode", paged(64))]
    deployment = Deployment(prefill, decode, _Stray(), [link(1e9, "after_prefill")], num_layers=2)
    with pytest.raises(ConfigError, match=r"router 'stray' named prefill worker 5; the deployment has 1") as info:
        deployment.run([Request(0, 0.0, 8, 12, (4,))])
    assert "\n" not in str(info.value)


def test_a_deployment_without_decode_workers_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="at least one prefill and one decode worker"):
        Deployment(
            [worker("prefill", paged(64))],
            [],
            build_router({"name": "round_robin"}),
            [link(1e9, "after_prefill")],
            num_layers=2,
        )


def test_fan_outs_are_refused_in_one_line():
    prefill, decode = [worker("prefill", paged(64))], [worker("decode", paged(64))]
    deployment = Deployment(
        prefill, decode, build_router({"name": "round_robin"}), [link(1e9, "after_prefill")], num_layers=2
    )
    with pytest.raises(ConfigError, match="one completion per request"):
        deployment.run([Request(0, 0.0, 8, 16, (4, 4))])
