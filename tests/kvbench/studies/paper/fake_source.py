"""A small source for the ``kvbench paper`` machinery tests: one real kvbench run, one figure."""

from __future__ import annotations

import pandas as pd

from kvbench.studies.paper.document import Figure, Section, Source, Table
from kvbench.studies.paper.plots import new_figure, save
from kvbench.studies.paper.rows import Row
from kvbench.studies.paper.runs import command

RUN = ["allocator=naive", "workload.num_requests=40"]


def build(runs, figures_dir) -> Source:
    summary = runs.summary(RUN)
    budget_seqs = int(62.5e9 // (4096 * 524288))
    fig, ax = new_figure()
    ax.bar(["naive"], [summary["peak_concurrency"]])
    path = save(fig, figures_dir / "fake_concurrency.png")
    rows = [
        Row(
            key="fake.naive_seqs",
            section="§10.2",
            quantity="naive | concurrency",
            unit="seqs",
            claim="29",
            formula="floor(62.5e9 / (4,096 x 524,288))",
            formula_value=budget_seqs,
            simulated=summary["peak_concurrency"],
            run=command(RUN),
            sim_tol=0.0,
        ),
        Row(
            key="fake.slip",
            section="§10.2",
            quantity="a slip",
            unit="%",
            claim="1.9",
            formula="3 x 640 / 4096 / 29",
            formula_value=1.6,
            why="the source ignored the floor",
        ),
    ]
    table = Table(
        name="fake_sweep",
        caption="a sweep",
        frame=pd.DataFrame({"block": [16, 32], "seqs": [186.0, 93.5]}),
        run=command(RUN),
    )
    section = Section(
        title="§10.2 The naive allocator",
        intro="Intro.",
        rows=rows,
        tables=[table],
        figures=[Figure(caption="concurrency", path=path)],
    )
    return Source(name="fake", title="A fake source", about="For tests.", sections=[section])
