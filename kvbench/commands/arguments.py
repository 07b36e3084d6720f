"""argparse for kvbench's subcommands, with every usage error one line and no usage block."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from kvbench.errors import ConfigError

#: Hydra's flag for a sweep; it may stand anywhere on kvbench's command line
MULTIRUN_FLAGS = ("-m", "--multirun")
#: an SLO given as a flag, as ``kvbench slo-batch --tpot-ms 20`` once took it (and its kin)
_SLO_FLAG = re.compile(r"--(ttft|tpot|e2e)[-_](ms|s)")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise ConfigError (the command prints one line, exit 2)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message} (see {self.prog} --help)")


def renamed_slo_flag(args: Sequence[str]) -> str | None:
    """One line for an SLO given as a flag (``--tpot-ms 20``), with its one spelling in every
    command: the config key, in seconds (``slo.tpot_s=0.02``). Refused rather than converted, so
    that a script keeps no spelling that differs from command to command."""
    for index, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        match = _SLO_FLAG.fullmatch(flag)
        if match is None:
            continue
        if not equals:
            value = args[index + 1] if index + 1 < len(args) else ""
        key = f"slo.{match[1]}_s"
        try:
            spelled = f"{key}={float(value) / (1e3 if match[2] == 'ms' else 1):g} for {flag} {value}"
        except ValueError:
            spelled = f"{key}=<seconds>"
        return (
            f"{flag} is not an option: write {spelled} (SLOs are the config keys slo.ttft_s, slo.tpot_s "
            "and slo.e2e_s, in seconds, in every kvbench command)"
        )
    return None
