"""The one catalogue of what a summary key means: every record names a key runs really write,
every view takes its words from it, and the vocabulary of formats is one."""

from __future__ import annotations

import pytest

from kvbench.api import run
from kvbench.metrics import catalogue
from kvbench.metrics.display import format_summary, show_value
from kvbench.output.figures import LEDGER
from kvbench.output.report import COLUMN_GROUPS, SETTINGS

SMALL = ["wandb.mode=disabled", "progress=false", "workload.num_requests=40"]


@pytest.fixture(scope="module")
def summaries():
    plain = run([*SMALL, "hardware.kv_budget_bytes=2e9"]).summary  # preempts
    swapped = run([*SMALL, "hardware.kv_budget_bytes=2e9", "preemption=swap"]).summary
    cached = run([*SMALL, "workload.shared_prefix_tokens=256", "allocator.prefix_caching=true"]).summary
    # prompts sharing less than a block: the summary says why the hit rate is 0
    short = run([*SMALL, "workload.shared_prefix_tokens=8", "allocator.prefix_caching=true"]).summary
    # a host tier for evicted prefix blocks writes its own keys
    host = run(
        [*SMALL, "workload.shared_prefix_tokens=256", "allocator.prefix_caching=true", "allocator.host_cache_bytes=1e9"]
    ).summary
    # an allocator that maps pages on demand writes the page-mapping keys
    vattention = run([*SMALL, "allocator=vattention"]).summary
    # a model with sliding-window and full-attention layers writes its KV-cache groups' keys
    hybrid = run(
        [*SMALL, "model=gemma3-12b", "model.hf_config.sliding_window=256", "hardware.kv_budget_bytes=5e9"]
    ).summary
    # a closed-loop client, a measured kernel's tables and a trace write keys of their own
    closed = run([*SMALL, "workload=closed_loop"]).summary
    measured = run([*SMALL, "kernel=trtllm"]).summary
    trace = run([*SMALL, "workload=azure_code"]).summary
    # linear-attention state (its groups under paged) and MLA latents with a sparse indexer
    state = run([*SMALL, "model=qwen3.5-397b-a17b", "hardware=h200-sxm"]).summary
    latent = run([*SMALL, "model=glm-5", "hardware=h200-sxm"]).summary
    return plain, swapped, cached, short, host, vattention, hybrid, closed, measured, trace, state, latent


def test_every_record_names_a_key_some_run_writes(summaries):
    written = set().union(*summaries) | {"slo"}  # the comparison adds a job's SLOs from its config
    dead = [m.key for m in (*catalogue.SETTINGS, *catalogue.METRICS, *catalogue.DETAILS) if m.key not in written]
    assert not dead, f"catalogued keys no run writes: {dead}"


def test_every_number_a_run_writes_has_the_catalogue_s_words(summaries):
    """kvbench compare lists every numeric key: none of them reads as a bare key."""
    numbers = {key for summary in summaries for key, value in summary.items() if not isinstance(value, str)}
    assert not sorted(numbers - set(catalogue.BY_KEY)), "numeric summary keys without a catalogue record"


def test_the_views_take_their_words_from_the_catalogue():
    for _, columns, _ in COLUMN_GROUPS:
        for column in columns:
            m = catalogue.metric(column.key)
            assert (column.name, column.unit, column.fmt) == (m.header, m.header_unit, m.show)
    assert [c.key for c in SETTINGS] == [m.key for m in catalogue.SETTINGS]
    assert [(legend, colour) for _, legend, colour in LEDGER] == [
        (m.legend, m.colour) for m in catalogue.ledger_parts()
    ]


def test_the_full_list_is_the_catalogue_s_order_and_words(summaries):
    plain = summaries[0]
    labels = [label for label, _ in format_summary(plain)]
    expected = [m.label for m in catalogue.METRICS if m.key in plain]
    assert labels[: len(expected)] == expected


@pytest.mark.parametrize(
    "value, how, shown",
    [(0.0123, "ms", "12.3"), (0.25, "pct", "25.0"), (12345, "int", "12,345"), (62.5e9, "bytes", "62.5 GB"),
     ("x", "text", "x"), (3.14159, "{:,.2f}", "3.14"), (float("nan"), "ms", "n/a")],
)  # fmt: skip
def test_one_vocabulary_of_formats(value, how, shown):
    assert show_value(value, how) == shown


def test_vllm_names_are_unique_and_cover_its_result_file():
    names = [m.vllm for m in catalogue.METRICS if m.vllm]
    assert len(names) == len(set(names))
    assert {"num_prompts", "completed", "duration", "request_throughput", "request_goodput", "output_throughput",
            "median_ttft_ms", "p99_tpot_ms", "mean_ttft_ms"} <= set(names)  # fmt: skip
