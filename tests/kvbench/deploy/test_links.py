"""The KV link: hand-computed transfer times, one transfer after another, the layer-by-layer
overlap's bounds, which link a deployment gets, and a link with no bandwidth refused."""

from __future__ import annotations

import pytest
from kvbench_cli import assert_one_line_error, kvbench

from kvbench.api import compose, hardware_spec
from kvbench.deploy.config import DeploymentConfig
from kvbench.deploy.links import FifoKvLink, link_for
from kvbench.errors import ConfigError

TOL = dict(rel=1e-9, abs=1e-12)


def link(bytes_per_s=1e9, latency_s=0.0, overlap="after_prefill"):
    return FifoKvLink(bytes_per_s=bytes_per_s, latency_s=latency_s, source="test", overlap=overlap)


def hardware(name):
    return hardware_spec(compose([f"hardware={name}"])[0])


def test_after_prefill_transfers_run_one_after_another():
    kv = link(bytes_per_s=1e9, latency_s=1e-3)
    # 2 MB at 1 GB/s: 2 ms on the wire from ready_s (the decode side reserved at 1.0 s), +1 ms latency
    first = kv.schedule(2_000_000, ready_s=1.0, prefill_start_s=0.5, prefill_end_s=0.9, num_layers=32)
    assert (first.start_s, first.end_s, first.kv_bytes) == (pytest.approx(1.0, **TOL), pytest.approx(1.003), 2_000_000)
    # ready earlier, but the wire is busy until 1.002 s (the latency does not hold it)
    second = kv.schedule(1_000_000, ready_s=0.5, prefill_start_s=0.2, prefill_end_s=0.8, num_layers=32)
    assert second.start_s == pytest.approx(1.002, **TOL) and second.end_s == pytest.approx(1.004, **TOL)
    # an idle wire: the transfer waits only for its own readiness; no bytes cost only the latency
    third = kv.schedule(0, ready_s=2.0, prefill_start_s=1.0, prefill_end_s=1.5, num_layers=32)
    assert third.start_s == pytest.approx(2.0, **TOL) and third.end_s == pytest.approx(2.001, **TOL)


def test_after_prefill_never_starts_before_the_prompt_is_computed():
    moved = link().schedule(1_000_000, ready_s=0.1, prefill_start_s=0.2, prefill_end_s=0.3, num_layers=4)
    assert moved.start_s == pytest.approx(0.3, **TOL) and moved.end_s == pytest.approx(0.301, **TOL)


def test_layerwise_on_a_fast_link_ends_one_layer_after_the_prefill():
    # 4 layers of 1 MB each at 1 GB/s: 1 ms each, computed every 10 ms over [0, 40 ms]
    moved = link(overlap="layerwise").schedule(
        4_000_000, ready_s=0.0, prefill_start_s=0.0, prefill_end_s=0.04, num_layers=4
    )
    assert moved.start_s == pytest.approx(0.01, **TOL) and moved.end_s == pytest.approx(0.041, **TOL)


def test_layerwise_on_a_slow_link_sends_back_to_back_from_the_first_layer():
    # 20 ms a layer on the wire, 10 ms a layer of prefill: the wire is the bottleneck from layer 1 on
    moved = link(bytes_per_s=5e7, latency_s=2e-3, overlap="layerwise").schedule(
        4_000_000, ready_s=0.0, prefill_start_s=0.0, prefill_end_s=0.04, num_layers=4
    )
    assert moved.start_s == pytest.approx(0.01, **TOL) and moved.end_s == pytest.approx(0.01 + 0.08 + 0.002, **TOL)


@pytest.mark.parametrize(
    "kv_bytes, bytes_per_s, start_s, end_s, layers",
    [
        (4_000_000, 1e9, 0.0, 0.04, 4),
        (4_000_000, 5e7, 0.0, 0.04, 4),
        (6_400_000, 2e8, 1.0, 1.03, 32),
        (10**9, 5e10, 0.0, 0.1, 80),
    ],
)
def test_layerwise_lies_between_its_bounds_and_never_after_the_whole_transfer(
    kv_bytes, bytes_per_s, start_s, end_s, layers
):
    layerwise = link(bytes_per_s, overlap="layerwise").schedule(
        kv_bytes, ready_s=0.0, prefill_start_s=start_s, prefill_end_s=end_s, num_layers=layers
    )
    after = link(bytes_per_s).schedule(
        kv_bytes, ready_s=0.0, prefill_start_s=start_s, prefill_end_s=end_s, num_layers=layers
    )
    wire_s, layer_s = kv_bytes / bytes_per_s, (end_s - start_s) / layers
    # evenly spaced layers on an idle wire: the last layer lands after the prefill plus its own bytes,
    # or after the first layer plus every byte, whichever is later
    assert layerwise.end_s == pytest.approx(max(end_s + wire_s / layers, start_s + layer_s + wire_s), rel=1e-9)
    assert layerwise.end_s <= after.end_s + 1e-12 and after.end_s == pytest.approx(end_s + wire_s, rel=1e-9)


def test_layerwise_waits_for_the_decode_side_and_for_the_transfer_before_it():
    kv = link(overlap="layerwise")
    late = kv.schedule(4_000_000, ready_s=1.0, prefill_start_s=0.0, prefill_end_s=0.04, num_layers=4)
    assert late.start_s == pytest.approx(1.0, **TOL) and late.end_s == pytest.approx(1.004, **TOL)
    queued = kv.schedule(2_000_000, ready_s=0.0, prefill_start_s=0.5, prefill_end_s=1.0, num_layers=2)
    # its layers were computed at 0.75 s and 1.0 s, but the wire is busy until 1.004 s
    assert queued.start_s == pytest.approx(1.004, **TOL) and queued.end_s == pytest.approx(1.006, **TOL)


def test_auto_picks_nvlink_within_one_domain_and_the_network_beyond():
    h100, gb200, disagg = hardware("h100-sxm"), hardware("gb200"), DeploymentConfig(name="disagg")
    within = link_for(h100, disagg, prefill_gpus=4, decode_gpus=4)
    assert (within.kind, within.bytes_per_s, within.latency_s) == ("nvlink", 450e9, 10e-6)
    assert "hardware config nvlink_bytes_per_s (h100-sxm)" in within.source
    across = link_for(h100, disagg, prefill_gpus=8, decode_gpus=8)
    assert (across.kind, across.bytes_per_s) == ("network", 50e9)
    assert link_for(gb200, disagg, prefill_gpus=8, decode_gpus=8).bytes_per_s == 900e9  # an NVL72 rack
    # 450 MB of one GPU's KV over H100 NVLink: 1 ms on the wire, 10 us latency
    moved = within.schedule(450_000_000, ready_s=0.0, prefill_start_s=0.0, prefill_end_s=0.0, num_layers=32)
    assert moved.end_s == pytest.approx(1e-3 + 10e-6, **TOL)


def test_the_deployment_s_link_settings_win_over_the_hardware_s():
    h100 = hardware("h100-sxm")
    forced = link_for(h100, DeploymentConfig(name="disagg", link="network"), prefill_gpus=1, decode_gpus=1)
    assert (forced.kind, forced.bytes_per_s) == ("network", 50e9)
    given = DeploymentConfig(name="disagg", link_bytes_per_s=1e9, link_latency_s=0.0, transfer="layerwise")
    chosen = link_for(h100, given, prefill_gpus=1, decode_gpus=1)
    assert (chosen.bytes_per_s, chosen.latency_s, chosen.overlap) == (1e9, 0.0, "layerwise")
    assert "deployment.link_bytes_per_s" in chosen.source and "deployment.link_latency_s" in chosen.source


def test_each_gpu_sends_its_own_shard_and_fewer_decode_gpus_receive_more_each():
    h100, disagg = hardware("h100-sxm"), DeploymentConfig(name="disagg")
    # the ledger's bytes are one GPU's: equal or wider decode TP keeps the per-GPU rate
    assert link_for(h100, disagg, prefill_gpus=2, decode_gpus=4, prefill_tp=2, decode_tp=4).bytes_per_s == 450e9
    # 4 prefill shards into 2 decode GPUs: each receives 2 shards through its one link
    assert link_for(h100, disagg, prefill_gpus=4, decode_gpus=2, prefill_tp=4, decode_tp=2).bytes_per_s == 225e9


@pytest.mark.parametrize("bytes_per_s", [0.0, -1.0, float("inf"), float("nan")])
def test_a_link_with_no_bandwidth_is_refused_in_one_line(bytes_per_s):
    with pytest.raises(ConfigError) as refused:
        FifoKvLink(bytes_per_s=bytes_per_s, latency_s=0.0, source="hardware config nvlink_bytes_per_s", kind="nvlink")
    assert "zero bandwidth" in str(refused.value) and "\n" not in str(refused.value)


def test_a_bad_call_is_a_programming_error():
    with pytest.raises(ValueError):
        link().schedule(1, ready_s=0.0, prefill_start_s=0.0, prefill_end_s=1.0, num_layers=0)


@pytest.mark.parametrize(
    "arg, fragment",
    [("hardware.nvlink_bytes_per_s=0", "hardware.nvlink_bytes_per_s=0"), ("hardware.nvlink_domain_gpus=0", "positive")],
)
def test_the_cli_refuses_a_hardware_link_with_no_bandwidth(tmp_path, arg, fragment):
    proc = kvbench("deployment=disagg", arg, "workload.num_requests=5", "progress=false", cwd=tmp_path)
    assert_one_line_error(proc, fragment, status=2)
