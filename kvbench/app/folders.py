"""Where a run writes, checked before any work: a folder that cannot be written costs one line.

Hydra creates the run's folder itself (and prints a traceback when it cannot), so the folder a
command will write under is worked out from its arguments and checked first: every path component
within the filesystem's name limit, the whole path within its path limit, and the nearest existing
ancestor a writable folder.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kvbench.errors import ConfigError

#: where results go when no ``hydra.run.dir`` / ``hydra.sweep.dir`` is given (conf/config.yaml)
DEFAULT_ROOT = "results"


def _is_multirun(args: list[str]) -> bool:
    return any(a in ("-m", "--multirun") for a in args)


def _folder_arg(args: list[str]) -> tuple[str, str | None]:
    """The option naming the command's folder (``hydra.sweep.dir`` for ``-m``, else ``hydra.run.dir``)
    and its last value on the command line, if any."""
    option = "hydra.sweep.dir" if _is_multirun(args) else "hydra.run.dir"
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{option}=")]
    return option, values[-1] if values else None


def explicit_output_dir(args: list[str]) -> Path | None:
    """The folder named by ``hydra.run.dir=`` (``hydra.sweep.dir=`` for ``-m``), if fixed.

    A value with an interpolation (``${now:...}``) names a fresh folder per run: None."""
    _, value = _folder_arg(args)
    return None if value is None or "${" in value else Path(value).expanduser()


def output_root(args: list[str]) -> Path:
    """The folder the command's results land under: the named one (an interpolated one: its fixed
    prefix), or the default root."""
    _, value = _folder_arg(args)
    if value is None:
        return Path(DEFAULT_ROOT)
    return Path(value.split("${", 1)[0] or ".").expanduser()


def check_writable(folder: Path, option: str) -> None:
    """Raise a one-line ConfigError unless ``folder`` can be created and written."""
    path = Path(os.path.abspath(folder))
    name_max = _limit("PC_NAME_MAX", 255)
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(
                f"{option}={_short(folder)} is invalid: the name {part[:24]!r}... is {len(os.fsencode(part))} "
                f"bytes, over this filesystem's {name_max}; use a shorter folder name"
            )
    path_max = _limit("PC_PATH_MAX", 4096)
    # a run folder adds a few levels (date/time/job/.hydra/...): keep room for them
    if len(os.fsencode(str(path))) + 128 > path_max:
        raise ConfigError(
            f"{option}={_short(folder)} is invalid: the path is too long for this filesystem ({path_max} bytes); use a shorter one"
        )
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{option}={str(folder)!r} is invalid: {ancestor} is a file, not a folder; write elsewhere")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{option}={str(folder)!r} is invalid: {ancestor} is not writable; write elsewhere with {option}=<folder>"
        )


#: arguments that make Hydra print something and exit without running a job (nothing is written)
_NO_RUN = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--version")


def prepare_output(args: list[str]) -> Path | None:
    """Check, before Hydra starts, that the command's results folder can be written; create it.

    Returns the explicitly named folder (which the caller locks against a second writer), or None
    when results go to fresh timestamped folders (or the command writes nothing)."""
    if any(a in _NO_RUN for a in args):
        return None
    option, _ = _folder_arg(args)
    root = output_root(args)
    check_writable(root, option)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):  # the real test: permissions, read-only mounts, quotas
            pass
    except OSError as exc:
        raise ConfigError(
            f"{option}={str(root)!r} is invalid: cannot write there ({exc.strerror or exc}); write elsewhere with {option}=<folder>"
        ) from None
    return explicit_output_dir(args)


def _short(folder: Path) -> str:
    text = repr(str(folder))
    return text if len(text) <= 64 else f"{text[:60]}...'"


def _limit(name: str, default: int) -> int:
    try:
        return int(os.pathconf("/", name))
    except (OSError, ValueError):
        return default
