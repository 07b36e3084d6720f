"""The README's matrix of which measured kernel prices which shipped model is what
``kvbench profiles`` computes from kvbench's excerpt of the tables (never typed in by hand)."""

from __future__ import annotations

from pathlib import Path

from kvbench_plugins.kernels.measured import MEASURED_KERNELS

from kvbench.app.profile_coverage import coverage, matrix
from kvbench.specs import profiles

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_matrix() -> tuple[list[str], list[tuple[str, ...]]]:
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| `model=` |"))
    header = [cell.strip().strip("`") for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(tuple(cell.strip() for cell in line.strip("|").split("|")))
    return [h.removeprefix("hardware=") for h in header[2:]], rows


def test_the_readme_matrix_is_computed(monkeypatch):
    monkeypatch.setenv(profiles.SOURCE_VARIABLE, "excerpt")  # the README's says "from the excerpt"
    profiles.table_root.cache_clear()
    profiles.read_table.cache_clear()
    try:
        hardware, rows = readme_matrix()
        assert hardware == list(profiles.SYSTEMS)
        assert rows == matrix(coverage(MEASURED_KERNELS, hardware), hardware)
    finally:
        profiles.table_root.cache_clear()
        profiles.read_table.cache_clear()
