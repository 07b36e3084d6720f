"""A run of a model with MLA, windows or linear-attention state: the paged block size follows the
model unless the user sets it, every allocator that holds state gets it, one that cannot is
refused in one line, and the tables carry each kind's bytes."""

from __future__ import annotations

import pytest

from kvbench.api import build, run
from kvbench.errors import ConfigError

SMALL = ["hardware=h200-sxm", "workload.num_requests=40", "progress=false", "output.write=false"]


def test_an_mla_model_gets_64_token_blocks_unless_told_otherwise():
    assert build(["model=deepseek-v3", "allocator=paged", *SMALL]).allocator.block_size_tokens == 64
    assert build(["model=llama3-8b", "allocator=paged", *SMALL]).allocator.block_size_tokens == 16
    told = build(["model=deepseek-v3", "allocator=paged", "allocator.block_size_tokens=32", *SMALL])
    assert told.allocator.block_size_tokens == 32


@pytest.mark.parametrize("allocator", ["naive", "per_request", "paged"])
def test_every_state_holding_allocator_gets_the_models_state(allocator):
    s = build(["model=qwen3.5-397b-a17b", f"allocator={allocator}", *SMALL])
    assert s.allocator.state_bytes_per_request == s.model.state_bytes_per_request > 0


def test_an_allocator_without_state_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="cannot hold the per-request state") as info:
        build(["model=qwen3.5-397b-a17b", "allocator=vattention", *SMALL])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("allocator", ["naive", "paged"])
def test_a_run_with_state_reports_it_and_finishes_every_request(allocator):
    overrides = ["model=qwen3.5-397b-a17b", f"allocator={allocator}", *SMALL]
    s = run(overrides).summary
    assert s["num_finished"] == 40
    state = build(overrides).model.state_bytes_per_request
    assert s["peak_state_bytes"] > 0 and s["peak_state_bytes"] % state == 0
    assert s["frac_state"] > 0 and s["peak_full_bytes"] > 0
