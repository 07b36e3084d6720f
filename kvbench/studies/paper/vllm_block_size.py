"""The vLLM paper's §7.2: which block sizes serve best, from kvbench runs at a rate where memory
binds, and the figure of normalized latency by block size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.studies.paper.document import Figure, Section, Table
from kvbench.studies.paper.plots import new_figure, save
from kvbench.studies.paper.rows import Row
from kvbench.studies.paper.runs import Runs
from kvbench.studies.paper.vllm_runs import BASE, BLOCK_SIZES, MEANS, lengths, normalized_latency

#: a loaded rate per workload for the block-size sweep (kvbench's roofline serves faster than the
#: paper's GPU, so the paper's own rates leave memory idle): chosen so that memory binds
BLOCK_SWEEP_RATE = {"sharegpt_like": 3.0, "alpaca_like": 200.0}
BLOCK_SWEEP_REQUESTS = 500


def block_size(runs: Runs, ref: dict, figures_dir: Path) -> Section:
    """§7.2: the block-size sweep on both workloads, the two claims about it, and the figure."""
    records, curves, mean_tokens = [], {}, {}
    for workload in ("sharegpt_like", "alpaca_like"):
        rate = BLOCK_SWEEP_RATE[workload]
        values = []
        for block in BLOCK_SIZES:
            over = [
                "allocator=paged",
                *BASE,
                f"workload={workload}",
                f"workload.rate_per_s={rate}",
                f"workload.num_requests={BLOCK_SWEEP_REQUESTS}",
                f"allocator.block_size_tokens={block}",
            ]
            result = runs(over)
            value = normalized_latency(result)
            values.append(value)
            prompt, output = lengths(result)
            mean_tokens[workload] = float((prompt + output).mean())
            records.append(
                {
                    "workload": MEANS[workload][0],
                    "rate_per_s": rate,
                    "block_size": block,
                    "normalized_latency_s_per_token": value,
                    "num_preemptions": result.summary["num_preemptions"],
                    "mean_batched": result.summary["mean_concurrency"],
                }
            )
        curves[MEANS[workload][0]] = values
    sg, al = np.array(curves["ShareGPT"]), np.array(curves["Alpaca"])
    sizes = np.array(BLOCK_SIZES)
    mid = (sizes >= 16) & (sizes <= 128)
    sg_holds = bool(np.all(sg[mid] <= 1.1 * sg.min()))
    good = (sizes == 16) | (sizes == 32)
    al_holds = bool(np.all(al[good] <= 1.1 * al.min()) and np.all(al[sizes >= 128] > 1.1 * al.min()))
    run = (
        f"kvbench allocator=paged {' '.join(BASE)} workload=<w> workload.rate_per_s=<r> "
        f"workload.num_requests={BLOCK_SWEEP_REQUESTS} allocator.block_size_tokens={BLOCK_SIZES[0]},...,{BLOCK_SIZES[-1]}"
    )
    note = (
        " kvbench's kernels run at one speed whatever the block size (uncalibrated), so small blocks cost "
        "nothing here; on the paper's GPU, blocks below 16 underuse the kernel, which kvbench can show only with "
        "a calibration measured on a GPU."
    )

    def judged(key: str, quantity: str, claim: str, formula: str, holds: bool, curve, reading: str) -> Row:
        """A §7.2 claim judged on one workload's ``curve`` (normalized latency per block size)."""
        per_block = ", ".join(f"{b}: {v:.4f}" for b, v in zip(BLOCK_SIZES, curve, strict=True))
        why = f"Normalized latency (s/token) per block: {per_block}. {reading}{note}"
        return Row(f"vllm.{key}", "§7.2", quantity, "", claim, formula, None, run=run, holds=holds, why=why)

    rows = [
        judged(
            "sec7_2_sharegpt_block_16_128",
            "ShareGPT: block sizes 16-128 perform best",
            ref["sec7_2_block_size"].split(";")[0],
            "every block size in 16..128 within 10 % of the best normalized "
            f"latency at {BLOCK_SWEEP_RATE['sharegpt_like']:g} req/s",
            sg_holds,
            sg,
            "Larger blocks leave more unfilled tail per sequence, fewer sequences fit, and at this load the queue "
            "grows.",
        ),
        judged(
            "sec7_2_alpaca_block_16_32",
            "Alpaca: 16 and 32 work well, larger sizes degrade",
            "16 and 32 work well; larger degrade",
            "16 and 32 within 10 % of the best, 128 and 256 more than 10 % worse "
            f"(at {BLOCK_SWEEP_RATE['alpaca_like']:g} req/s)",
            al_holds,
            al,
            f"Alpaca's short sequences (about {mean_tokens['alpaca_like']:.0f} tokens) waste most of a large block.",
        ),
    ]
    fig, ax = new_figure(6.0, 3.6)
    for name, values in curves.items():
        ax.plot(BLOCK_SIZES, values, marker="o", label=f"{name} ({BLOCK_SWEEP_RATE[name.lower() + '_like']:g} req/s)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(BLOCK_SIZES, [str(b) for b in BLOCK_SIZES])
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.legend(fontsize=8)
    ax.set_title("kvbench: normalized latency by block size (OPT-13B, A100-40GB)", fontsize=9)
    path = save(fig, figures_dir / "vllm_block_size.png")
    return Section(
        "§7.2: block size",
        "Paged, OPT-13B on the A100-40GB, at a rate where memory binds.",
        rows,
        [
            Table(
                "vllm_block_size",
                "Normalized latency by block size (kvbench runs)",
                pd.DataFrame(records),
                run,
                decimals={"normalized_latency_s_per_token": 4, "mean_batched": 1},
            )
        ],
        [Figure("kvbench's normalized latency by block size", path)],
    )
