"""kvbench runs behind the paper's numbers: each one composed and run in-process exactly as
``kvbench <overrides>`` would run it, once (a run reused by several rows is run once)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import pandas as pd

from kvbench.api import RunResult

#: added to every run: none of them changes a number (no files, figures, W&B or progress bar)
QUIET = ("progress=false", "wandb.mode=disabled", "output.write=false", "output.figures=false")

#: summary columns that depend on the machine or the checkout, never on the simulation (the
#: calibration's digest identifies a file for resumed sweeps; the ``calibration`` column names it)
_NOT_SIMULATED = ("wall", "kvbench_version", "kvbench_commit", "calibration_sha256")


#: the clock the papers' closed forms are written in: the roofline (kvbench's default kernel,
#: triton, is priced on the default H100 by the transfer's measured tables, which no closed form
#: follows); added to every run and config of the papers unless it names its own kernel
CLOCK = ("kernel=torch",)


def with_clock(overrides: Sequence[str]) -> tuple[str, ...]:
    """``overrides`` on the papers' clock (:data:`CLOCK`), unless they pick a kernel themselves."""
    if any(o.startswith(("kernel=", "+kernel=", "~kernel")) for o in overrides):
        return tuple(overrides)
    return (*CLOCK, *overrides)


def command(overrides: Sequence[str]) -> str:
    """The command line a reader types to get the same run."""
    return shlex.join(["kvbench", *with_clock(overrides)])


class Runs:
    """Runs kvbench and remembers each run by its overrides."""

    def __init__(self, progress=None) -> None:
        self._results: dict[tuple[str, ...], RunResult] = {}
        self._progress = progress  # called with the command before each new run

    def __call__(self, overrides: Sequence[str]) -> RunResult:
        key = tuple(overrides)
        if key not in self._results:
            from kvbench.api import run

            if self._progress is not None:
                self._progress(command(key))
            self._results[key] = run([*with_clock(key), *QUIET])
        return self._results[key]

    def summary(self, overrides: Sequence[str]) -> dict:
        return self(overrides).summary

    def table(self) -> pd.DataFrame:
        """Every run's command and simulated summary (no timings, no provenance): the paper's
        record of what it ran, compared exactly by the regression gate."""
        records = []
        for key, result in self._results.items():
            record = {"command": command(key)}
            record.update(
                (name, value)
                for name, value in result.summary.items()
                if not any(part in name for part in _NOT_SIMULATED)
            )
            records.append(record)
        return pd.DataFrame(records)
