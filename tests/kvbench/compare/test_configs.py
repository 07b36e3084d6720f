"""Configs as compare matches them: a key kvbench added since compares as its old behaviour."""

from __future__ import annotations

from kvbench.compare.configs import ADDED_KEY_DEFAULTS, config_differences

OLD = {"scheduler": {"name": "mixed", "max_num_seqs": 1024}, "allocator": {"name": "paged"}, "progress": True}


def new(**changes):
    config = {
        "scheduler": {"name": "mixed", "max_num_seqs": 1024, "queue": "fcfs", "full_prompt_admission": False},
        "allocator": {"name": "paged"},
        "engine": {"name": "kvbench", "version": None, "null_block": False},
        "progress": False,
    }
    for key, value in changes.items():
        section, name = key.split("__")
        config[section][name] = value
    return config


def test_a_folder_written_before_a_key_existed_matches_the_key_at_its_old_behaviour():
    assert config_differences(OLD, new()) == []


def test_a_new_key_set_to_something_else_is_a_difference():
    assert config_differences(OLD, new(engine__null_block=True)) == ["engine.null_block: False -> True"]
    assert config_differences(OLD, new(scheduler__queue="priority")) == ["scheduler.queue: fcfs -> priority"]


def test_every_added_key_is_a_real_option_at_its_default():
    from kvbench_plugins.allocators.paged import PagedConfig
    from kvbench_plugins.workloads.synthetic import SyntheticConfig

    from kvbench.app.config import EngineConfig
    from kvbench.deploy.config import DeploymentConfig
    from kvbench.sched.scheduler import SchedulerConfig

    defaults = {
        "engine": EngineConfig(),
        "scheduler": SchedulerConfig(),
        "allocator": PagedConfig(),
        "deployment": DeploymentConfig(),
        "workload": SyntheticConfig(),
    }
    for key, value in ADDED_KEY_DEFAULTS.items():
        section, name = key.split(".")
        assert getattr(defaults[section], name) == value, key


def test_an_aggregated_run_is_matched_without_the_keys_only_a_disaggregated_run_reads():
    deployed = new()
    deployed["deployment"] = {"name": "aggregated", "decode_workers": 3, "link": "network"}
    deployed["router"] = {"name": "least_loaded"}
    assert config_differences(OLD, deployed) == []
    # a disaggregated run's worker counts and router are compared: they change its numbers
    one, two = ({**deployed, "deployment": {"name": "disagg", "decode_workers": n}} for n in (1, 2))
    assert config_differences(one, two) == ["deployment.decode_workers: 1 -> 2"]
    assert config_differences(OLD, one)[0] == "deployment.decode_workers: - -> 1"
