"""§10.5 of the lecture: a preempted 4K sequence is swapped to host memory and back, or its prefill is
recomputed. Its swap numbers come back in "Numbers worth memorizing" (:func:`swap_specs`)."""

from __future__ import annotations

from kvbench.studies.paper.document import Section
from kvbench.studies.paper.lecture_numbers import GB, Numbers
from kvbench.studies.paper.lecture_rows import Measured, Spec, section
from kvbench.studies.paper.lecture_setup import blocks_for


def s10_5(n: Numbers) -> Section:
    steps = n.swap_4k_s / n.ambient_tpot_s
    gqa_16k = 16384 * n.kv_gqa
    ambient = [
        Spec(
            "swap_in_decode_steps",
            "the 67 ms swap in decode steps of the 22.6 ms ambient TPOT",
            "steps",
            "nearly three",
            f"{n.swap_4k_s * 1e3:.1f} ms / {n.ambient_tpot_s * 1e3:.2f} ms = {steps:.2f}",
            steps,
            holds=2.5 <= steps < 3.0,
            why="'Nearly three' holds: the round trip is just under three ambient decode steps.",
        ),
        Spec(
            "ambient_tpot_ms",
            "the ambient TPOT (a decode step of the 29 naive slots at 4,096 tokens)",
            "ms",
            "22.6 ms",
            f"({n.weights:,} B + {n.naive_n} x {n.s_max:,} x {n.kv:,} B) / {n.hw.hbm_bandwidth_bytes_per_s:.3g} B/s "
            f"= {n.ambient_tpot_s * 1e3:.2f} ms",
            n.ambient_tpot_s * 1e3,
            why=f"The notes do not derive 22.6 ms; it is Lecture 2's operating point, the decode step of the "
            f"{n.naive_n} naive slots full at {n.s_max:,} tokens (cost model's decode_time_s).",
        ),
        Spec(
            "gqa8_16k_equals_mha_4k",
            "a 16,384-token GQA-8 session holds the bytes of a 4,096-token MHA sequence",
            "GB",
            "2.147 GB",
            f"16,384 x {n.kv_gqa:,} B = {gqa_16k / GB:.4f} GB; 4,096 x {n.kv:,} B = {n.kv_4k / GB:.4f} GB",
            gqa_16k / GB,
        ),
    ]
    return section(
        "§10.5 The engine loop, admission, and preemption: swap or recompute",
        "§10.5",
        "A preempted 4K sequence: swap its KV to host memory and back, or recompute its prefill.",
        [*swap_specs(n, "s10_5"), *ambient],
    )


def swap_specs(n: Numbers, prefix: str) -> list[Spec]:
    """Swap against recompute for a 4K sequence, keyed ``<prefix>_...``."""
    runs_4k = blocks_for(n.s_max, n.block)
    lin = 2 * n.model.num_params * n.s_max
    quad = n.quad * n.s_max**2
    w_mha = n.break_even_bandwidth(n.cost, n.s_max)
    w_gqa = n.break_even_bandwidth(n.gqa_cost, n.s_max)
    lecture_params_s = (2 * n.model.num_params * n.s_max + n.quad * n.s_max**2) / n.flops
    w_gqa_lecture = 2 * n.s_max * n.kv_gqa / lecture_params_s
    return [
        Spec(
            f"{prefix}_swap_round_trip_ms",
            "swap round trip of a 4K MHA sequence at 64 GB/s",
            "ms",
            "67 ms",
            f"2 x {n.kv_4k:,} B / {n.link:.3g} B/s = {n.swap_4k_s * 1e3:.2f} ms",
            n.swap_4k_s * 1e3,
            Measured(
                n.swap_4k_blocks_s * 1e3,
                f"CostModel.swap_round_trip_s(Transfer({n.kv_4k:,} B, {runs_4k} blocks)) on the defaults",
            ),
            why=f"The lecture prices bytes alone. kvbench's cost model adds {n.hw.host_transfer_overhead_s * 1e6:g} us "
            f"per copy and copies block by block ({runs_4k} blocks of {n.block} each way): "
            f"{n.swap_4k_blocks_s * 1e3:.1f} ms, {(n.swap_4k_blocks_s - n.swap_4k_s) * 1e3:.1f} ms more.",
        ),
        Spec(
            f"{prefix}_swap_bytes_gb",
            "bytes each way of a 4K MHA swap",
            "GB",
            "2.147 GB",
            f"{n.s_max:,} x {n.kv:,} B = {n.kv_4k / GB:.4f} GB",
            n.kv_4k / GB,
        ),
        Spec(
            f"{prefix}_recompute_ms",
            "recomputing a 4K prefill at 50% of peak",
            "ms",
            "129 ms",
            f"({lin / 1e12:.2f} + {quad / 1e12:.2f}) TFLOP / {n.flops / 1e12:.1f} TFLOP/s = "
            f"{n.recompute_4k_s * 1e3:.1f} ms",
            n.recompute_4k_s * 1e3,
        ),
        Spec(
            f"{prefix}_recompute_linear_tflop",
            "the weight term 2 N S of a 4K prefill",
            "TFLOP",
            "55.2",
            f"2 x {n.model.num_params:,} x {n.s_max:,} = {lin / 1e12:.2f} TFLOP",
            lin / 1e12,
        ),
        Spec(
            f"{prefix}_recompute_attention_tflop",
            "the attention term 4 L H d S^2 of a 4K prefill",
            "TFLOP",
            "8.8",
            f"4 x {n.model.num_layers} x {n.model.num_heads} x {n.model.head_dim} x {n.s_max:,}^2 = "
            f"{quad / 1e12:.2f} TFLOP",
            quad / 1e12,
        ),
        Spec(
            f"{prefix}_break_even_bw_mha",
            "break-even link bandwidth, 4K MHA",
            "GB/s",
            "33.3 GB/s",
            f"2 x {n.kv_4k:,} B / {n.recompute_4k_s * 1e3:.2f} ms = {w_mha / GB:.2f} GB/s",
            w_mha / GB,
            why=f"Rounding: the lecture divides by the rounded 129 ms ({2 * n.kv_4k / GB:.3f} GB / 0.129 s = "
            f"{2 * n.kv_4k / GB / 0.129:.2f}); the unrounded "
            f"recompute time {n.recompute_4k_s * 1e3:.2f} ms gives {w_mha / GB:.2f}.",
        ),
        Spec(
            f"{prefix}_break_even_bw_gqa8",
            "break-even link bandwidth, 4K GQA-8",
            "GB/s",
            "8.3 GB/s",
            f"2 x {n.s_max:,} x {n.kv_gqa:,} B / {n.gqa_cost.prefill_time_s(n.s_max) * 1e3:.1f} ms = "
            f"{w_gqa / GB:.2f} GB/s",
            w_gqa / GB,
            why=f"A GQA-8 Llama-2-7B has {n.gqa_model.num_params / 1e9:.2f}e9 parameters (its K and V projections "
            f"shrink {n.model.num_kv_heads // n.gqa_model.num_kv_heads}x), so its recompute is "
            f"{n.gqa_cost.prefill_time_s(n.s_max) * 1e3:.1f} ms, not 129 ms. With the "
            f"MHA model's {n.model.num_params / 1e9:.2f}e9, as the lecture assumes, it is {w_gqa_lecture / GB:.2f} "
            "GB/s.",
        ),
    ]
