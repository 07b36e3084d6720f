"""Hydra's own errors about a command line, each turned into one line naming what is allowed."""

from __future__ import annotations

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from kvbench.api import compose
from kvbench.app.overrides import hydra_error_line, with_suggestion
from kvbench.app.run import setup


def error_line(*overrides: str) -> str:
    with pytest.raises((HydraException, OmegaConfBaseException)) as info:
        compose(list(overrides))
    line = hydra_error_line(info.value, overrides)
    assert "\n" not in line
    return line


def test_an_unknown_option_lists_the_group_s_options():
    assert error_line("allocator=pagd") == (
        "allocator='pagd' is not a known allocator; did you mean `paged`? choose one of: "
        "naive, orca_max, orca_oracle, orca_pow2, paged, paged_cached, per_request, vattention"
    )


@pytest.mark.parametrize(
    "override, meant",
    [
        ("kernel=trito", "triton"),
        ("workload=sharegpt_lik", "sharegpt_like"),
        ("scheduler=chunk", "chunked"),
        ("engine=vllm", "vllm_v1"),
    ],
)
def test_a_near_miss_option_gets_a_suggestion_and_the_list(override, meant):
    group = override.split("=")[0]
    line = error_line(override)
    assert f"is not a known {group}; did you mean `{meant}`? choose one of: " in line
    assert meant in line.split("choose one of: ")[1].split(", ")


def test_a_key_of_another_option_of_the_group_names_its_owners():
    # a run of paged with a key only vattention has: the line names the owner, and the sweep over
    # both that gives the key to vattention's jobs only (kvbench's sweeper)
    assert error_line("allocator=paged", "allocator.page_size_bytes=65536").startswith(
        "allocator.page_size_bytes=65536 is not a config key: 'page_size_bytes' is not in allocator (paged); "
        "it is a key of allocator=vattention: set it in a run of that one, or sweep allocator over it too "
        "(kvbench -m allocator=paged,vattention allocator.page_size_bytes=65536); its keys are: name, block_size_tokens"
    )
    line = error_line("allocator=naive", "allocator.block_size_tokens=32")
    assert "it is a key of allocator=paged and allocator=paged_cached: " in line
    # the suggested sweep keeps the option the command line picked, not the allocator it names
    line = error_line("allocator=orca_pow2", "allocator.block_size_tokens=32")
    assert "(kvbench -m allocator=orca_pow2,paged,paged_cached allocator.block_size_tokens=32)" in line


def test_an_option_far_from_every_name_gets_only_the_list():
    assert error_line("allocator=zzz") == (
        "allocator='zzz' is not a known allocator; choose one of: "
        "naive, orca_max, orca_oracle, orca_pow2, paged, paged_cached, per_request, vattention"
    )


@pytest.mark.parametrize(
    "override, meant",
    [
        ("allocator.blok=3", "allocator.block_size_tokens"),  # a word of the key, not the whole
        ("slo.tpot=0.05", "slo.tpot_s"),
        ("alocator=paged", "allocator"),  # a group's name, at the top level
        ("sed=1", "seed"),
    ],
)
def test_a_near_miss_key_gets_a_suggestion_and_the_keys(override, meant):
    line = error_line(override)
    assert f"did you mean `{meant}`? its keys are: " in line and line.startswith(f"{override} is not a config key")


def test_an_unknown_key_lists_the_keys_of_its_node():
    line = error_line("allocator=naive", "allocator.block_size_tokens=32")
    assert line.startswith(
        "allocator.block_size_tokens=32 is not a config key: 'block_size_tokens' is not in allocator (naive)"
    )
    assert "its keys are: name, s_max_tokens" in line and "+allocator.block_size_tokens=32" in line


def test_an_unknown_top_level_key():
    assert "'foo' is not in the top level; its keys are: model, hardware" in error_line("foo=1")


def test_a_value_of_the_wrong_type_names_the_type():
    assert error_line("seed=abc") == "seed=abc is invalid: Value 'abc' of type 'str' could not be converted to Integer"


def test_an_unparsable_override_is_named():
    line = error_line("seed=1", "allocator=[a")
    assert line.startswith("'allocator=[a' is not a valid override") and "override_grammar" in line


@pytest.mark.parametrize(
    "message, suggested",
    [
        (
            "preemption.victim='newst' is invalid: choose one of newest, least_progress, cost_aware, lowest_priority",
            "preemption.victim='newst' is invalid: did you mean `newest`? "
            "choose one of newest, least_progress, cost_aware, lowest_priority",
        ),
        (
            "scheduler.queue='fcf' is not a registered queue; choose one of: fcfs, priority, shortest_prompt",
            "scheduler.queue='fcf' is not a registered queue; did you mean `fcfs`? "
            "choose one of: fcfs, priority, shortest_prompt",
        ),
        (  # the list is not a sentence of its own: the suggestion goes beside the value
            "WANDB_MODE (environment)='ofline' is invalid: unset it or choose one of offline, online, disabled",
            "WANDB_MODE (environment)='ofline' (did you mean `offline`?) is invalid: "
            "unset it or choose one of offline, online, disabled",
        ),
        # nothing close, not a choice, not a string: unchanged
        ("mode='zzz' is invalid: choose one of sim, real", None),
        ("seed=-1 is invalid: use an integer from 0 to 2**63-1", None),
        ("workload.num_requests=0 is invalid: choose one of 1, 2", None),
    ],
)
def test_a_near_miss_value_of_a_choice_gets_a_suggestion(message, suggested):
    assert with_suggestion(message) == (message if suggested is None else suggested)


def test_every_refused_choice_is_worded_as_with_suggestion_reads_it():
    # the checks live beside their keys, and the suggestion is added where the line is printed
    from kvbench.app.config import WandbConfig
    from kvbench.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        WandbConfig(mode="ofline").validate()
    assert "did you mean `offline`? choose one of offline" in with_suggestion(str(info.value))
    with pytest.raises(ConfigError) as info:
        setup(compose(["preemption.victim=newst"])[0])
    assert "did you mean `newest`? choose one of newest" in with_suggestion(str(info.value))


def test_a_launcher_that_is_an_extra_says_how_to_install_it():
    from hydra.errors import MissingConfigException

    from kvbench.app.overrides import hydra_error_line

    missing = MissingConfigException("not found", missing_cfg_file="hydra/launcher/joblib", options=["basic"])
    assert hydra_error_line(missing) == (
        "hydra/launcher='joblib' is not a known hydra/launcher; it comes with an extra: "
        "pip install -e '.[joblib]' in a clone (pip install 'kvbench[joblib]' otherwise) (docs/launchers.md); "
        "choose one of: basic"
    )
    slurm = MissingConfigException("not found", missing_cfg_file="hydra/launcher/submitit_slurm", options=["basic"])
    assert "pip install -e '.[submitit]' in a clone (pip install 'kvbench[submitit]' otherwise)" in hydra_error_line(
        slurm
    )
