"""argparse for kvbench's subcommands, with every usage error one line and no usage block."""

from __future__ import annotations

import argparse

from kvbench.errors import ConfigError


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise ConfigError (the command prints one line, exit 2)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message} (see {self.prog} --help)")
