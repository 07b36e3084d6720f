"""The lecture on PagedAttention (§10.2-§10.6, its "Numbers worth memorizing" and Exercises 1-5),
reproduced number by number.

Every closed form is computed from kvbench's own objects (ModelSpec, HardwareSpec, CostModel,
allocators) built from the same config a run uses (:mod:`kvbench.studies.paper.lecture_setup`); every
simulated value comes from a kvbench run (:class:`kvbench.studies.paper.runs.Runs`) or from filling a
fresh kvbench allocator. Nothing a row compares against is typed in: the only literals are the
lecture's own inputs (its batch of 199, its 20 ms SLO, Exercise 3's lengths...), each named where
it is used.

Each section's numbers are data, a list of :class:`~kvbench.studies.paper.lecture_rows.Spec` in the
section's module; :func:`kvbench.studies.paper.lecture_rows.section` makes them rows:

- §10.2 :mod:`~kvbench.studies.paper.lecture_naive`, §10.3 :mod:`~kvbench.studies.paper.lecture_paging`,
  §10.4 :mod:`~kvbench.studies.paper.lecture_sharing`, §10.5 :mod:`~kvbench.studies.paper.lecture_preemption`,
  §10.6-§10.7 :mod:`~kvbench.studies.paper.lecture_sizing`, and "Numbers worth memorizing"
  :mod:`~kvbench.studies.paper.lecture_memorize`;
- Exercises 1-2 :mod:`~kvbench.studies.paper.lecture_reservation`, 3
  :mod:`~kvbench.studies.paper.lecture_block_size`, 4 :mod:`~kvbench.studies.paper.lecture_break_even`
  and 5 :mod:`~kvbench.studies.paper.lecture_agent`.

The shared inputs are :class:`~kvbench.studies.paper.lecture_numbers.Numbers`; a number several
sections say again (naive's 29, paged's 199, the naive utilization, paging's multiplier) is one
function of :mod:`~kvbench.studies.paper.lecture_capacity`; the figures are drawn by
:mod:`~kvbench.studies.paper.lecture_figures`.
"""

from __future__ import annotations

from pathlib import Path

from kvbench.studies.paper.document import Figure, Section, Source, Table
from kvbench.studies.paper.lecture_agent import exercise5
from kvbench.studies.paper.lecture_block_size import exercise3
from kvbench.studies.paper.lecture_break_even import exercise4
from kvbench.studies.paper.lecture_figures import (
    allocator_timeline_figure,
    block_size_figure,
    break_even_figure,
    memory_breakdown_figure,
)
from kvbench.studies.paper.lecture_memorize import memorize
from kvbench.studies.paper.lecture_naive import s10_2
from kvbench.studies.paper.lecture_numbers import GB, KIB, SWEEP_BLOCKS, Numbers, block_overrides
from kvbench.studies.paper.lecture_paging import s10_3
from kvbench.studies.paper.lecture_preemption import s10_5
from kvbench.studies.paper.lecture_reservation import exercise1, exercise2
from kvbench.studies.paper.lecture_setup import fill
from kvbench.studies.paper.lecture_sharing import s10_4
from kvbench.studies.paper.lecture_sizing import s10_6, s10_7
from kvbench.studies.paper.runs import Runs, command


def build(runs: Runs, figures_dir: Path) -> Source:
    """The lecture's rows, tables and figures (figures written into ``figures_dir``)."""
    figures_dir = Path(figures_dir)
    n = Numbers(runs)
    # in the lecture's order, which is also the order the runs are first made in
    sections = {
        "§10.2": s10_2(n),
        "§10.3": s10_3(n),
        "§10.4": s10_4(n),
        "§10.5": s10_5(n),
        "§10.6": s10_6(n),
        "§10.7": s10_7(n),
        "Numbers worth memorizing": memorize(n),
        "Exercise 1": exercise1(n),
        "Exercise 2": exercise2(n),
        "Exercise 3": exercise3(n),
        "Exercise 4": exercise4(n),
        "Exercise 5": exercise5(n),
    }
    _figures(n, sections, figures_dir)
    title = "Lecture: paged KV-cache allocation (§10.2-§10.6, Numbers worth memorizing, Exercises 1-5)"
    return Source(name="lecture", title=title, about=_about(n), sections=list(sections.values()))


def _about(n: Numbers) -> str:
    return (
        "The lecture that opens Part II of the course: the naive reserve-to-S_max allocator, "
        "PagedAttention's block tables, copy-on-write fan-out, swap against recompute, and sizing under "
        f"a TPOT SLO, for Llama-2-7B (fp16, multi-head attention, {n.kv / KIB:g} KiB of KV per token) on an H100 "
        f"with a {n.budget / GB:g} GB KV budget. Every number the lecture prints in §10.2-§10.6, its instructor "
        "notes, its 'Numbers worth memorizing' table and its exercises has a row here: the claim as "
        "printed, kvbench's closed form with its inputs, and where a run or an allocator measures the "
        f"same thing, the simulated value. GB is 1e9 bytes, MB 1e6, KiB {KIB:,}: the lecture mixes them, "
        "and most of its slips are that (0.328 GB for a 640-token sequence is 640 x 512 decimal KB; "
        f"kvbench's is {n.seq} x {n.kv:,} B = {n.seq * n.kv / GB:.4f} GB). Its 'GQA-8' is Llama-2-7B with "
        f"{n.gqa_model.num_kv_heads} KV heads; kvbench counts that model's parameters from its architecture "
        f"({n.gqa_model.num_params / 1e9:.2f}e9: the K and V projections shrink "
        f"{n.model.num_kv_heads // n.gqa_model.num_kv_heads}x), where the lecture keeps the MHA model's "
        f"{n.model.num_params / 1e9:.2f}e9 for its FLOPs."
    )


def _figures(n: Numbers, by_where: dict[str, Section], figures_dir: Path) -> None:
    path = break_even_figure(n, figures_dir / "lecture_swap_vs_recompute.png")
    by_where["§10.5"].figures.append(
        Figure(
            path=path,
            caption=f"Swap round trip (per byte, and with {n.hw.host_transfer_overhead_s * 1e6:g} us per {n.block}-token "
            "block) and recompute time against the sequence's KV tokens, MHA and GQA-8, at "
            f"{n.cost_32.hardware.host_link_bytes_per_s / GB:g} and {n.link / GB:g} GB/s; the dots mark the break-even lengths "
            "(cost model, Llama-2-7B on the H100).",
        )
    )
    sweep = {b: n.runs(block_overrides(b)).summary for b in SWEEP_BLOCKS}
    capacity = {b: fill(block_overrides(b), n.seq, n.s_max) for b in SWEEP_BLOCKS}
    path, frame = block_size_figure(
        n, sweep, capacity, n.naive_run, n.naive_fill, figures_dir / "lecture_concurrency_vs_block_size.png"
    )
    by_where["§10.3"].figures.append(
        Figure(
            path=path,
            caption="Concurrency against block size on the lecture's chat workload: the allocator's ceiling for "
            f"{n.seq}-token sequences, the runs' peak, sustained floor and mean while memory binds; naive for "
            "reference ("
            + ", ".join(command(block_overrides(b)) for b in SWEEP_BLOCKS[:1])
            + f" ... {SWEEP_BLOCKS[-1]}).",
        )
    )
    by_where["§10.3"].tables.append(
        Table(
            name="lecture_block_size_sweep",
            caption="Block-size sweep on the lecture's chat workload (runs)",
            frame=frame,
            run=" ; ".join(command(block_overrides(b)) for b in SWEEP_BLOCKS),
            decimals={"mean_concurrency_saturated": 1, "utilization_saturated_pct": 1, "mean_tail_tokens": 1},
        )
    )
    allocators = {"naive": ["allocator=naive"], "per_request": ["allocator=per_request"], "paged": ["allocator=paged"]}
    results = {name: n.runs(o) for name, o in allocators.items()}
    path = allocator_timeline_figure(results, figures_dir / "lecture_batch_over_time.png")
    by_where["§10.2"].figures.append(
        Figure(
            path=path,
            caption=f"Running sequences over time for each allocator on the lecture's chat workload ({n.num_requests:,} "
            f"requests of {n.prompt} + {n.output} tokens at t = 0): "
            + " ; ".join(command(o) for o in allocators.values()),
        )
    )
    path = memory_breakdown_figure(
        {name: r.summary for name, r in results.items()}, n.budget, figures_dir / "lecture_memory_breakdown.png"
    )
    by_where["§10.2"].figures.append(
        Figure(
            path=path,
            caption=f"Where the {n.budget / GB:g} GB KV budget goes while memory binds (time-weighted), per allocator, on the "
            "lecture's chat workload.",
        )
    )
