"""Where a run writes, checked before any work: a folder that cannot be written costs one line.

Hydra creates the run's folder itself (and prints a traceback when it cannot), so the folder a
command will write under is worked out from its arguments and checked first: every path component
within the filesystem's name limit, the whole path within its path limit, and the nearest existing
ancestor a writable folder.

A single run refused inside its job (a bad value only the run's setup sees) would leave the folder
Hydra made for it holding only Hydra's own files: :func:`remove_refused_run` takes it away again,
when this command made it (what was there before is recorded here, before Hydra starts).
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
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
    """The folder the command's results land under: the named one (an interpolated one: the folder
    of its fixed part), or the default root."""
    _, value = _folder_arg(args)
    if value is None:
        return Path(DEFAULT_ROOT)
    return fixed_folder(value)


def fixed_folder(pattern: str) -> Path:
    """The deepest folder a folder pattern names before its first interpolation: the pattern itself
    without one; ``out`` for ``out/${now:...}`` and for ``out/run-${now:...}`` (whose fixed part
    ends inside a name: there is no folder ``out/run-``)."""
    if "${" not in pattern:
        return Path(pattern).expanduser()
    head = pattern.split("${", 1)[0]
    return Path((head if head.endswith(("/", os.sep)) else os.path.dirname(head)) or ".").expanduser()


def check_writable(folder: Path, option: str, named: bool = True) -> None:
    """Raise a one-line ConfigError unless ``folder`` can be created and written. ``named``: the
    user gave ``option`` (else the folder is the default one, and the line names the folder, not a
    value the user never set)."""
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
        from kvbench.io.atomic import kind_of

        kind = kind_of(ancestor) or "a file"  # a FIFO or a device named as a folder: said as what it is
        raise ConfigError(f"{option}={_short(folder)} is invalid: {ancestor} is {kind}, not a folder; write elsewhere")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(_unwritable(folder, option, named, f"{ancestor} is not writable"))


def _unwritable(folder: Path, option: str, named: bool, why: str) -> str:
    """The line for a folder that cannot be written: the user's value when they gave one, else the
    default folder by its name."""
    if named:
        return f"{option}={_short(folder)} is invalid: {why}; write elsewhere with {option}=<folder>"
    return (
        f"cannot write the results: {why} (they go to {os.path.abspath(folder)} by default); "
        f"make it writable, or write elsewhere with {option}=<folder>"
    )


#: arguments that make Hydra print something and exit without running a job (nothing is written)
_NO_RUN = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--version")


def prepare_output(args: list[str]) -> Path | None:
    """Check, before Hydra starts, that the command's results folder can be written; create it.

    Returns the explicitly named folder (which the caller locks against a second writer), or None
    when results go to fresh timestamped folders (or the command writes nothing)."""
    if any(a in _NO_RUN for a in args):
        return None
    option, value = _folder_arg(args)
    root = output_root(args)
    check_writable(root, option, named=value is not None)
    fixed = explicit_output_dir(args)
    if fixed is not None:
        check_hydra_files(fixed, _is_multirun(args), _output_subdir(args))
    made = _topmost_missing(Path(os.path.abspath(root)))  # the mkdir below makes it: it is this command's
    fixed_existed = fixed is not None and os.path.lexists(fixed)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root) as probe:  # the real test: permissions, read-only mounts, quotas
            # the filesystem's own clock, which stamps what Hydra writes next (it may lag time.time())
            clock_ns = os.fstat(probe.fileno()).st_mtime_ns
    except OSError as exc:
        raise ConfigError(
            _unwritable(root, option, value is not None, f"cannot write {root} ({exc.strerror or exc})")
        ) from None
    global _BEFORE
    _BEFORE = _Before(clock_ns, made, None if fixed is None else Path(os.path.abspath(fixed)), fixed_existed)
    return fixed


#: what Hydra writes at the top of a sweep's folder
MULTIRUN_FILE = "multirun.yaml"


def _output_subdir(args: list[str]) -> str | None:
    """Hydra's output subfolder of each job (``hydra.output_subdir``: ``.hydra`` unless the command
    line says otherwise; None when it says ``null``, and Hydra writes none)."""
    values = [a.split("=", 1)[1] for a in args if a.startswith("hydra.output_subdir=")]
    value = values[-1] if values else ".hydra"
    return None if value in ("null", "~", "") else value


def check_hydra_files(folder: Path, multirun: bool, subdir: str | None) -> None:
    """Refuse, in one line, a named results folder where Hydra would write through a symbolic link
    or into something other than a file: Hydra opens ``.hydra/`` and its three files (and a sweep's
    ``multirun.yaml``) as plain paths, so a link there takes its config files outside the results
    folder, and a FIFO blocks the run. Checked in the run's folder, or in each job folder a sweep
    re-run into its folder finds."""
    jobs = [folder] if not multirun else _subfolders(folder)
    places = [(folder / MULTIRUN_FILE, "file"), *((job, "folder") for job in jobs)] if multirun else []
    if subdir is not None:
        for job in jobs:
            places.append((job / subdir, "folder"))
            places += [(job / subdir / name, "file") for name in sorted(HYDRA_FILES)]
    for path, want in places:
        if path.is_symlink():
            raise ConfigError(
                f"{path} is a symbolic link: Hydra would write the run's config through it, outside the results "
                "folder; remove the link and run again"
            )
        if not os.path.lexists(path):
            continue
        if want == "folder" and not path.is_dir():
            from kvbench.io.atomic import kind_of

            raise ConfigError(f"{path} is {kind_of(path) or 'a file'}, not Hydra's folder: remove it and run again")
        if want == "file" and not path.is_file():
            from kvbench.io.atomic import kind_of

            raise ConfigError(
                f"{path} is {kind_of(path)}, not a file: Hydra would write into it; remove it and run again"
            )


def _subfolders(folder: Path) -> list[Path]:
    """The folders in ``folder`` (a sweep's job folders), links to folders included; none when it is absent."""
    try:
        return sorted(Path(e.path) for e in os.scandir(folder) if e.is_dir())
    except OSError:
        return []


@dataclass(frozen=True)
class _Before:
    """What was there before this command's Hydra started (recorded by :func:`prepare_output`)."""

    #: the results filesystem's clock then: what was written at or after it, this command wrote
    clock_ns: int
    #: the topmost folder of the results root's path that did not exist (None: the root existed):
    #: it and everything in it are this command's
    made: Path | None
    #: the folder named by hydra.run.dir= (no interpolation), and whether it existed
    fixed_dir: Path | None
    fixed_existed: bool


_BEFORE: _Before | None = None


def _topmost_missing(path: Path) -> Path | None:
    """The topmost folder of ``path`` that does not exist (``path`` itself or an ancestor), or None."""
    missing = None
    while not os.path.lexists(path) and path.parent != path:
        missing, path = path, path.parent
    return missing


#: what Hydra writes into a job's folder before the job runs: its output subfolder's files
HYDRA_FILES = frozenset(("config.yaml", "hydra.yaml", "overrides.yaml"))


def remove_refused_run(out_dir: Path, run_dir_pattern: str, hydra_subdir: str | None) -> bool:
    """Remove the folder of a single run refused inside its job, when this command made it and it
    holds nothing but Hydra's own files; True when it is gone.

    Hydra's files are ``<hydra_subdir>/`` (``.hydra/``: config.yaml, hydra.yaml, overrides.yaml)
    and the job's log files (those of this process's logging handlers, e.g. ``kvbench.log``),
    empty; a folder without a log (job logging turned off) qualifies too, a stray file never does.
    The folder is this command's when it is the ``hydra.run.dir=`` folder and did not exist
    before, or when its name came from an interpolation (``${now:...}``, the default) and it and
    everything in it were written since this command started. Its parents go too when left empty:
    those named by the pattern's interpolations, and those this command made above them. Files
    are removed one by one and folders only when empty (never a recursive delete): a file that
    appears meanwhile keeps its folder."""
    before = _BEFORE
    if before is None:  # prepare_output did not run: nothing is known of what was there
        return False
    folder = Path(os.path.abspath(out_dir))
    logs = _job_logs(folder)
    try:
        files = _hydra_files_only(folder, hydra_subdir, logs)
        if files is None:
            return False
        if folder == before.fixed_dir:
            if before.fixed_existed:
                return False  # the user's folder: it stays, whatever it holds
        elif "${" not in run_dir_pattern or not _written_since(folder, files, before.clock_ns):
            return False  # a fixed folder named elsewhere (a config file), or one that was there before
        _close(logs)
        for path in files:
            path.unlink()
        if hydra_subdir and (folder / hydra_subdir).is_dir():
            (folder / hydra_subdir).rmdir()
        folder.rmdir()
    except OSError:  # removed, locked or changed meanwhile: whatever is left stays; the error line is said
        return False
    _remove_empty_parents(folder, run_dir_pattern, before)
    return True


def _job_logs(folder: Path) -> list[tuple[logging.Logger, logging.FileHandler]]:
    """The logging handlers writing a file inside ``folder`` (Hydra's job log, if configured)."""
    loggers = [
        logging.getLogger(),
        *(x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)),
    ]
    return [
        (logger, handler)
        for logger in loggers
        for handler in logger.handlers
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == folder
    ]


def _hydra_files_only(folder: Path, hydra_subdir: str | None, logs) -> list[Path] | None:
    """The files of ``folder`` (Hydra's, this command's folder lock, empty job logs), or None when
    it holds anything else."""
    from kvbench.io.atomic import LOCK

    log_names = {Path(handler.baseFilename).name for _, handler in logs}
    files = []
    for entry in os.scandir(folder):
        path = Path(entry.path)
        if hydra_subdir and entry.name == hydra_subdir and entry.is_dir(follow_symlinks=False):
            inner = list(os.scandir(path))
            if any(e.name not in HYDRA_FILES or not e.is_file(follow_symlinks=False) for e in inner):
                return None
            files += [Path(e.path) for e in inner]
        elif entry.name in log_names and entry.is_file(follow_symlinks=False):
            for _, handler in logs:
                if Path(handler.baseFilename).name == entry.name:
                    handler.flush()
            if entry.stat(follow_symlinks=False).st_size:
                return None  # the job logged something: a record worth keeping
            files.append(path)
        elif entry.name == LOCK and entry.is_file(follow_symlinks=False):
            # this command's lock on a hydra.run.dir= folder: its holder may remove it while holding it
            files.append(path)
        else:
            return None
    return files


def _written_since(folder: Path, files: list[Path], clock_ns: int) -> bool:
    """Whether ``folder``, its subfolders and ``files`` were all created or changed at or after
    ``clock_ns``: a folder there before, holding Hydra's files already, keeps an older time."""
    paths = [folder, *{f.parent for f in files}, *files]
    return all(os.stat(p, follow_symlinks=False).st_mtime_ns >= clock_ns for p in paths)


def _close(logs) -> None:
    """Detach and close the job log handlers, so that nothing logged later recreates the file."""
    for logger, handler in logs:
        logger.removeHandler(handler)
        handler.close()


def _remove_empty_parents(folder: Path, run_dir_pattern: str, before: _Before) -> None:
    """Remove the parents of a removed run folder that are now empty and were this command's: those
    below the pattern's fixed folder (``results/runs`` of ``results/runs/${now:...}/${now:...}``),
    named by its interpolations, and those :func:`prepare_output` made."""
    fixed = Path(os.path.abspath(fixed_folder(run_dir_pattern))) if "${" in run_dir_pattern else None
    parent = folder.parent
    while parent != parent.parent:
        named = fixed is not None and fixed in parent.parents
        made = before.made is not None and (parent == before.made or before.made in parent.parents)
        if not (named or made):
            return
        try:
            parent.rmdir()  # only when empty
        except OSError:
            return
        parent = parent.parent


def _short(folder: Path) -> str:
    text = repr(str(folder))
    return text if len(text) <= 64 else f"{text[:60]}...'"


def _limit(name: str, default: int) -> int:
    try:
        return int(os.pathconf("/", name))
    except (OSError, ValueError):
        return default
