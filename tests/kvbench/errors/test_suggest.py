"""``did you mean ...?``: the names a near miss most likely meant."""

from __future__ import annotations

import pytest

from kvbench.errors.suggest import did_you_mean, near_misses

SUBCOMMANDS = ["bench-kernels", "calibrate", "compare", "diff-engine", "paper", "profiles", "slo-batch", "slo-search"]


@pytest.mark.parametrize(
    "word, names, meant",
    [
        ("pagd", ["naive", "paged", "paged_cached", "per_request"], ["paged"]),  # the whole name wins
        ("trito", ["sglang_triton", "torch", "triton"], ["triton"]),
        ("sharegpt_lik", ["sharegpt", "sharegpt_like"], ["sharegpt_like"]),  # a clearly worse one is left out
        ("blok", ["name", "block_size_tokens", "prefix_caching"], ["block_size_tokens"]),  # one word of it
        ("compar", SUBCOMMANDS, ["compare"]),
        ("slo_batch", SUBCOMMANDS, ["slo-batch"]),
        ("slo", SUBCOMMANDS, ["slo-batch", "slo-search"]),  # equally close: both
        ("Compare", SUBCOMMANDS, ["compare"]),  # case is ignored
        ("zzz", SUBCOMMANDS, []),
        ("s", ["s_max_tokens", "seed"], []),  # too short to mean anything
        # a name cut short at a word's end first (edit distance alone offers h200 for h100)
        ("h100", ["a100-40gb", "a100-80gb", "h100-sxm", "h200"], ["h100-sxm", "h200"]),
        ("a100", ["a100-40gb", "a100-80gb", "h100-sxm", "h200"], ["a100-40gb", "a100-80gb"]),
        ("llama2", ["llama2-7b-32k", "llama2-7b", "opt-13b"], ["llama2-7b", "llama2-7b-32k"]),
    ],
)
def test_near_misses(word, names, meant):
    assert near_misses(word, names) == meant


def test_did_you_mean_is_one_phrase():
    assert did_you_mean("newst", ["newest", "least_progress"]) == "did you mean `newest`?"
    assert did_you_mean("slo", SUBCOMMANDS) == "did you mean `slo-batch` or `slo-search`?"
    assert (
        did_you_mean("blok", ["block_size_tokens"], prefix="allocator.")
        == "did you mean `allocator.block_size_tokens`?"
    )
    assert did_you_mean("zzz", SUBCOMMANDS) == ""
    assert did_you_mean("ab", ["abc", "abd", "abe"]) == "did you mean `abc`, `abd` or `abe`?"
