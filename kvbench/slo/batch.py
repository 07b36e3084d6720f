"""``kvbench slo-batch``: the largest decode-only batch whose step time (its TPOT) meets an SLO.

In a decode-only step each of the B sequences emits one token, so the step's time is every
sequence's time per output token. The cost model (:mod:`kvbench.exec.costmodel`) prices it as

    TPOT(B) = W / BW + B * C * kv / (BW * eff)

(W weight bytes, BW HBM bandwidth, C context tokens per sequence, kv KV bytes per token, eff the
kernel's decode efficiency), so the largest B with TPOT(B) <= SLO is

    floor((SLO * BW - W) * eff / (C * kv)).

That is set beside the memory ceiling: how many C-token sequences the run's allocator holds in
its KV budget (found by filling a fresh allocator until it refuses), and the scheduler's
``max_num_seqs``. The smallest of the three binds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from kvbench.exec.costmodel import CostModel
from kvbench.memory.allocator import Allocator, SeqShape
from kvbench.output.figures import pyplot

GB = 1e9  # decimal, as the lecture's 3,350 GB/s
#: bounds on the options, so that every allocation they size stays small: the figure evaluates the
#: cost model at every batch up to --max-batch (2**20 floats: 8 MB), and a TPOT SLO above 100 s
#: is no serving SLO (it only makes the batch, and so the table, huge)
MAX_TPOT_S = 100.0
#: the TPOT SLO when slo.tpot_s is not set: the lecture's question, "the largest batch under 20 ms"
TPOT_SLO_DEFAULT_S = 0.020
MAX_BATCH = 1 << 20
MAX_CONTEXT_TOKENS = 1 << 24


@dataclass(frozen=True)
class BatchAnswer:
    """The SLO's batch, the memory ceiling and the scheduler cap, with the numbers behind them."""

    context_tokens: int
    tpot_slo_s: float
    weight_bytes: int
    hbm_bandwidth_bytes_per_s: float
    decode_efficiency: float
    seq_kv_bytes: int  #: KV one sequence's decode step reads: C * kv bytes per token
    exact_batch: float  #: the closed form before the floor
    slo_batch: int  #: largest B with decode_time_s(B * C) <= SLO (0: not even one sequence)
    memory_batch: int  #: C-token sequences the allocator holds at once
    held_bytes_per_seq: float  #: what the allocator sets aside for each of them
    budget_bytes: int
    max_num_seqs: int

    @property
    def limits(self) -> dict[str, int]:
        return {"the SLO": self.slo_batch, "memory": self.memory_batch, "scheduler.max_num_seqs": self.max_num_seqs}

    @property
    def batch(self) -> int:
        return min(self.limits.values())

    @property
    def binding(self) -> list[str]:
        return [name for name, value in self.limits.items() if value == self.batch]


def slo_batch(cost: CostModel, context_tokens: int, tpot_slo_s: float) -> tuple[float, int]:
    """The closed form's real-valued B, and the largest integer B the cost model itself says meets
    the SLO (the closed form and ``decode_time_s`` could round apart at an exact boundary)."""
    hw, model = cost.hardware, cost.model
    seq_kv_bytes = context_tokens * model.kv_bytes_per_token
    exact = (tpot_slo_s * hw.hbm_bandwidth_bytes_per_s - model.weight_bytes) * cost.decode_efficiency / seq_kv_bytes
    batch = max(0, math.floor(exact))
    while batch > 0 and _decode_s(cost, batch, context_tokens) > tpot_slo_s:
        batch -= 1
    while _decode_s(cost, batch + 1, context_tokens) <= tpot_slo_s:
        batch += 1
    return exact, batch


def _decode_s(cost: CostModel, batch: int, context_tokens: int) -> float:
    """One decode step of ``batch`` sequences of ``context_tokens`` each (the roofline prices the
    KV they read; a measured clock prices the batch itself, not one sequence of all their tokens)."""
    return cost.step_times_s([], batch, batch * context_tokens)[1]


def memory_ceiling(allocator: Allocator, context_tokens: int, s_max_tokens: int) -> tuple[int, float]:
    """How many sequences holding ``context_tokens`` a fresh ``allocator`` takes before it refuses,
    and the bytes it sets aside for each. Asking the allocator itself covers block rounding,
    reserve-to-S_max and placement alike. No scheduler watermark: the batch is already admitted."""
    shape = SeqShape(
        num_tokens=context_tokens,
        s_max_tokens=max(context_tokens, s_max_tokens),
        final_kv_tokens=context_tokens,
        prompt_tokens=context_tokens,
    )
    if not allocator.fits_in_empty(shape):
        return 0, math.nan
    # no allocator holds C tokens in fewer than C slots: a bound on the loop
    most = allocator.budget_bytes // (context_tokens * allocator.kv_bytes_per_token)
    count = 0
    while count < most and allocator.allocate(count, shape) is not None:
        count += 1
    held_bytes = allocator.budget_bytes - allocator.unallocated_bytes()
    return count, held_bytes / count if count else math.nan


def batch_table(cost: CostModel, context_tokens: int, batches: list[int], answer: BatchAnswer) -> pd.DataFrame:
    rows = []
    weights_s = cost.decode_time_s(0)
    for batch in batches:
        step_s = cost.decode_time_s(batch * context_tokens)
        rows.append(
            {
                "batch": batch,
                "kv_read_bytes": batch * answer.seq_kv_bytes,
                "weights_s": weights_s,
                "kv_s": step_s - weights_s,
                "tpot_s": step_s,
                "tokens_per_s": batch / step_s,  # one token per sequence per step
                "meets_slo": step_s <= answer.tpot_slo_s,
                "fits_memory": batch <= answer.memory_batch,
            }
        )
    return pd.DataFrame(rows)


def batches_to_show(answer: BatchAnswer, max_batch: int) -> list[int]:
    powers = [1 << k for k in range(max_batch.bit_length()) if 1 << k <= max_batch]
    marks = [answer.slo_batch, answer.slo_batch + 1, answer.memory_batch, answer.max_num_seqs, max_batch]
    return sorted({b for b in powers + marks if 1 <= b <= max_batch})


def arithmetic(answer: BatchAnswer) -> str:
    """The closed form written out with this run's numbers."""
    efficiency = "" if answer.decode_efficiency == 1.0 else f" × {answer.decode_efficiency:.3f}"
    return (
        f"({answer.tpot_slo_s * 1e3:g} ms × {answer.hbm_bandwidth_bytes_per_s / GB:,.0f} GB/s − "
        f"{answer.weight_bytes / GB:.2f} GB){efficiency} ÷ {answer.seq_kv_bytes / GB:.4f} GB = "
        f"{answer.exact_batch:.1f} → B = {answer.slo_batch}"
    )


def figure(cost: CostModel, answer: BatchAnswer, max_batch: int, title: str):
    plt = pyplot()
    # element b is decode_time_s(b * C) exactly: every batch from 0 to max_batch
    tpot_ms = cost.decode_times_s(0, answer.context_tokens, max_batch + 1) * 1e3
    batch = range(max_batch + 1)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(batch, tpot_ms, color="#2b8cbe", label="TPOT of a decode-only step (cost model)")
    ax.axhline(answer.tpot_slo_s * 1e3, color="#e34a33", linestyle="--", label=f"SLO {answer.tpot_slo_s * 1e3:g} ms")
    if answer.memory_batch <= max_batch:
        ax.axvline(answer.memory_batch, color="black", linestyle=":", label=f"memory ceiling B = {answer.memory_batch}")
    if answer.slo_batch >= 1:
        ax.plot(
            [answer.slo_batch],
            [cost.decode_time_s(answer.slo_batch * answer.context_tokens) * 1e3],
            "o",
            color="#e34a33",
            label=f"largest B meeting the SLO = {answer.slo_batch}",
        )
    ax.set_xlabel(f"batch B (sequences of {answer.context_tokens} context tokens)")
    ax.set_ylabel("time per output token (ms)")
    ax.set_xlim(0, max_batch)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
