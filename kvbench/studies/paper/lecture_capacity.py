"""What the KV budget holds on the chat workload, numbers several sections of the lecture check
again: naive's 29 sequences and the share of the budget their tokens fill (15.2 %; 1.9 % at S_max =
32K), paged's 199, and paging's multiplier. Each is one closed form and one run (or filled
allocator) wherever it is said; a section passes what it says differently: its key, its wording,
why its claim differs, and the formula where it shows more of the working."""

from __future__ import annotations

from kvbench.studies.paper.lecture_numbers import GB, Numbers, in_gb, pct
from kvbench.studies.paper.lecture_rows import Measured, Spec, filled, from_run


def naive_concurrency_spec(n: Numbers, key: str, quantity: str, formula: str | None = None) -> Spec:
    """The lecture's naive 29: ``floor(budget / (S_max x KV per token))`` sequences at S_max = 4,096,
    against how many 640-token sequences a fresh naive allocator takes (exactly)."""
    if formula is None:
        formula = f"floor({n.budget:,} / ({n.s_max:,} x {n.kv:,})) = {n.naive_n}"
    return Spec(key, quantity, "seqs", "29", formula, n.naive_n, filled(n.naive_overrides, n.seq, n.s_max), sim_tol=0.0)


def naive_token_gb_spec(n: Numbers, key: str, quantity: str, why: str) -> Spec:
    """The lecture's 9.5 GB: the naive allocator's sequences at their full 640 tokens, against the
    naive run's peak token bytes."""
    return Spec(
        key,
        quantity,
        "GB",
        "9.5",
        f"{n.naive_n} x {n.seq} x {n.kv:,} B = {n.naive_tokens_bytes / GB:.2f} GB",
        n.naive_tokens_bytes / GB,
        from_run(n.runs, n.naive_overrides, "peak_token_bytes", in_gb),
        why=why,
    )


def naive_utilization_spec(
    n: Numbers, key: str, quantity: str, why: str, s_max_32k: bool = False, formula: str | None = None
) -> Spec:
    """The lecture's naive utilization, 15.2 % at S_max = 4,096 (1.9 % at 32,768): the sequences a
    naive allocator holds, each at its full 640 tokens, over the budget; against the naive run's
    time-weighted utilization while memory binds."""
    if s_max_32k:
        claim, seqs, util, overrides = "1.9%", n.naive_32k_n, n.naive_32k_util, n.long_overrides
    else:
        claim, seqs, util, overrides = "15.2%", n.naive_n, n.naive_util, n.naive_overrides
    if formula is None:
        formula = f"{seqs} x {n.seq} x {n.kv:,} / {n.budget:,} = {pct(util):.2f} %"
    measured = from_run(n.runs, overrides, "utilization_saturated", pct)
    return Spec(key, quantity, "%", claim, formula, pct(util), measured, why=why)


def paged_concurrency_spec(
    n: Numbers, key: str, quantity: str, why: str, claim: str = "199", formula: str | None = None
) -> Spec:
    """The lecture's paged 199 (§10.2's 200): ``floor(blocks in the budget / blocks per sequence)`` in
    blocks of 16, against how many 640-token sequences a fresh paged allocator takes (exactly)."""
    if formula is None:
        formula = f"floor({n.blocks_total:,} / {n.blocks_per_seq}) = {n.paged_n}"
    measured = filled(n.paged_overrides, n.seq, n.s_max)
    return Spec(key, quantity, "seqs", claim, formula, n.paged_n, measured, sim_tol=0.0, why=why)


def paging_gain_spec(
    key: str, quantity: str, claim: str, paged: int, naive: int, why: str, measured: Measured | None = None
) -> Spec:
    """What paging multiplies concurrency by: ``paged / naive`` sequences (or sessions) the same
    budget holds."""
    gain = paged / naive
    return Spec(key, quantity, "x", claim, f"{paged} / {naive} = {gain:.2f}", gain, measured, why=why)
