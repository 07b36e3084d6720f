"""engine.step_overhead_s: the engine's host work per step, added to every simulated step."""

from __future__ import annotations

import pytest

from kvbench.api import run
from kvbench.errors import ConfigError

RUN = [
    "model=llama3.1-8b",
    "hardware=h100-sxm",
    "kernel=vllm_fa3",
    "workload=closed_loop",
    "workload.max_concurrency=2",
    "workload.num_requests=2",
    "workload.prompt_tokens=256",
    "workload.output_tokens=8",
    "workload.s_max_tokens=264",
    "progress=false",
    "output.write=false",
]


def test_the_overhead_is_added_once_per_step():
    base = run(RUN)
    slow = run([*RUN, "engine.step_overhead_s=0.002"])
    assert base.summary["step_overhead_s"] == 0.0 and slow.summary["step_overhead_s"] == 0.002
    steps = int(base.steps["num_steps"].sum())
    assert steps == int(slow.steps["num_steps"].sum())
    assert slow.summary["duration_s"] - base.summary["duration_s"] == pytest.approx(0.002 * steps, rel=1e-9)


@pytest.mark.parametrize("value", ["-0.001", "2"])
def test_a_bad_overhead_is_one_line(value):
    with pytest.raises(ConfigError, match="engine.step_overhead_s") as info:
        run([*RUN, f"engine.step_overhead_s={value}"])
    assert "\n" not in str(info.value)
