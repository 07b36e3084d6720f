"""Signals, handled the same way by every kvbench command.

SIGTERM (what ``kill``, a CI runner's timeout and Slurm send) is turned into an exception raised
where the process is, so it unwinds like Ctrl-C: temporary files are removed, locks released, no
``COMPLETE`` marker is written. At the top, each command prints one line saying what was left
incomplete and exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a
shell reports a process killed by that signal.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or another handled signal), raised where the process is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


def handle_sigterm() -> None:
    """From now on SIGTERM raises :class:`Interrupted`; SIGINT keeps raising KeyboardInterrupt."""
    signal.signal(signal.SIGTERM, _raise_interrupted)


def signal_number(exc: KeyboardInterrupt) -> int:
    return exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)


def exit_interrupted(exc: KeyboardInterrupt, prog: str, left: str) -> NoReturn:
    """``<prog>: interrupted by SIGTERM; <left>`` on stderr, then exit 128 + the signal's number."""
    signum = signal_number(exc)
    print(f"{prog}: interrupted by {signal.Signals(signum).name}; {left}", file=sys.stderr)
    sys.exit(128 + signum)
