"""§10.3 of the lecture: PagedAttention's blocks and block tables, its block-size table cell by cell,
and the instructor notes' 15.2 % -> 98.7 % and 29 -> 199."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from kvbench.studies.paper.document import Section
from kvbench.studies.paper.lecture_capacity import paged_concurrency_spec
from kvbench.studies.paper.lecture_numbers import (
    GB,
    KIB,
    LECTURE_B,
    LECTURE_BUDGET_GB,
    MB,
    SWEEP_BLOCKS,
    Numbers,
    block_overrides,
    pct,
)
from kvbench.studies.paper.lecture_rows import Spec, from_run, printed_table, section


@dataclass(frozen=True)
class BlockTableRow:
    """One row of §10.3's block-size table as the lecture prints it."""

    #: mean tail waste per sequence
    tail: str
    #: the same in MB (the lecture leaves it out for 1-token blocks)
    tail_mb: str | None
    #: tail waste at B = 199, % of the budget
    waste: str
    #: block-table entries of a 4,096-token sequence
    entries: str
    #: the kernel's contiguous run
    contiguous_run: str
    #: why the waste cell follows from no reading of the units, where it does not
    waste_slip: str = ""


#: §10.3's block-size table, by block size in tokens
LECTURE_BLOCK_TABLE = {
    1: BlockTableRow("0", None, "0%", "4,096", "1 token"),
    16: BlockTableRow("8 tokens", "4.0 MB", "1.3%", "256", "16 tokens"),
    64: BlockTableRow(
        "32 tokens",
        "16.0 MB",
        "4.8%",
        "64",
        "64 tokens",
        waste_slip="The lecture's own Exercise 3 gives 5.1 % for the same quantity (199 x 16.0 MB = 3.18 GB); "
        "4.8 % follows from neither.",
    ),
    256: BlockTableRow(
        "128 tokens",
        "64.0 MB",
        "17.0%",
        "16",
        "256 tokens",
        waste_slip="Exercise 3 gives 20.4 % for the same quantity (199 x 64.0 MB = 12.7 GB); 17.0 % follows "
        "from neither.",
    ),
}


def s10_3(n: Numbers) -> Section:
    specs, table = printed_table(
        LECTURE_BLOCK_TABLE,
        partial(_block, n),
        "lecture_block_size_table",
        "§10.3's block-size table by kvbench's closed forms "
        f"(waste at the lecture's B = {LECTURE_B}; MB = 1e6 B), beside the lecture's printed cells",
        {"mean_tail_MB": 2, "waste_at_B199_pct": 2, "mean_tail_tokens": 1},
    )
    return section(
        "§10.3 PagedAttention: the KV cache as virtual memory",
        "§10.3",
        "Blocks of b_blk tokens and a block table per sequence; the block-size table; the instructor "
        "notes' 15.2 % -> 98.7 % and 29 -> 199.",
        [*specs, *_paged_specs(n)],
        [table],
    )


def _block(n: Numbers, b: int, cells: BlockTableRow) -> tuple[list[Spec], dict]:
    """One row of the block-size table: a spec per cell with a number, and the table's line (kvbench's
    closed forms beside the lecture's cells)."""
    blocks = tuple(LECTURE_BLOCK_TABLE)
    t = n.tail_tokens(b)
    swept = b in SWEEP_BLOCKS  # kvbench's paged allocator takes 8 to 256
    if swept:
        tail_why = (
            "The lecture's 'about b_blk/2'; for a length uniform over a block's positions it is (b-1)/2 = "
            f"{(b - 1) / 2:g}. The run's mean unfilled slots per sequence on the {n.seq}-token chat workload "
            f"also count slots booked ahead, and {n.seq} is a multiple of "
            f"{max(c for c in blocks if n.seq % c == 0)} but not of {min(c for c in blocks if n.seq % c)}, "
            "so it is not this average."
        )
    else:
        tail_why = (
            f"Block size 1 has no tail; kvbench's paged allocator takes {min(SWEEP_BLOCKS)} to {max(SWEEP_BLOCKS)}."
        )
    specs = [
        Spec(
            f"table_b{b}_tail_tokens",
            f"mean tail waste per sequence, b_blk = {b}",
            "tokens",
            cells.tail,
            f"1-token blocks are always full: {t:g}" if b == 1 else f"b_blk / 2 = {b} / 2 = {t:g}",
            t,
            from_run(n.runs, block_overrides(b), "mean_tail_waste_tokens_per_seq") if swept else None,
            why=tail_why,
        )
    ]
    if cells.tail_mb is not None:
        mb = t * n.kv / MB
        specs.append(
            Spec(
                f"table_b{b}_tail_mb",
                f"mean tail waste per sequence in bytes, b_blk = {b}",
                "MB",
                cells.tail_mb,
                f"{t:g} x {n.kv:,} B = {mb:.2f} MB",
                mb,
                why=f"The lecture counts MiB: {t:g} x {n.kv / KIB:g} KiB = {t * n.kv / 2**20:g} MiB, printed as MB; "
                f"in decimal MB it is {mb:.2f}.",
            )
        )
    w = n.tail_waste_pct(b)
    waste_why = ""
    if cells.waste_slip:
        waste_why = (
            f"{LECTURE_B} x {t:g} x {n.kv / KIB:g} KiB = {LECTURE_B * t * n.kv / GB:.2f} GB = {w:.2f} % "
            f"of {n.budget / GB:g} GB. " + cells.waste_slip
        )
    entries = n.s_max // b
    return [
        *specs,
        Spec(
            f"table_b{b}_waste_pct",
            f"tail waste at B = {LECTURE_B}, b_blk = {b}",
            "% of budget",
            cells.waste,
            f"{LECTURE_B} x {t:g} x {n.kv:,} B / {n.budget:,} B = {w:.2f} %",
            w,
            why=waste_why,
        ),
        Spec(
            f"table_b{b}_table_entries",
            f"block-table entries of a 4,096-token sequence, b_blk = {b}",
            "entries",
            cells.entries,
            f"{n.s_max:,} / {b} = {entries:,}",
            entries,
        ),
        Spec(
            f"table_b{b}_contiguous_run",
            f"the kernel's contiguous run, b_blk = {b}",
            "tokens",
            cells.contiguous_run,
            f"b_blk = {b}",
            b,
        ),
    ], {
        "block_tokens": b,
        "mean_tail_tokens": t,
        "mean_tail_MB": t * n.kv / MB,
        "waste_at_B199_pct": w,
        "table_entries_4k": entries,
        "contiguous_run_tokens": b,
        "lecture_tail": cells.tail,
        "lecture_waste": cells.waste,
    }


def _paged_specs(n: Numbers) -> list[Spec]:
    """Paging at blocks of 16: the largest tail, the utilization and concurrency it gives."""
    util_paged = 100 - n.tail_waste_pct(n.block)
    intensity = n.quad / n.kv
    return [
        Spec(
            "tail_max_tokens_b16",
            "largest unfilled tail of a sequence's last block, b_blk = 16",
            "tokens",
            "15",
            f"b_blk - 1 = {n.block - 1}",
            n.block - 1,
        ),
        Spec(
            "paged_utilization",
            "paged utilization (instructor notes: 15.2% -> 98.7%)",
            "%",
            "98.7%",
            f"100 - {LECTURE_B} x {n.block // 2} x {n.kv:,} B / {n.budget:,} B = {util_paged:.2f} %",
            util_paged,
            from_run(n.runs, n.paged_overrides, "utilization_saturated", pct),
            why="The lecture's 98.7 % is 100 % less the mean tail of 8 tokens per sequence at B = 199 (1.3 %); it "
            f"holds with kvbench's bytes. At kvbench's ceiling of {n.paged_n} the same form gives "
            f"{100 - n.tail_waste_pct(n.block, n.paged_n):.2f} %; the paged run's time-weighted utilization while "
            f"memory binds is {pct(n.paged_run['utilization_saturated']):.1f} % (sequences are admitted and finish "
            "between steps).",
        ),
        paged_concurrency_spec(
            n,
            "paged_concurrency_199",
            "paged concurrency (instructor notes: 29 -> 199)",
            formula=f"floor({n.blocks_total:,} blocks / {n.blocks_per_seq} per sequence) = {n.paged_n}",
            why=f"See §10.2's packed_concurrency: a 62.5 GiB budget ({LECTURE_BUDGET_GB * 2**30 / GB:.1f}e9 B) would "
            f"hold exactly {LECTURE_BUDGET_GB * 2**30 / (n.seq * n.kv):.0f} sequences of "
            f"{n.seq} x {n.kv / KIB:g} KiB, and the lecture's 199 is one less; kvbench's allocator holds {n.paged_n} "
            f"in {n.budget / GB:g}e9 B.",
        ),
        Spec(
            "kv_per_token_kib",
            "KV bytes per token (unchanged by paging)",
            "KiB",
            "512 KiB",
            f"2 x {n.model.num_layers} layers x {n.model.num_kv_heads} heads x {n.model.head_dim} x "
            f"{n.model.dtype_bytes} B = {n.kv:,} B = {n.kv / KIB:g} KiB",
            n.kv / KIB,
        ),
        Spec(
            "attention_intensity",
            "decode attention's arithmetic intensity (MHA)",
            "FLOP/byte",
            "1 FLOP/byte",
            f"4 x L x H x d / KV bytes per token = {n.quad:,} / {n.kv:,} = {intensity:g}",
            intensity,
        ),
    ]
