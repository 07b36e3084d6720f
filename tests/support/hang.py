"""The one time limit a test puts on a child process or a thread: a guard against a hang, never a
bound on speed. Every such wait takes :data:`HANG_S`, minutes past any run of these tests on a busy
2-core machine (the slowest child, a validate replay, takes about 2 minutes there), so a slow
machine never fails a test; a hang fails with :func:`hang_message` instead of stopping CI."""

from __future__ import annotations

#: seconds before a child process or a thread a test waits for is taken for hung
HANG_S = 1800


def hang_message(what: object) -> str:
    """What a test says when :data:`HANG_S` ran out: a hang, not a slow machine."""
    return (
        f"{what} did not end in {HANG_S // 60} minutes: it hangs (this guard is far past any run on a "
        "busy machine; it is not a speed bound)"
    )
