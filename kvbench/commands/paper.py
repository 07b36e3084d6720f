"""``kvbench paper``: regenerate ``paper/`` (the lecture's and the vLLM paper's numbers, reproduced).

    kvbench paper                 # rewrite ./paper from kvbench's closed forms and runs
    kvbench paper --check         # regenerate into a temporary folder; exit 1 if ./paper differs
    kvbench paper --only lecture  # one source (a partial paper/: for working on its rows)

Everything is built in a temporary folder beside the target and moved into place at the end, so
an interrupted run leaves the previous ``paper/`` whole.
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import importlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from kvbench.app.staging import clear_stale, make_staging
from kvbench.commands.common import Parser, run_cli
from kvbench.errors import ConfigError
from kvbench.io.atomic import kind_of
from kvbench.io.textio import read_text
from kvbench.studies.paper.document import Source
from kvbench.studies.paper.render import verdict_line, write_paper
from kvbench.studies.paper.runs import Runs

#: source name -> module whose ``build(runs, figures_dir)`` returns its :class:`Source`
SOURCES = {"lecture": "kvbench.studies.paper.lecture", "vllm_paper": "kvbench.studies.paper.vllm_paper"}
#: files compared byte for byte by ``--check``; the rest (PNG, Parquet) must exist on both sides:
#: their bytes depend on library versions, and their contents are the CSVs' numbers
TEXT_SUFFIXES = (".md", ".csv")
#: the staging folder's name (beside --out; for --check, in the temporary folder) and the name the
#: previous paper takes while the new one moves into place
STAGING_PREFIX = ".paper-"
OLD_PREFIX = ".paper-old-"


def generate(out_dir: Path, only: list[str] | None = None, progress=None) -> list[Source]:
    """Build every source into ``out_dir`` (which must be empty or absent)."""
    runs = Runs(progress=progress)
    sources = []
    for name in only or list(SOURCES):
        module = importlib.import_module(SOURCES[name])
        sources.append(module.build(runs, out_dir / "figures"))
    write_paper(sources, runs.table(), out_dir)
    return sources


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def differences(committed: Path, fresh: Path) -> list[str]:
    """What differs between the committed paper and a fresh one, one line each."""
    if not committed.is_dir():
        return [f"{committed} does not exist: run `kvbench paper` and commit it"]
    old, new = _files(committed), _files(fresh)
    lines = [f"{committed / name}: not produced any more (remove it)" for name in sorted(old - new)]
    lines += [f"{committed / name}: missing (kvbench paper writes it)" for name in sorted(new - old)]
    for name in sorted(old & new):
        if not name.endswith(TEXT_SUFFIXES):
            continue
        a = read_text(committed / name, "committed paper file").splitlines()  # damaged: one line, exit 2
        b = (fresh / name).read_text().splitlines()
        if a != b:
            diff = [
                d for d in difflib.unified_diff(a, b, lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")
            ]
            lines.append(f"{committed / name}: differs ({len(diff)} changed lines), first: {diff[0][:160]}")
    return lines


def expected_runs(out_dir: Path, only: list[str] | None) -> int | None:
    """How many runs the build takes, for its progress bar: as many as the last build of ``out_dir``
    made (one row each in its ``data/runs.csv``). None when unknown: no earlier build, or ``--only``
    (the table does not say which source needed which run)."""
    if only:
        return None
    try:
        with open(out_dir / "data" / "runs.csv", newline="", encoding="utf-8") as table:
            rows = sum(1 for _ in csv.reader(table)) - 1  # less the header
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return rows if rows > 0 else None


@contextlib.contextmanager
def _progress(total: int | None) -> Iterator[Callable[[str], None]]:
    """Yield ``show(command)``, called before each run: a bar on a terminal (runs done of ``total``,
    the time left, the command running), nothing elsewhere."""
    from kvbench.app.progress import progress_bar

    with progress_bar(total, "kvbench paper", enabled=True, unit="runs") as advance:
        started = [0]

        def show(command: str) -> None:
            advance(1 if started[0] else 0, note=command)  # the run before this one is done
            started[0] += 1

        yield show
        advance(1 if started[0] else 0)


def _body(argv: list[str]) -> int:
    parser = Parser("kvbench paper", "Regenerate paper/: the lecture's and the vLLM paper's numbers, reproduced.")
    parser.add_argument("--out", default="paper", help="the folder to (re)write (default: ./paper)")
    parser.add_argument(
        "--check", action="store_true", help="regenerate into a temporary folder and compare with --out"
    )
    parser.add_argument("--only", action="append", choices=sorted(SOURCES), help="one source (repeat for more)")
    args, overrides = parser.parse(argv)
    if overrides:
        raise ConfigError("kvbench paper takes no overrides: its runs are fixed by the sources it reproduces")
    if args.check and args.only:
        raise ConfigError("--check compares the whole paper: drop --only")
    out_dir = Path(args.out)
    if out_dir.is_symlink():  # renamed aside, the link would go and its folder stay as it was
        raise ConfigError(
            f"--out {out_dir} is a symbolic link: kvbench paper replaces the folder it names; give the folder itself"
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(
            f"--out {out_dir} is {kind_of(out_dir) or 'a file'}, not a folder: kvbench paper never replaces it"
        )
    parent = out_dir.resolve().parent
    if not args.check:
        parent.mkdir(parents=True, exist_ok=True)  # the staging folder is made beside the target

    started = time.perf_counter()
    where = None if args.check else parent
    # a run SIGKILL stopped left its staging folder (nothing of it ran again): cleared now, unless
    # its process still runs (another live `kvbench paper`)
    clear_stale(where, (f"{OLD_PREFIX}{STAGING_PREFIX}", STAGING_PREFIX))
    staging = make_staging(where, STAGING_PREFIX)
    try:
        return _build(args, out_dir, parent, staging, started)
    finally:  # an error or a signal (SIGTERM unwinds here too) leaves no staging folder behind
        shutil.rmtree(staging, ignore_errors=True)


def _build(args, out_dir: Path, parent: Path, staging: Path, started: float) -> int:
    with _progress(expected_runs(out_dir, args.only)) as show:
        sources = generate(staging, args.only, show)
    for source in sources:
        print(f"{source.name}: {verdict_line(source.rows)}")
    disagree = [row for s in sources for row in s.rows if row.sim_agrees is False]
    for row in disagree:
        print(
            f"kvbench paper: {row.key}: the run gives {row.simulated!r} but the closed form {row.formula_value!r}",
            file=sys.stderr,
        )

    if args.check:
        found = differences(out_dir, staging)
        for line in found:
            print(line)
        verdict = "up to date" if not found else f"out of date in {len(found)} files: run `kvbench paper` and commit"
        print(f"{out_dir}: {verdict} ({time.perf_counter() - started:.0f} s)")
        return 1 if found or disagree else 0

    # mkdtemp made the staging folder private (0700); the paper is a folder like any other
    staging.chmod(0o777 & ~_umask())
    old = parent / f"{OLD_PREFIX}{staging.name}"
    # no signal between the two renames: it would leave the old paper aside and no paper/ at all
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        if out_dir.exists():
            out_dir.rename(old)
        staging.rename(out_dir)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    shutil.rmtree(old, ignore_errors=True)
    print(f"wrote {out_dir}/ ({len(_files(out_dir))} files) in {time.perf_counter() - started:.0f} s")
    return 1 if disagree else 0


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main() -> None:
    run_cli(_body, "kvbench paper")


if __name__ == "__main__":
    main()
