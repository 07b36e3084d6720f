"""How a benchmark's ``main`` ends when it cannot go on: one line on stderr and an exit status
(2: a failure it can name, 130: interrupted), never a traceback. The status is returned, not
raised, so that a test calls ``main`` and reads it."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: the exit status of a run interrupted by Ctrl-C, as a shell reports it (128 + SIGINT)
INTERRUPTED_STATUS = 130


@dataclass
class Ending:
    """What a guarded block came to: ``exit_status`` is None when it ran to its end."""

    exit_status: int | None = None


@contextmanager
def one_line_failures(
    prog: str,
    *errors: type[Exception],
    error_prefix: str | None = None,
    interrupted: str = "interrupted",
) -> Iterator[Ending]:
    """Run the block; one of ``errors`` prints ``<prog>: error: <it>`` (``<error_prefix>: <it>``
    where given) and ends it with status 2, Ctrl-C prints ``<prog>: <interrupted>`` and ends it
    with 130. The caller returns ``ending.exit_status`` when it is not None."""
    ending = Ending()
    try:
        yield ending
    except errors as exc:
        print(f"{error_prefix or f'{prog}: error'}: {exc}", file=sys.stderr)
        ending.exit_status = 2
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted}", file=sys.stderr)
        ending.exit_status = INTERRUPTED_STATUS


def valgrind_missing(prog: str) -> bool:
    """True, after saying so in one line, when valgrind (which counts the instructions) is not
    on the PATH."""
    if shutil.which("valgrind") is not None:
        return False
    print(f"{prog}: error: valgrind is not installed (apt install valgrind)", file=sys.stderr)
    return True
