"""The differential check's memory check: refused in one line before either side holds a request."""

from __future__ import annotations

import pytest

from kvbench.app import checks
from kvbench.commands.common import compose_checked
from kvbench.errors import ConfigError
from kvbench.validation import differential


def test_the_estimate_grows_with_tokens_and_is_refused_past_what_is_available(monkeypatch):
    monkeypatch.setattr(checks, "_available_memory_bytes", lambda: 10**9)
    nano = {"num_requests": 2_000, "peer": "nano_vllm"}
    differential.check_memory(prompt_tokens=1_000_000, output_tokens=100_000, **nano)  # about 0.35 GB
    with pytest.raises(ConfigError) as refused:
        differential.check_memory(
            prompt_tokens=10_000_000, output_tokens=1_000_000, num_requests=20_000, peer="nano_vllm"
        )
    line = str(refused.value)
    assert "the differential check of 20,000 requests needs about 1.2 GB" in line
    assert "10,000,000 prompt tokens x 86 B" in line and "check_memory=false" in line


def test_each_peer_has_its_own_need_and_no_peer_takes_the_larger(monkeypatch):
    # vLLM's imports alone are 675 MB measured (850 MB counted): what passes against nano-vllm may not
    monkeypatch.setattr(checks, "_available_memory_bytes", lambda: 6 * 10**8)
    differential.check_memory(prompt_tokens=1_000_000, output_tokens=100_000, num_requests=2_000, peer="nano_vllm")
    for peer in ("vllm_v1", None):
        with pytest.raises(ConfigError, match="850 MB \\+ 1,000,000 prompt tokens x 102 B"):
            differential.check_memory(prompt_tokens=1_000_000, output_tokens=100_000, num_requests=2_000, peer=peer)


def test_the_check_comes_before_the_requests_are_made(monkeypatch):
    # 1 GB available: the run's own check (250 MB + 700 B a request) passes, the differential's does not
    monkeypatch.setattr(checks, "_available_memory_bytes", lambda: 10**9)
    made = []
    monkeypatch.setattr(differential, "requests_from_workload", lambda *a: made.append(a) or [])
    cfg = compose_checked(["engine=vllm_v1", "workload.num_requests=20000"])[0]
    with pytest.raises(ConfigError, match="the differential check of 20,000 requests needs about"):
        differential.prepare(cfg)
    assert not made


def test_check_memory_false_lets_it_through(monkeypatch):
    monkeypatch.setattr(checks, "_available_memory_bytes", lambda: 10**9)
    cfg = compose_checked(["engine=vllm_v1", "workload.num_requests=20000", "check_memory=false"])[0]
    assert len(differential.prepare(cfg).requests) == 20_000
