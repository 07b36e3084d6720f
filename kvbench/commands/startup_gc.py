"""The cyclic garbage collector while a command starts up.

Start-up (importing kvbench, Hydra, numpy and the plugins; Hydra composing the config) makes tens of
thousands of objects that live as long as the process: modules, classes, functions, config nodes.
With the collector on, each of its full passes walks all of them again, and they come often while
so many objects are being made: measured on a 2-core x86_64 CPU, 141 collections took 45 ms of a
1-request run's 0.49 s (and 104 ms of 1.07 s with its tables and figures). So the console script
turns the collector off for start-up (:func:`begin`), and where start-up ends (a sweep or a run's
job starts, or a subcommand's own code) :func:`end` moves what start-up made to the collector's permanent
generation (``gc.freeze``: never walked again) and turns it back on for the work itself.

What freezing costs: the cycles that became garbage during start-up stay (about 6,000 objects in a
1-request run, under a megabyte); objects are still freed by reference counting as usual. It
happens once per process, so a sweep's later jobs, or tests that run kvbench in their own process
many times, never freeze again.
"""

from __future__ import annotations

import gc

#: begin() turned the collector off and end() has not turned it back on
_paused = False
#: this process has frozen one start-up's objects (at most once)
_frozen = False


def begin() -> None:
    """Start-up begins: no cyclic collection until :func:`end` (a collector already off stays off)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def end(freeze: bool = True) -> None:
    """Start-up is over: freeze what it made (the first time in this process) and turn the collector
    back on. Does nothing unless :func:`begin` turned it off, so it can be called on every path."""
    global _paused, _frozen
    if not _paused:
        return
    _paused = False
    if freeze and not _frozen:
        gc.freeze()
        _frozen = True
    gc.enable()
