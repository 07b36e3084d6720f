"""§10.6 and §10.7 of the lecture: TTFT's three terms, TPOT set by the batch, the largest batch a
20 ms TPOT SLO allows, and the closing 7x of paging over reserve-to-S_max. The TPOT numbers come
back in "Numbers worth memorizing" (:func:`tpot_specs`)."""

from __future__ import annotations

import math

import pandas as pd

from kvbench.api import slo_batch
from kvbench.studies.paper.document import Section, Table
from kvbench.studies.paper.lecture_capacity import paged_concurrency_spec, paging_gain_spec
from kvbench.studies.paper.lecture_numbers import (
    GB,
    KIB,
    LECTURE_B,
    LECTURE_NAIVE_N,
    LECTURE_SEQ_GB,
    LECTURE_WEIGHTS_GB,
    TPOT_SLO_S,
    Numbers,
    in_ms,
    ttft_overrides,
)
from kvbench.studies.paper.lecture_rows import Measured, Spec, from_run, ratio, section
from kvbench.studies.paper.runs import command


def s10_6(n: Numbers) -> Section:
    tr = n.runs(ttft_overrides()).summary
    seq_gb = n.seq * n.kv / GB
    ttft = [
        Spec(
            "ttft_prefill_ms",
            "the prefill term of TTFT: 4,096 tokens at 50% of peak",
            "ms",
            "129 ms",
            f"prefill_time_s(4,096) = {n.recompute_4k_s * 1e3:.1f} ms",
            n.recompute_4k_s * 1e3,
            from_run(n.runs, ttft_overrides(), "prefill_compute_mean_s", in_ms),
            sim_tol=1e-6,
            why="The run (4,096-token prompts, Poisson arrivals at 4/s) measures each request's own prefill compute "
            f"(prefill_compute_mean_s). Its TTFT splits into scheduling delay {tr['sched_delay_mean_s'] * 1e3:.1f} ms, "
            f"queueing {tr['queue_mean_s'] * 1e3:.1f} ms and the prefill step {tr['prefill_mean_s'] * 1e3:.1f} ms "
            "(the step also carries other sequences' decodes).",
        ),
        Spec(
            "ttft_sched_delay_bound_ms",
            "scheduling delay: at most one step",
            "ms",
            "≤22.6 ms",
            f"one ambient decode step = {n.ambient_tpot_s * 1e3:.2f} ms",
            n.ambient_tpot_s * 1e3,
            from_run(n.runs, ttft_overrides(), "sched_delay_mean_s", in_ms),
            why="The bound is one decode step of Lecture 2's operating point (see §10.5's ambient_tpot_ms), and holds "
            "for decode-only steps. The run's mean scheduling delay (arrival to the next step boundary) is "
            f"{tr['sched_delay_mean_s'] * 1e3:.1f} ms because a step that prefills a 4,096-token prompt lasts "
            f"over {n.recompute_4k_s * 1e3:.0f} ms: an arrival during a prefill step waits for that step, not for a "
            "decode step.",
        ),
        Spec(
            "weights_gb",
            "weight bytes a decode step re-reads",
            "GB",
            "13.5 GB",
            f"{n.model.num_params:,} params x {n.model.dtype_bytes} B = {n.weights / GB:.3f} GB",
            n.weights / GB,
        ),
        Spec(
            "seq_kv_gb",
            "KV of one 640-token sequence",
            "GB",
            "0.328 GB",
            f"{n.seq} x {n.kv:,} B = {seq_gb:.4f} GB",
            seq_gb,
            why=f"640 x 512 decimal KB = 0.328 GB; {n.seq} x {n.kv / KIB:g} KiB = {seq_gb:.4f} GB.",
        ),
    ]
    decomposition = Table(
        name="lecture_ttft_decomposition",
        caption="TTFT split into its three terms (means over requests), 4,096-token prompts arriving at 4 req/s",
        run=command(ttft_overrides()),
        frame=pd.DataFrame(
            [
                {"term": k.replace("_mean_s", ""), "mean_ms": tr[k] * 1e3}
                for k in ("sched_delay_mean_s", "queue_mean_s", "prefill_mean_s", "ttft_mean_s")
            ]
        ),
        decimals={"mean_ms": 1},
    )
    return section(
        "§10.6 Sizing, SLOs, and where the time goes",
        "§10.6",
        "TTFT splits into scheduling delay, queueing and prefill; TPOT is set by the batch.",
        [*ttft, *tpot_specs(n, "s10_6"), *_batch_specs(n)],
        [decomposition],
    )


def tpot_specs(n: Numbers, prefix: str) -> list[Spec]:
    """TPOT at the lecture's B = 199 and the largest batch a 20 ms SLO allows, keyed ``<prefix>_...``."""
    seq_bytes = n.seq * n.kv
    step_bytes = n.weights + LECTURE_B * seq_bytes
    tpot = n.cost.decode_time_s(LECTURE_B * n.seq)
    hbm = n.hw.hbm_bandwidth_bytes_per_s
    lecture_step_gb = LECTURE_WEIGHTS_GB + LECTURE_B * LECTURE_SEQ_GB  # the lecture's step, decimal KB
    exact, b_slo = slo_batch(n.cost, n.seq, TPOT_SLO_S)
    return [
        Spec(
            f"{prefix}_tpot_b199_ms",
            f"TPOT at B = {LECTURE_B}, 640-token sequences",
            "ms",
            "23.5 ms",
            f"({n.weights / GB:.3f} + {LECTURE_B} x {seq_bytes / GB:.4f}) GB / "
            f"{n.hw.hbm_bandwidth_bytes_per_s / GB:,.0f} GB/s = {tpot * 1e3:.2f} ms",
            tpot * 1e3,
            why=f"The lecture takes a 640-token sequence as 0.328 GB (decimal KB): {LECTURE_WEIGHTS_GB} + {LECTURE_B} "
            f"x {LECTURE_SEQ_GB} = {lecture_step_gb:.1f} GB -> {lecture_step_gb * GB / hbm * 1e3:.1f} ms. With "
            f"{n.seq} x {n.kv / KIB:g} KiB = {seq_bytes / GB:.4f} GB a step moves {step_bytes / GB:.2f} GB.",
        ),
        Spec(
            f"{prefix}_step_bytes_b199_gb",
            f"bytes a decode step moves at B = {LECTURE_B}",
            "GB",
            "78.8 GB",
            f"{n.weights / GB:.3f} + {LECTURE_B} x {seq_bytes / GB:.4f} = {step_bytes / GB:.2f} GB",
            step_bytes / GB,
            why=f"0.328 GB per sequence in the lecture (decimal KB) against {seq_bytes / GB:.4f} GB.",
        ),
        Spec(
            f"{prefix}_slo_batch",
            "largest B meeting a 20 ms TPOT SLO (640-token sequences)",
            "seqs",
            "164",
            f"floor((20 ms x {n.hw.hbm_bandwidth_bytes_per_s / GB:,.0f} GB/s - {n.weights / GB:.2f} GB) / "
            f"{seq_bytes / GB:.4f} GB) = floor({exact:.1f}) = {math.floor(exact)}",
            math.floor(exact),
            Measured(b_slo, f"kvbench slo-batch slo.tpot_s={TPOT_SLO_S:g} --context-tokens {n.seq}"),
            sim_tol=0.0,
            why=f"The lecture uses 0.328 GB per sequence, which gives ({TPOT_SLO_S * hbm / GB:g} - {LECTURE_WEIGHTS_GB}) "
            f"/ {LECTURE_SEQ_GB} = {(TPOT_SLO_S * hbm / GB - LECTURE_WEIGHTS_GB) / LECTURE_SEQ_GB:.1f}, and then "
            "rounds up to 164; a batch must round down (B = 164 misses the SLO even on the lecture's numbers). "
            "kvbench slo-batch prints this arithmetic.",
        ),
        paged_concurrency_spec(
            n,
            f"{prefix}_memory_ceiling",
            "the memory ceiling the SLO batch is set against",
            why=f"kvbench's paged allocator holds {n.paged_n} (see §10.2's packed_concurrency). The conclusion holds: "
            f"the SLO's {b_slo} binds before memory's {n.paged_n}.",
        ),
    ]


def _batch_specs(n: Numbers) -> list[Spec]:
    """The three columns of §10.6's table: the B = 199 column, naive's 29, and the SLO's 164."""
    seq_gb = n.seq * n.kv / GB
    tpot = n.cost.decode_time_s(LECTURE_B * n.seq)
    tput = LECTURE_B / tpot
    naive_tpot = n.cost.decode_time_s(n.naive_n * n.seq)
    share = (n.naive_n / naive_tpot) / tput
    third_tol = 0.05  # 'a third' is approximate
    t164 = n.cost.decode_time_s(164 * n.seq)
    lecture_164_gb = LECTURE_WEIGHTS_GB + 164 * LECTURE_SEQ_GB  # the lecture's step at B = 164, decimal KB
    _, b_slo = slo_batch(n.cost, n.seq, TPOT_SLO_S)

    def throughput(overrides):
        return from_run(n.runs, overrides, "throughput_tokens_per_s")

    return [
        Spec(
            "paged_decode_throughput",
            f"decode throughput of the B = {LECTURE_B} column",
            "tok/s",
            "8,470 tok/s",
            f"{LECTURE_B} / {tpot * 1e3:.2f} ms = {tput:,.0f} tok/s",
            tput,
            why=f"The lecture's {LECTURE_B} / 23.5 ms = {LECTURE_B / 23.5e-3:,.0f}; kvbench's step is {tpot * 1e3:.2f} "
            f"ms ({seq_gb:.4f} GB per sequence, not 0.328).",
        ),
        Spec(
            "paged_column_violates_slo",
            f"every request of the B = {LECTURE_B} column violates a 20 ms TPOT",
            "",
            "every request violates",
            f"TPOT({LECTURE_B}) = {tpot * 1e3:.2f} ms > 20 ms",
            tpot * 1e3,
            holds=tpot > TPOT_SLO_S,
        ),
        Spec(
            "naive_throughput_share",
            "naive's decode throughput as a share of the paged column's",
            "fraction",
            "0.33 (a third)",
            f"({n.naive_n} / {naive_tpot * 1e3:.2f} ms) / ({LECTURE_B} / {tpot * 1e3:.2f} ms) = {share:.2f}",
            share,
            ratio(throughput(n.naive_overrides), throughput(n.paged_overrides)),
            claim_tol=third_tol,
            why=f"'A third' is approximate (tolerance {third_tol:g}). With {n.seq}-token sequences the naive column's "
            f"{n.naive_n} decode at "
            f"{naive_tpot * 1e3:.2f} ms per step, {n.naive_n / naive_tpot:,.0f} tok/s, {share:.2f} of the paged "
            "column's: the weights dominate a small batch's step, so throughput is far from proportional to B. "
            "The lecture's three-column table is not in these notes. The runs' whole-run output throughputs "
            "(prefills included) give the simulated ratio.",
        ),
        Spec(
            "naive_meets_slo",
            "the naive column (B = 29) meets the 20 ms TPOT SLO",
            "",
            "satisfies all of them",
            f"TPOT({n.naive_n}) = {naive_tpot * 1e3:.2f} ms <= 20 ms",
            naive_tpot * 1e3,
            from_run(n.runs, n.naive_overrides, "tpot_p99_s", in_ms),
            holds=naive_tpot <= TPOT_SLO_S,
        ),
        Spec(
            "b164_gets_both",
            "at B = 164 the SLO and memory are both met ('you get both')",
            "",
            "At B = 164 you get both",
            f"TPOT(164) = {t164 * 1e3:.2f} ms against 20 ms; 164 <= {n.paged_n}",
            t164 * 1e3,
            holds=t164 <= TPOT_SLO_S and 164 <= n.paged_n,
            why=f"Not at 164: TPOT(164) is over 20 ms with {seq_gb:.4f} GB sequences (and over 20 ms with the "
            f"lecture's 0.328 GB too: {LECTURE_WEIGHTS_GB} + 164 x {LECTURE_SEQ_GB} = {lecture_164_gb:.1f} GB -> "
            f"{lecture_164_gb * GB / n.hw.hbm_bandwidth_bytes_per_s * 1e3:.1f} ms). At kvbench's B = {b_slo} both "
            "hold.",
        ),
    ]


def s10_7(n: Numbers) -> Section:
    multiplier = n.paged_n / n.naive_n
    why = (
        f"kvbench's paged allocator holds {n.paged_n} where naive holds {n.naive_n}: {multiplier:.2f}x. The lecture's "
        f"{LECTURE_B} / {LECTURE_NAIVE_N} = {LECTURE_B / LECTURE_NAIVE_N:.2f} rests on its 199 (see §10.2's packed_concurrency). The runs' "
        "sustained floors while memory binds give the simulated ratio."
    )

    def floors() -> Measured:
        return ratio(
            from_run(n.runs, n.paged_overrides, "min_concurrency_saturated"),
            from_run(n.runs, n.naive_overrides, "min_concurrency_saturated"),
        )

    specs = [
        paging_gain_spec(key, quantity, claim, n.paged_n, n.naive_n, why, floors())
        for key, quantity, claim in (
            ("easy_ratio_6_9", "paging's concurrency multiplier ('the easy 6.9x')", "6.9x"),
            ("easy_ratio_7", "the same, as the timing plan closes ('the easy 7x')", "7x"),
        )
    ]
    return section(
        "§10.7 and the timing plan: the easy 7x",
        "§10.7",
        "The closing multiplier of paging over reserve-to-S_max on the chat workload.",
        specs,
    )
