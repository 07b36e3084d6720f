"""The lecture's Exercise 5, the agent ledger under GQA-8: how many 20-step agent sessions a card
holds, paged and with a 16K reservation, and what re-sending their prompts costs in prefill."""

from __future__ import annotations

from kvbench.studies.paper.document import Section
from kvbench.studies.paper.lecture_capacity import paging_gain_spec
from kvbench.studies.paper.lecture_numbers import GB, KIB, LECTURE_BUDGET_GB, Numbers, pct
from kvbench.studies.paper.lecture_rows import Spec, filled, section
from kvbench.studies.paper.lecture_setup import GQA8, blocks_for

#: Exercise 5's session: distinct tokens, and prompt tokens submitted over its 20 steps
DISTINCT_TOKENS, SUBMITTED_TOKENS = 7700, 97000
#: the naive reservation per session, tokens
SESSION_S_MAX_TOKENS = 16384
#: positions for a 16K session
POS_16K = ("model.hf_config.max_position_embeddings=16384",)


def exercise5(n: Numbers) -> Section:
    return section(
        "Exercise 5: the agent ledger under GQA-8",
        "Exercise 5",
        f"A 20-step agent session: {SUBMITTED_TOKENS:,} submitted prompt tokens, {DISTINCT_TOKENS:,} distinct.",
        [*_sessions_specs(n), *_prefill_specs(n)],
    )


def _sessions_specs(n: Numbers) -> list[Spec]:
    """Sessions per card: paged in 16-token blocks, and naive at a 16K reservation."""
    distinct, s_max = DISTINCT_TOKENS, SESSION_S_MAX_TOKENS
    peak = distinct * n.kv_gqa
    paged = ["allocator=paged", *GQA8, *POS_16K]
    per_block = n.block * n.kv_gqa
    blocks_total = n.budget // per_block
    sessions = blocks_total // blocks_for(distinct, n.block)
    naive = ["allocator=naive", f"allocator.s_max_tokens={s_max}", *GQA8, *POS_16K]
    n16 = n.budget // (s_max * n.kv_gqa)
    return [
        Spec(
            "ex5_peak_kv_gb",
            "peak KV of one session (7,700 tokens, GQA-8)",
            "GB",
            "0.985 GB",
            f"{distinct:,} x {n.kv_gqa:,} B = {peak / GB:.4f} GB",
            peak / GB,
            why=f"{distinct:,} x 128 decimal KB = {distinct * 128e3 / GB:.4f} GB; {distinct:,} x {n.kv_gqa / KIB:g} KiB "
            f"= {peak / GB:.4f} GB.",
        ),
        Spec(
            "ex5_sessions_paged",
            "sessions a card holds (paged, GQA-8)",
            "sessions",
            "≈ 63",
            f"floor(floor({n.budget:,} / {per_block:,}) / ceil({distinct:,} / {n.block})) = floor({blocks_total:,} / "
            f"{blocks_for(distinct, n.block)}) = {sessions}",
            sessions,
            filled(paged, distinct, distinct),
            sim_tol=0.0,
            why=f"The lecture's 62.5 / 0.985 = {LECTURE_BUDGET_GB / 0.985:.1f} uses decimal KB; with "
            f"{n.kv_gqa / KIB:g} KiB per token {n.budget / GB:g} / {peak / GB:.3f} = {n.budget / peak:.1f}, and "
            f"in whole {n.block}-token blocks {sessions} sessions.",
        ),
        Spec(
            "ex5_sessions_naive_16k",
            "sessions at a 16K S_max reservation (GQA-8)",
            "sessions",
            "29",
            f"floor({n.budget:,} / ({s_max:,} x {n.kv_gqa:,})) = {n16}",
            n16,
            filled(naive, distinct, s_max),
            sim_tol=0.0,
        ),
        paging_gain_spec(
            "ex5_paging_gain",
            "what paging is worth for agent sessions",
            "2.2x",
            sessions,
            n16,
            why=f"63 / 29 = {63 / 29:.2f} in the lecture; kvbench's {sessions} / {n16}.",
        ),
    ]


def _prefill_specs(n: Numbers) -> list[Spec]:
    """The prefill FLOPs and H100 time of re-sending the session's prompts, and the share re-sent."""
    distinct, submitted = DISTINCT_TOKENS, SUBMITTED_TOKENS
    g = n.gqa_model
    per_token = 2 * g.num_params
    per_token_mha = 2 * n.model.num_params
    gqa_why = (
        f"The lecture uses the MHA model's 2 N = {per_token_mha / 1e9:.2f} GFLOP per token ('Lecture 2's flat "
        f"weight term'); a GQA-8 Llama-2-7B has N = {g.num_params / 1e9:.2f}e9, so 2 N = "
        f"{per_token / 1e9:.2f} GFLOP."
    )
    att = 4 * g.num_layers * g.num_heads * g.head_dim * 16384
    pf = submitted * per_token
    t = pf / n.flops
    waste = (submitted - distinct) / submitted
    return [
        Spec(
            "ex5_weight_gflop_per_token",
            "the flat weight term 2 N per prefilled token",
            "GFLOP",
            "13.48",
            f"2 x {g.num_params:,} = {per_token / 1e9:.2f} GFLOP",
            per_token / 1e9,
            why=gqa_why,
        ),
        Spec(
            "ex5_attention_gflop_16k",
            "the attention term per token at 16,384 tokens of context",
            "GFLOP",
            "8.59",
            f"4 x {g.num_layers} x {g.num_heads} x {g.head_dim} x 16,384 = {att / 1e9:.2f} GFLOP",
            att / 1e9,
        ),
        Spec(
            "ex5_prefill_pflop",
            "prefill FLOPs of the session, weight term alone",
            "PFLOP",
            "1.31",
            f"{submitted:,} x {per_token / 1e9:.2f} GFLOP = {pf / 1e15:.3f} PFLOP",
            pf / 1e15,
            why=gqa_why + f" With 2 N = {per_token_mha / 1e9:.2f}: {submitted * per_token_mha / 1e15:.3f} PFLOP.",
        ),
        Spec(
            "ex5_prefill_s",
            "exclusive H100 time of that prefill",
            "s",
            "2.64 s",
            f"{pf / 1e15:.3f} PFLOP / {n.flops / 1e12:.1f} TFLOP/s = {t:.2f} s",
            t,
            why=gqa_why + f" With the MHA count: {submitted * per_token_mha / n.flops:.2f} s.",
        ),
        Spec(
            "ex5_prefill_waste",
            "share of the submitted prompt tokens that are re-sent",
            "%",
            "92%",
            f"({submitted:,} - {distinct:,}) / {submitted:,} = {pct(waste):.1f} %",
            pct(waste),
        ),
    ]
