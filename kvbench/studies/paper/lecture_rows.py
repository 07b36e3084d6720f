"""The lecture's numbers as data: a :class:`Spec` per number (the claim as printed, kvbench's closed
form, and what kvbench measured of the same thing) and :func:`section`, which turns a section's
specs into its :class:`~kvbench.studies.paper.rows.Row` objects, keyed ``lecture.<key>``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kvbench.studies.paper.document import Section, Table
from kvbench.studies.paper.lecture_setup import fill, fill_description
from kvbench.studies.paper.rows import Row
from kvbench.studies.paper.runs import Runs, command


@dataclass(frozen=True)
class Measured:
    """What kvbench measured for a row (a run's summary column, a filled allocator, a cost-model
    call) and how: the command or kvbench call a reader repeats. ``value`` is None for a check that
    gives no number (a qualitative row's ``holds`` says what it found)."""

    value: float | None
    run: str


def as_is(value: float) -> float:
    return value


def from_run(runs: Runs, overrides: Sequence[str], column: str, convert: Callable[[float], float] = as_is) -> Measured:
    """``convert(summary[column])`` of ``kvbench <overrides>`` (run once; a later row reuses it)."""
    return Measured(convert(runs.summary(overrides)[column]), command(list(overrides)))


def ratio(numerator: Measured, denominator: Measured) -> Measured:
    """One measurement over another, with both commands."""
    return Measured(numerator.value / denominator.value, f"{numerator.run} ; {denominator.run}")


def filled(overrides: Sequence[str], context_tokens: int, s_max_tokens: int) -> Measured:
    """How many sequences a fresh allocator of ``kvbench <overrides>`` takes before it refuses."""
    return Measured(
        fill(overrides, context_tokens, s_max_tokens), fill_description(overrides, context_tokens, s_max_tokens)
    )


@dataclass(frozen=True)
class Spec:
    """One number of the lecture: its key (less ``lecture.``), what is measured, the claim as the
    lecture prints it, kvbench's closed form with its inputs (``formula``) and value, and the rest of
    :class:`~kvbench.studies.paper.rows.Row`'s judgement (``why``, tolerances, ``holds``)."""

    key: str
    quantity: str
    unit: str
    claim: str
    formula: str
    value: float
    measured: Measured | None = None
    why: str = ""
    sim_tol: float | None = None
    claim_tol: float | None = None
    holds: bool | None = None


def without_unit(claim: str, unit: str) -> str:
    """``claim`` less a trailing unit that the page prints after it anyway ("15.2%" -> "15.2")."""
    text = claim.rstrip()
    for suffix in (unit, unit.rstrip("s"), unit.split()[0] if unit else ""):
        head = text[: -len(suffix)].rstrip() if suffix and text.endswith(suffix) else ""
        if head and head[-1].isdigit():
            return head
    return claim


def row(spec: Spec, where: str) -> Row:
    """The row of ``spec``, said in the lecture at ``where`` ("§10.2", "Exercise 3")."""
    measured = spec.measured
    return Row(
        key=f"lecture.{spec.key}",
        section=where,
        quantity=spec.quantity,
        unit=spec.unit,
        claim=without_unit(spec.claim, spec.unit),  # the page prints the claim followed by its unit
        formula=spec.formula,
        formula_value=float(spec.value),
        simulated=None if measured is None else measured.value,
        run="" if measured is None else measured.run,
        why=spec.why,
        claim_tol=spec.claim_tol,
        sim_tol=spec.sim_tol,
        holds=spec.holds,
    )


def section(title: str, where: str, intro: str, specs: Sequence[Spec], tables: Sequence[Table] = ()) -> Section:
    """A section of the lecture: its rows from ``specs``, in order, and its tables."""
    return Section(title=title, intro=intro, rows=[row(spec, where) for spec in specs], tables=list(tables))


def printed_table(
    printed: Mapping[int, Any],
    line: Callable[[int, Any], tuple[list[Spec], dict]],
    name: str,
    caption: str,
    decimals: dict[str, int],
) -> tuple[list[Spec], Table]:
    """A table the lecture prints a line per block size (``printed``: its cells by block size):
    ``line(b, cells)`` gives a spec per printed cell and kvbench's own line by its closed forms.
    Every line's specs, in order, and kvbench's table of its lines."""
    specs, records = [], []
    for b, cells in printed.items():
        line_specs, record = line(b, cells)
        specs += line_specs
        records.append(record)
    frame = pd.DataFrame(records)
    return specs, Table(name, caption, frame, run="kvbench/studies/paper/lecture.py closed forms", decimals=decimals)
