"""kvbench's sweeper (hydra/sweeper=kvbench, kvbench/app/sweep_jobs.py): a sweep over a config group
whose options have keys of their own runs each option with the keys it has, once per distinct job,
in Hydra's basic sweeper's order; anything else is Hydra's cross product unchanged."""

from __future__ import annotations

import pytest
import yaml
from hydra import initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from kvbench_cli import kvbench

from kvbench.app.config import KvbenchConfig
from kvbench.app.searchpath import register as register_searchpath
from kvbench.app.sweep_jobs import sweep_jobs
from kvbench.app.sweep_progress import sweep_size

#: a group's options and their keys, as the option files would say
KEYS = {
    ("allocator", "paged"): frozenset({"name", "block_size_tokens", "prefix_caching"}),
    ("allocator", "vattention"): frozenset({"name", "page_size_bytes", "map_ahead"}),
    ("allocator", "naive"): frozenset({"name", "s_max_tokens"}),
    ("allocator", "layered"): None,  # an option with its own defaults list: its keys are not read
}


def jobs(*args: str) -> list[list[str]]:
    return sweep_jobs(OverridesParser.create().parse_overrides(list(args)), lambda g, o: KEYS.get((g, o)))


def test_each_option_runs_with_the_keys_it_has_once():
    assert jobs("allocator=paged,vattention", "allocator.page_size_bytes=65536,2097152") == [
        ["allocator=paged"],
        ["allocator=vattention", "allocator.page_size_bytes=65536"],
        ["allocator=vattention", "allocator.page_size_bytes=2097152"],
    ]
    # both options' keys swept: 2 + 2 jobs of the 8 in the cross product; other keys stay crossed
    assert jobs("allocator=paged,vattention", "allocator.block_size_tokens=16,32", "seed=0,1") == [
        ["allocator=paged", "allocator.block_size_tokens=16", "seed=0"],
        ["allocator=paged", "allocator.block_size_tokens=16", "seed=1"],
        ["allocator=paged", "allocator.block_size_tokens=32", "seed=0"],
        ["allocator=paged", "allocator.block_size_tokens=32", "seed=1"],
        ["allocator=vattention", "seed=0"],
        ["allocator=vattention", "seed=1"],
    ]


def test_a_sweep_without_options_of_their_own_is_the_cross_product():
    assert jobs("allocator=naive,paged", "seed=0,1") == [
        ["allocator=naive", "seed=0"],
        ["allocator=naive", "seed=1"],
        ["allocator=paged", "seed=0"],
        ["allocator=paged", "seed=1"],
    ]
    assert jobs("seed=0") == [["seed=0"]]


def test_a_key_no_picked_option_has_is_left_for_hydra_to_refuse():
    # one option picked: nothing to tell it from, Hydra refuses the key as for a single run
    assert jobs("allocator=paged", "allocator.page_size_bytes=65536,2097152") == [
        ["allocator=paged", "allocator.page_size_bytes=65536"],
        ["allocator=paged", "allocator.page_size_bytes=2097152"],
    ]
    # a misspelled key belongs to no option: every job keeps it
    assert jobs("allocator=naive,paged", "allocator.blok_size_tokens=32") == [
        ["allocator=naive", "allocator.blok_size_tokens=32"],
        ["allocator=paged", "allocator.blok_size_tokens=32"],
    ]
    # the group's default option (not named on the command line) is not a choice to drop against
    assert jobs("allocator.page_size_bytes=65536", "seed=0,1") == [
        ["allocator.page_size_bytes=65536", "seed=0"],
        ["allocator.page_size_bytes=65536", "seed=1"],
    ]


def test_a_key_added_on_purpose_or_an_unreadable_option_is_kept():
    assert jobs("allocator=paged,vattention", "+allocator.page_size_bytes=65536") == [
        ["allocator=paged", "+allocator.page_size_bytes=65536"],
        ["allocator=vattention", "+allocator.page_size_bytes=65536"],
    ]
    assert jobs("allocator=layered,vattention", "allocator.page_size_bytes=65536") == [
        ["allocator=layered", "allocator.page_size_bytes=65536"],
        ["allocator=vattention", "allocator.page_size_bytes=65536"],
    ]


@pytest.fixture
def loader():
    """Hydra's config loader, set up as ``kvbench`` sets it up."""
    ConfigStore.instance().store(name="kvbench_schema", node=KvbenchConfig)
    register_searchpath()
    with initialize_config_module("kvbench.conf", version_base="1.3"):
        yield GlobalHydra.instance().config_loader()


def test_the_progress_counts_the_sweepers_jobs(loader):
    args = ["allocator=paged,vattention", "allocator.page_size_bytes=65536,2097152"]
    config = loader.load_configuration("config", args, run_mode=RunMode.MULTIRUN, validate_sweep_overrides=False)
    assert config.hydra.sweeper._target_ == "hydra_plugins.kvbench_sweeper.KvbenchSweeper"
    assert sweep_size(config) == (3, ("allocator", "allocator.page_size_bytes"))


def test_paging_and_vattention_at_two_page_sizes_in_one_command(tmp_path):
    proc = kvbench(
        "-m",
        "allocator=paged,vattention",
        "allocator.page_size_bytes=65536,2097152",
        "workload.num_requests=20",
        "progress=false",
        "output.steps=false",
        "output.figures=false",
        "hydra.sweep.dir=sweep",
        "hydra.sweeper.max_batch_size=2",  # launched in two batches, numbered on across them
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("kvbench comparison (3 jobs)"), proc.stdout
    allocators = []
    for num in range(3):
        config = yaml.safe_load((tmp_path / "sweep" / str(num) / ".hydra" / "config.yaml").read_text())
        allocators.append((config["allocator"]["name"], config["allocator"].get("page_size_bytes")))
    assert allocators == [("paged", None), ("vattention", 65536), ("vattention", 2097152)]
