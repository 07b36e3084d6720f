"""The ``kvbench`` console script: the smallest module that can catch a Ctrl-C or SIGTERM that
arrives while the command is still importing (Hydra, pandas, torch take a second or more), so
that an early interrupt is one line and exit 130/143 like a late one, not a traceback from inside
an import."""

from __future__ import annotations

import os
import sys

#: Arrow's allocator for the tables a run writes: the C library's. pyarrow's default (mimalloc
#: here) keeps the memory it freed for reuse, which a short process never needs back: a
#: 100,000-request run with its default outputs peaked at 220,384 KiB with it, 208,992 KiB without.
#: A user's own setting wins; pyarrow reads it when first imported, so it is set before any import.
ARROW_MEMORY_POOL = "system"


def main() -> None:
    from kvbench.commands import startup_gc

    startup_gc.begin()  # no collector passes over what start-up makes (startup_gc.py says why)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", ARROW_MEMORY_POOL)
    from kvbench.commands.signals import exit_interrupted, handle_sigterm

    handle_sigterm()
    try:
        if sys.argv[1:] == ["--version"]:  # kvbench's version, without importing Hydra to say it
            from kvbench.output.provenance import version_line

            print(version_line())
            return
        from kvbench.commands.main import main as cli_main

        cli_main()
    except KeyboardInterrupt as exc:  # each command handles its own; this is one that came before it could
        exit_interrupted(exc, "kvbench", "nothing was written")
    finally:  # the collector as it was, whichever way the command ended (a caller's process goes on)
        startup_gc.end(freeze=False)


if __name__ == "__main__":  # python -m kvbench.commands.entry, where no kvbench script is installed
    main()
