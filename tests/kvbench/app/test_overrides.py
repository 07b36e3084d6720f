"""Hydra's own errors about a command line, each turned into one line naming what is allowed."""

from __future__ import annotations

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from kvbench.api import compose
from kvbench.app.overrides import hydra_error_line


def error_line(*overrides: str) -> str:
    with pytest.raises((HydraException, OmegaConfBaseException)) as info:
        compose(list(overrides))
    line = hydra_error_line(info.value, overrides)
    assert "\n" not in line
    return line


def test_an_unknown_option_lists_the_group_s_options():
    assert error_line("allocator=pagd") == (
        "allocator='pagd' is not a known allocator; choose one of: "
        "naive, orca_max, orca_oracle, orca_pow2, paged, paged_cached, per_request"
    )


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
