"""The lecture's figures: swap against recompute, concurrency against block size, the batch over
time per allocator, and where the KV budget goes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.api import Transfer, ledger_parts
from kvbench.studies.paper.plots import new_figure, save

_COLORS = {"naive": "#e34a33", "per_request": "#fdae6b", "paged": "#2b8cbe"}


def _per_byte_break_even(cost) -> float:
    """KV tokens above which a swap round trip priced per byte alone (no per-copy overhead) beats
    recomputing: (2 kv / W - 2 N / F) / (4 L H d / F), or 0 when swapping always wins."""
    m, f = cost.model, cost.prefill_flops_per_s
    quadratic = 4.0 * m.num_layers * m.num_heads * m.head_dim / f
    linear = 2.0 * m.kv_bytes_per_token / cost.hardware.host_link_bytes_per_s - 2.0 * m.num_params / f
    return max(0.0, linear / quadratic)


def break_even_figure(n, path: Path) -> Path:
    """Swap round trip and recompute time against the KV tokens of the preempted sequence, for MHA
    and GQA-8 at 32 and 64 GB/s, with each break-even length marked."""
    tokens = np.unique(np.geomspace(16, 32768, 200).astype(int))
    fig, _ = new_figure(10.0, 4.4)
    fig.clf()
    axes = fig.subplots(1, 2, sharey=True)
    cases = (
        (f"MHA: Llama-2-7B, {n.kv / 1024:g} KiB/token", n.cost, n.cost_32),
        (f"GQA-8: {n.kv_gqa / 1024:g} KiB/token", n.gqa_cost, n.cost_gqa_32),
    )
    for ax, (label, cost64, cost32) in zip(axes, cases):
        recompute = np.array([cost64.prefill_time_s(int(s)) for s in tokens]) * 1e3
        ax.plot(
            tokens,
            recompute,
            color="black",
            linewidth=1.6,
            label=f"recompute: prefill at {100 * cost64.hardware.prefill_flops_efficiency:g} % of peak",
        )
        notes = []
        for cost, style, color in ((cost64, "-", "#2b8cbe"), (cost32, "--", "#e34a33")):
            link = cost.hardware.host_link_bytes_per_s
            kv = cost.model.kv_bytes_per_token
            per_byte = 2 * tokens * kv / link * 1e3
            blocks = (
                np.array([cost.swap_round_trip_s(Transfer(int(s) * kv, -(-int(s) // n.block))) for s in tokens]) * 1e3
            )
            ax.plot(tokens, per_byte, style, color=color, label=f"swap round trip at {link / 1e9:g} GB/s (bytes only)")
            ax.plot(
                tokens,
                blocks,
                style,
                color=color,
                alpha=0.45,
                label=f"... + {cost.hardware.host_transfer_overhead_s * 1e6:g} us per {n.block}-token block copied, "
                f"{link / 1e9:g} GB/s",
            )
            for even, kind in (
                (_per_byte_break_even(cost), "bytes only"),
                (cost.swap_break_even_kv_tokens(n.block), f"{n.block}-token blocks"),
            ):
                if even > 0:
                    ax.plot(
                        [even],
                        [cost.prefill_time_s(round(even)) * 1e3],
                        "o",
                        color=color,
                        alpha=1.0 if kind == "bytes only" else 0.45,
                    )
                    notes.append(f"{link / 1e9:g} GB/s, {kind}: break-even {even:,.0f} tokens")
                else:
                    notes.append(f"{link / 1e9:g} GB/s, {kind}: swapping wins at every length")
        ax.axvline(n.s_max, color="grey", linestyle=":", linewidth=0.8)
        ax.text(0.02, 0.98, "\n".join(notes), transform=ax.transAxes, fontsize=6.5, va="top")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(f"KV tokens of the preempted sequence (dotted: {n.s_max:,})")
        ax.set_xscale("log", base=2)
        ticks = [16, 64, 256, 1024, 4096, 16384]
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("time (ms)")
    axes[1].legend(fontsize=6, loc="lower right")
    return save(fig, path)


def block_size_figure(
    n, sweep: dict[int, dict], capacity: dict[int, int], naive: dict, naive_capacity: int, path: Path
) -> tuple[Path, pd.DataFrame]:
    """Concurrency against block size (runs and allocator ceilings), with naive for reference."""
    blocks = sorted(sweep)
    frame = pd.DataFrame(
        [
            {
                "block_tokens": b,
                "capacity_640": capacity[b],
                "peak_concurrency": sweep[b]["peak_concurrency"],
                "min_concurrency_saturated": sweep[b]["min_concurrency_saturated"],
                "mean_concurrency_saturated": sweep[b]["mean_concurrency_saturated"],
                "utilization_saturated_pct": 100 * sweep[b]["utilization_saturated"],
                "mean_tail_tokens": sweep[b]["mean_tail_waste_tokens_per_seq"],
            }
            for b in blocks
        ]
    )
    fig, ax = new_figure()
    ax.plot(blocks, frame.capacity_640, "s-", color="black", label=f"allocator ceiling, {n.seq}-token sequences")
    ax.plot(blocks, frame.peak_concurrency, "^--", color="#2b8cbe", label="paged run: peak")
    ax.plot(blocks, frame.mean_concurrency_saturated, "o-", color="#2b8cbe", label="paged run: mean while saturated")
    ax.plot(blocks, frame.min_concurrency_saturated, "v:", color="#2b8cbe", label="paged run: floor while saturated")
    ax.axhline(
        naive["mean_concurrency_saturated"],
        color=_COLORS["naive"],
        linestyle="--",
        label=f"naive (S_max {n.s_max:,}): {naive_capacity}",
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(blocks, [str(b) for b in blocks])
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("sequences running")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(
        f"Concurrency against block size: Llama-2-7B, H100, {n.budget / 1e9:g} GB, {n.prompt} + {n.output} tokens",
        fontsize=9,
    )
    return save(fig, path), frame


def allocator_timeline_figure(results: dict, path: Path) -> Path:
    """Running sequences over simulated time, one step line per allocator (from each run's steps
    table: a row is a span of steps with the same running set)."""
    fig, ax = new_figure()
    for name, result in results.items():
        steps = result.steps
        start = steps["start_s"].to_numpy()
        end = start + steps["duration_s"].to_numpy()
        x = np.append(start, end[-1]) if len(start) else start
        y = np.append(steps["num_running"].to_numpy(), 0) if len(start) else start
        ax.step(
            x,
            y,
            where="post",
            color=_COLORS.get(name),
            label=name,
            linewidth=1.2,
            linestyle="--" if name == "per_request" else "-",
        )
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("running sequences (batch size)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Batch over time, lecture chat workload (per_request equals naive here)", fontsize=9)
    return save(fig, path)


def memory_breakdown_figure(summaries: dict[str, dict], budget_bytes: float, path: Path) -> Path:
    """Stacked shares of the KV budget while memory binds, per allocator."""
    # the ledger's parts in the catalogue's words and colours (the lecture's workload caches no
    # prefix and its model keeps no per-request state)
    parts = [(m.key, m.legend, m.colour) for m in ledger_parts() if m.key not in ("frac_cached", "frac_state")]
    names = list(summaries)
    fig, ax = new_figure(7.0, 3.6)
    bottom = np.zeros(len(names))
    for key, label, color in parts:
        values = np.array([100 * float(summaries[name].get(key, 0.0)) for name in names])
        ax.barh(names, values, left=bottom, color=color, label=label)
        bottom += values
    ax.set_xlabel(f"% of the {budget_bytes / 1e9:g} GB KV budget (time-weighted while memory binds)")
    ax.set_xlim(0, 100)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)
    return save(fig, path)
