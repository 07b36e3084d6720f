"""What kvbench's subcommands share: ``--flags`` beside kvbench overrides with one-line errors,
one line and exit 2 for bad input, one line and 128 + the signal for an interrupt, and an output
folder checked before any work."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

from kvbench.app.folders import check_writable
from kvbench.commands.arguments import OneLineParser
from kvbench.errors import ConfigError, error_line

OVERRIDES_HELP = (
    "Every other argument is a kvbench override (key=value), as for `kvbench` itself: "
    "model=opt-13b hardware=a100-40gb allocator=paged kernel=triton workload=sharegpt_like slo.tpot_s=0.05 ..."
)


class Parser(OneLineParser):
    """A one-line-error parser whose leftover ``key=value`` arguments are kvbench overrides."""

    def __init__(self, prog: str, description: str) -> None:
        super().__init__(prog=prog, description=description, epilog=OVERRIDES_HELP)

    def parse(self, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
        """The flags, and the ``key=value`` kvbench overrides in the order given."""
        args, rest = self.parse_known_args(argv)
        for arg in rest:
            if arg.startswith("-"):
                raise ConfigError(f"unknown option {arg.split('=')[0]} (see {self.prog} --help for the options)")
            if "=" not in arg:
                raise ConfigError(f"{arg!r} is neither an option nor a key=value kvbench override")
        return args, rest


def compose_checked(overrides: list[str]):
    """:func:`kvbench.api.compose`, with a bad override turned into a one-line ConfigError."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from kvbench.api import compose
    from kvbench.app.overrides import hydra_error_line

    try:
        return compose(overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(hydra_error_line(exc, overrides)) from None


def run_cli(body: Callable[[list[str]], int], prog: str = "kvbench") -> None:
    """Run ``body(sys.argv[1:])``; bad input is one ``<prog>: error:`` line and exit status 2, an
    interrupt (Ctrl-C, SIGTERM) one line and 128 + the signal's number."""
    from kvbench.commands.signals import exit_interrupted, handle_sigterm

    handle_sigterm()
    try:
        status = body(sys.argv[1:])
    except ConfigError as exc:
        from kvbench.app.overrides import with_suggestion  # a near miss of an allowed value: did you mean

        print(error_line(prog, with_suggestion(str(exc))), file=sys.stderr)
        sys.exit(2)
    except OSError as exc:  # the output folder vanished or the disk filled: nothing is marked complete
        print(
            error_line(prog, f"could not write {exc.filename or 'the results'}: {exc.strerror or exc}"), file=sys.stderr
        )
        sys.exit(2)
    except KeyboardInterrupt as exc:
        exit_interrupted(exc, prog, "nothing written is marked complete")
    if status:
        sys.exit(status)


def resolve_out_dir(given: str | None, kind: str, files: Iterable[str] = ()) -> Path:
    """``--out``, or ``results/slo/<date>/<kind>-<time>/`` (microseconds: two runs never share one),
    checked before any run: a folder that cannot be written, or one where a name of ``files`` is a
    FIFO, a device or a folder, is one line up front."""
    from kvbench.slo.common import check_folder_files

    now = datetime.now()
    out_dir = Path(given) if given else Path("results") / "slo" / f"{now:%Y-%m-%d}" / f"{kind}-{now:%H-%M-%S-%f}"
    check_writable(out_dir, "--out", named=bool(given))
    check_folder_files(out_dir, files)
    return out_dir
