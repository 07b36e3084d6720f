"""Each framework's admission rule as overrides (kvbench.validation.frameworks): the presets they
select load with the framework's defaults, run every request to its end, and take the place of a
replay's shared chunked-prefill scheduler."""

from __future__ import annotations

import pytest

from kvbench.api import build, run
from kvbench.errors import ConfigError
from kvbench.validation.frameworks import PRESETS, replace_scheduler, scheduler_overrides


def test_each_backend_selects_its_engine_preset():
    assert scheduler_overrides("vllm") == ["engine=vllm_v1"]
    assert scheduler_overrides("sglang") == ["engine=sglang"]
    assert scheduler_overrides("trtllm") == ["engine=trtllm"]


def test_the_limits_follow_each_framework_s_defaults_for_the_gpu():
    # vLLM's server: 8,192 tokens and 1,024 sequences on 70 GiB or more but an A100, else 2,048
    # and 256; SGLang's chunked_prefill_size: 8,192 below 160 GiB, 16,384 above; TRT-LLM: fixed
    assert scheduler_overrides("vllm", "h100_sxm") == ["engine=vllm_v1"]
    assert scheduler_overrides("vllm", "a100_sxm") == [
        "engine=vllm_v1",
        "scheduler.max_num_batched_tokens=2048",
        "scheduler.max_num_seqs=256",
    ]
    assert scheduler_overrides("sglang", "h200_sxm") == ["engine=sglang"]
    assert scheduler_overrides("sglang", "b200_sxm") == ["engine=sglang", "scheduler.max_num_batched_tokens=16384"]
    assert scheduler_overrides("trtllm", "gb200") == ["engine=trtllm"]


def test_an_unknown_system_is_one_line():
    with pytest.raises(ConfigError, match=r"^system='mi300x' has no hardware config; choose one of a100_sxm, "):
        scheduler_overrides("sglang", "mi300x")


def test_an_unknown_backend_is_one_line():
    with pytest.raises(
        ConfigError, match=r"^backend='tgi' has no scheduler preset; choose one of vllm, sglang, trtllm$"
    ):
        scheduler_overrides("tgi")


@pytest.mark.parametrize(
    ("backend", "scheduler", "options"),
    [
        (
            "vllm",
            "chunked",
            {"max_num_batched_tokens": 8192, "admission_reserve": "none", "full_prompt_admission": True},
        ),
        (
            "sglang",
            "prefill_first",
            {"max_num_batched_tokens": 8192, "chunked_prefill": True, "admission_reserve": "new_token_ratio"},
        ),
        (
            "trtllm",
            "mixed",
            {
                "max_num_batched_tokens": 8192,
                "max_num_seqs": 2048,
                "decodes_in_budget": True,
                "admission_reserve": "full_output",
            },
        ),
    ],
)
def test_each_preset_sets_the_framework_s_rule_and_default_limits(backend, scheduler, options):
    setup = build(scheduler_overrides(backend))
    assert setup.scheduler.name == scheduler
    for key, value in options.items():
        assert getattr(setup.scheduler.config, key) == value, key
    assert setup.scheduler.config.watermark_fraction == 0.0


@pytest.mark.parametrize("backend", sorted(PRESETS))
def test_each_rule_runs_every_request_to_its_end(backend):
    summary = run(
        [
            *scheduler_overrides(backend),
            "workload.num_requests=60",
            "hardware.kv_budget_bytes=2e9",
            "output.write=false",
        ]
    ).summary
    assert summary["engine"] == PRESETS[backend]
    assert summary["num_finished"] == 60


def test_where_kvbench_s_own_rule_preempts_guaranteed_no_evict_never_does():
    common = ["workload.num_requests=60", "hardware.kv_budget_bytes=2e9", "output.write=false"]
    assert run(common).summary["num_preemptions"] > 0
    assert run(["engine=trtllm", *common]).summary["num_preemptions"] == 0


def test_a_replay_s_shared_scheduler_is_swapped_for_the_framework_s():
    replay = [
        "model=llama3.1-8b",
        "scheduler=chunked",
        "scheduler.max_num_batched_tokens=8192",
        "scheduler.max_num_seqs=8",
    ]
    swapped = replace_scheduler(replay, "sglang")
    assert swapped == ["engine=sglang", "model=llama3.1-8b", "scheduler.max_num_seqs=8"]
    setup = build(swapped)
    assert setup.scheduler.name == "prefill_first" and setup.scheduler.config.max_num_seqs == 8
    # the replay's own sequence cap (per rank) still wins over the framework's default
    setup = build(replace_scheduler(replay, "vllm", "a100_sxm"))
    assert setup.scheduler.config.max_num_batched_tokens == 2048 and setup.scheduler.config.max_num_seqs == 8
