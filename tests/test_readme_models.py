"""The README's table of the 2026 models (KV per token, state per request, weights per GPU) is what
kvbench computes from their configs (kvbench.app.model_table), never typed in."""

from __future__ import annotations

from pathlib import Path

from kvbench.api import compose, model_spec_of
from kvbench.app.model_table import HEADER, markdown, row

README = Path(__file__).resolve().parents[1] / "README.md"


def model_rows(names: list[str]) -> list[tuple[str, ...]]:
    """One row per model config named, at its own layout and precisions."""
    return [row(name, model_spec_of(compose([f"model={name}"])[0])) for name in names]


def test_the_readme_model_table_is_computed():
    lines = README.read_text().splitlines()
    start = lines.index("| " + " | ".join(HEADER) + " |")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    names = [line.split("|")[1].strip() for line in lines[start + 2 : end]]
    assert len(names) >= 10
    assert "\n".join(lines[start:end]) == markdown(model_rows(names))
