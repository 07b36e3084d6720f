"""A second process that holds a folder's kvbench lock, for tests of a writer being refused."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hang import HANG_S

HOLD = """
import sys
from pathlib import Path
from kvbench.io.atomic import folder_lock
with folder_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


@contextmanager
def held_lock(folder: Path) -> Iterator[subprocess.Popen]:
    """A live process holding ``folder``'s lock until the block ends (its stdin closes)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=HANG_S)
        proc.stdout.close()
