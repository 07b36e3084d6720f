"""The objects behind the paper's closed forms, built from a composed config exactly as a run
builds them, so that a closed form and a run with the same overrides share every input."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from omegaconf import DictConfig

from kvbench.api import ModelSpec, RunSetup, build, model_spec_of


@cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    from kvbench.api import compose
    from kvbench.studies.paper.runs import with_clock

    return compose(list(with_clock(overrides)))[0]


def composed(overrides: Sequence[str] = ()) -> DictConfig:
    """The resolved config of ``kvbench <overrides>`` (memoized: read it, do not change it)."""
    return _composed(tuple(overrides))


@cache
def _built(overrides: tuple[str, ...]) -> RunSetup:
    return build(composed(overrides))


def built(overrides: Sequence[str] = ()) -> RunSetup:
    """The run's objects for ``kvbench <overrides>`` (memoized: only read its specs and cost
    model; allocators are stateful, build a fresh one with ``setup(composed(...))``)."""
    return _built(tuple(overrides))


@cache
def model(name: str) -> ModelSpec:
    """The spec of ``model=<name>`` alone: no hardware is needed (a 175B model fits no single GPU
    config, so :func:`built` would refuse it)."""
    return model_spec_of(composed([f"model={name}"]))
