"""The lecture's "Numbers worth memorizing" table, entry by entry: each repeats a number derived in
§10.2-§10.6, so its fan-out, swap and TPOT entries are those sections' own specs, keyed ``mem_``."""

from __future__ import annotations

from kvbench.studies.paper.document import Section
from kvbench.studies.paper.lecture_capacity import (
    naive_concurrency_spec,
    naive_token_gb_spec,
    naive_utilization_spec,
    paged_concurrency_spec,
    paging_gain_spec,
)
from kvbench.studies.paper.lecture_numbers import (
    GB,
    KIB,
    LECTURE_B,
    LECTURE_BUDGET_GB,
    TABLE_ENTRY_BYTES,
    Numbers,
)
from kvbench.studies.paper.lecture_preemption import swap_specs
from kvbench.studies.paper.lecture_rows import Spec, from_run, section
from kvbench.studies.paper.lecture_sharing import fan_out_specs
from kvbench.studies.paper.lecture_sizing import tpot_specs


def memorize(n: Numbers) -> Section:
    return section(
        "Numbers worth memorizing",
        "Numbers worth memorizing",
        "The lecture's summary table, entry by entry (each repeats a number derived in §10.2-§10.6).",
        [
            *_capacity_specs(n),
            *_block_specs(n),
            *fan_out_specs(n, "mem"),
            *swap_specs(n, "mem"),
            *tpot_specs(n, "mem"),
        ],
    )


def _capacity_specs(n: Numbers) -> list[Spec]:
    """Naive against paged: utilization, concurrency and the multiplier."""
    kv, budget = n.kv, n.budget
    return [
        naive_utilization_spec(
            n,
            "mem_naive_utilization",
            "naive utilization, 640-token workload, S_max = 4K",
            why="Decimal KB in the lecture (0.328 GB per sequence); see §10.2's naive_utilization_4k.",
        ),
        naive_token_gb_spec(
            n,
            "mem_naive_token_gb",
            "the tokens' GB in '9.5 of 62.5 GB'",
            why=f"29 x 0.328 GB (decimal KB) in the lecture. The run's peak token bytes are its own peak (at most "
            f"{n.seq - 1} KV tokens per sequence, not all at once), not {n.naive_n} full sequences.",
        ),
        Spec("mem_kv_budget_gb", "the budget in '9.5 of 62.5 GB'", "GB", "62.5 GB", f"{budget:,} B", budget / GB),
        naive_utilization_spec(
            n,
            "mem_naive_utilization_32k",
            "the same at S_max = 32K",
            why=f"The lecture's 15.2 % / {n.s_max_32k // n.s_max} ignores that only {n.naive_32k_n} slots of "
            f"{n.s_max_32k * kv / GB:.1f} GB fit ({budget / (n.s_max_32k * kv):.1f} rounded down).",
            s_max_32k=True,
        ),
        naive_concurrency_spec(n, "mem_naive_concurrency", "concurrency, naive"),
        paged_concurrency_spec(
            n,
            "mem_paged_concurrency",
            "concurrency, paged",
            why=f"{budget / GB:g}e9 B hold {n.blocks_total:,} blocks of {n.block} x {kv / KIB:g} KiB, "
            f"{n.blocks_per_seq} per sequence; 62.5 GiB would give {LECTURE_BUDGET_GB * 2**30 / (n.seq * kv):.0f}.",
        ),
        paging_gain_spec(
            "mem_paged_over_naive",
            "naive -> paged multiplier",
            "6.9x",
            n.paged_n,
            n.naive_n,
            why=f"199 / 29 in the lecture; kvbench's {n.paged_n} / {n.naive_n}.",
        ),
    ]


def _block_specs(n: Numbers) -> list[Spec]:
    """Blocks of 16: the tail, the waste it costs, and the block table of a 4K sequence."""
    kv, budget = n.kv, n.budget
    w16 = n.tail_waste_pct(n.block)
    entries = n.s_max // n.block
    table_kib = entries * TABLE_ENTRY_BYTES / KIB
    return [
        Spec("mem_tail_max_b16", "largest tail, b_blk = 16", "tokens", "≤15 tokens", f"{n.block} - 1", n.block - 1),
        Spec(
            "mem_tail_mean_b16",
            "mean tail, b_blk = 16",
            "tokens",
            "mean 8",
            f"{n.block} / 2",
            n.tail_tokens(n.block),
            from_run(n.runs, n.paged_overrides, "mean_tail_waste_tokens_per_seq"),
            why="The run's mean unfilled slots per running sequence, time-weighted while memory binds: "
            f"{n.paged_run['mean_tail_waste_tokens_per_seq']:.1f}, the "
            "exact (b-1)/2 for lengths uniform over a block.",
        ),
        Spec(
            "mem_tail_pct_b16",
            "internal fragmentation at b_blk = 16, B = 199",
            "% of budget",
            "1.3%",
            f"{LECTURE_B} x {n.tail_tokens(n.block):g} x {kv:,} / {budget:,} = {w16:.2f} %",
            w16,
        ),
        Spec(
            "mem_table_entries",
            "block-table entries of a 4K sequence",
            "entries",
            "256 entries",
            f"{n.s_max:,} / {n.block} = {entries}",
            entries,
        ),
        Spec(
            "mem_table_kib",
            "block-table bytes of a 4K sequence",
            "KiB",
            "≈ 2",
            f"{entries} x {TABLE_ENTRY_BYTES} B = {entries * TABLE_ENTRY_BYTES:,} B = {table_kib:g} KiB",
            table_kib,
            why=f"The lecture prints '≈ 2 KB': {entries} entries of {TABLE_ENTRY_BYTES} bytes (int64). vLLM's block "
            f"tables hold int32, which would make it {entries * 4 / KIB:g} KiB.",
        ),
        Spec(
            "mem_table_per_kv_gb",
            "the KV a 4K sequence's table maps",
            "GB",
            "2.1 GB",
            f"{n.s_max:,} x {kv:,} B = {n.kv_4k / GB:.3f} GB",
            n.kv_4k / GB,
        ),
    ]
