"""The committed ``paper/`` is what ``kvbench paper`` produces: a change that moves any reproduced
number, verdict or table must come with the regenerated ``paper/`` (run ``kvbench paper`` and
commit it). Figures and Parquet files must exist; their bytes are left to library versions, and
their numbers are the CSVs', which print floats at a fixed precision so that a fresh build equals
the committed one on any machine (``tests/portability.py`` proves it under other numpy and BLAS
code paths). The comparison is ``kvbench paper --check``'s own (its command line is tested on a
small source in tests/kvbench/studies/paper/test_cli.py); the build is shared with the sources' tests."""

from __future__ import annotations

from pathlib import Path

from kvbench.commands.paper import differences

PAPER_DIR = Path(__file__).resolve().parents[1] / "paper"


def test_committed_paper_is_what_kvbench_paper_produces(fresh_paper):
    folder, sources = fresh_paper
    found = differences(PAPER_DIR, folder)
    assert not found, "\n".join([*found, "If the change is intended, run `kvbench paper` and commit paper/."])
    disagree = [
        (row.key, row.simulated, row.formula_value)
        for s in sources.values()
        for row in s.rows
        if row.sim_agrees is False
    ]
    assert not disagree, f"runs that disagree with their closed form (simulated, closed form): {disagree}"
