"""Saving the paper's figures so that the same numbers give the same file."""

from __future__ import annotations

from pathlib import Path

from kvbench.api import pyplot


def new_figure(width_in: float = 7.0, height_in: float = 4.0):
    """A matplotlib figure and axes on the Agg backend."""
    plt = pyplot()
    return plt.subplots(figsize=(width_in, height_in))


def save(fig, path: Path) -> Path:
    """Write ``fig`` as PNG without a timestamp or software tag (same numbers, same bytes on one
    matplotlib version) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    from kvbench.studies.paper.render import stamp

    fig.savefig(path, dpi=110, metadata={"Software": None, "Description": stamp()})
    pyplot().close(fig)
    return path
