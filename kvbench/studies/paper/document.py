"""What a reproduction is made of: sections of rows, extra tables (sweeps), and figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from kvbench.studies.paper.rows import Row


@dataclass(frozen=True)
class Table:
    """A table beside the rows (a sensitivity sweep, the block-size table): written to
    ``data/<name>.{csv,parquet}`` and shown in the section's Markdown."""

    #: file stem, unique across the paper
    name: str
    caption: str
    frame: pd.DataFrame
    #: the command(s) that produced it
    run: str = ""
    #: decimals per column when shown in Markdown (the files keep full precision)
    decimals: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Figure:
    """A figure a section shows (``path`` is under the paper's ``figures/``)."""

    caption: str
    path: Path

    @property
    def name(self) -> str:
        """The figure's file stem (``lecture_swap_vs_recompute``)."""
        return self.path.stem


@dataclass
class Section:
    """One part of a source (§10.3, Table 1...): an introduction, its rows, tables and figures."""

    title: str
    intro: str = ""
    rows: list[Row] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


@dataclass
class Source:
    """One reproduced source: the lecture or the vLLM paper."""

    #: file stem of its Markdown page and row table ("lecture", "vllm_paper")
    name: str
    title: str
    #: where the source comes from and how kvbench treats it
    about: str
    sections: list[Section] = field(default_factory=list)

    @property
    def rows(self) -> list[Row]:
        return [row for section in self.sections for row in section.rows]
