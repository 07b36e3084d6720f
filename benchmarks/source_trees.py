"""Two versions of kvbench side by side in one virtual environment: a commit or a copy of the
working tree, exported to a folder and made importable in a child process.

kvbench installs ``kvbench`` from ``kvbench/``, ``kvbench.conf`` from ``conf/`` and ``kvbench_plugins``
from ``plugins/``, and finds its built-in plugins through entry points. :func:`import_path` lays a
tree out that way in a folder of symbolic links (nothing inside the tree changes), with a
``kvbench-*.dist-info`` whose entry points are that tree's own. A child process with that folder
first on ``PYTHONPATH`` imports that tree's kvbench: Python's path finder comes before the
editable install's finder, and ``importlib.metadata`` keeps the first distribution of a name it
finds on the path. Everything else (numpy, pandas, Hydra) is the running environment's, so two
trees compared this way differ in kvbench's code only.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORT_DIR = ".kvbench-import"  #: the folder of links, inside the exported tree


class TreeError(RuntimeError):
    """A tree cannot be exported (no git, an unknown commit): one line saying why."""


def git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise TreeError("git is not installed") from None
    if done.returncode != 0:
        raise TreeError(
            f"git {' '.join(args)}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'failed'}"
        )
    return done.stdout


def export_commit(revision: str, dest: Path) -> str:
    """Write the files of ``revision`` (a commit, tag or ``HEAD~1``) into ``dest``; its full hash."""
    commit = git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}").strip()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return commit


def export_worktree(dest: Path) -> None:
    """Copy the working tree's files, committed or not (git-ignored ones left out), into ``dest``."""
    names = git("ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    for name in filter(None, names):
        source = ROOT / name
        if source.is_file():  # a file deleted but not yet committed is listed and absent
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def export_pair(base_rev: str, head_rev: str | None, dest: Path) -> tuple[Path, str, Path, str]:
    """Export two versions under ``dest`` for a comparison: ``base_rev`` and ``head_rev`` (None: the
    working tree, committed or not). Returns (base tree, its name, head tree, its name), a commit
    named by its revision and short hash."""
    base_tree, head_tree = dest / "base", dest / "head"
    base_name = f"{base_rev} ({export_commit(base_rev, base_tree)[:10]})"
    if head_rev is None:
        export_worktree(head_tree)
        head_name = "the working tree"
    else:
        head_name = f"{head_rev} ({export_commit(head_rev, head_tree)[:10]})"
    return base_tree, base_name, head_tree, head_name


def uncommitted_source_change() -> bool:
    """Whether kvbench's code (package, plugins, configs) in the working tree differs from HEAD."""
    paths = ("--", "kvbench", "plugins", "conf")
    return bool(
        git("diff", "--name-only", "HEAD", *paths).strip()
        or git("ls-files", "--others", "--exclude-standard", *paths).strip()
    )


def _project(tree: Path) -> dict | None:
    """The tree's ``[project]`` table from its pyproject.toml; None without tomllib (Python 3.10)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the installed kvbench's metadata is used instead
        return None
    return tomllib.loads((tree / "pyproject.toml").read_text())["project"]


def _entry_points_text(project: dict) -> str:
    """The project's ``[project.entry-points.kvbench]`` as an ``entry_points.txt``."""
    points = project.get("entry-points", {}).get("kvbench", {})
    return "[kvbench]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())


def import_path(tree: Path) -> Path:
    """The folder to put first on ``PYTHONPATH`` so that a child process imports ``tree``'s kvbench."""
    links = tree / IMPORT_DIR
    if links.is_dir():
        return links
    package = links / "kvbench"
    package.mkdir(parents=True)
    for entry in (tree / "kvbench").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    if not (package / "conf").exists():  # trees before kvbench/conf became a link to conf/ in the tree itself
        (package / "conf").symlink_to(tree / "conf")
    (links / "kvbench_plugins").symlink_to(tree / "plugins")
    project = _project(tree)
    if project is not None:
        # the tree's own version: kvbench writes it into results and paper/, which must read as the tree's
        version = project["version"]
        info = links / f"kvbench-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kvbench\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(_entry_points_text(project))
    return links


def child_env(tree: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process that imports ``tree``'s kvbench.

    PYTHONSAFEPATH keeps the child's working folder (``python -c``, ``python -m pytest``) off
    ``sys.path``: run in ``tree``, it would find ``tree/kvbench`` before the import folder, and
    that copy has no ``conf`` subpackage, so Hydra's configs would come from the installed kvbench.
    """
    path = [str(import_path(tree)), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONSAFEPATH": "1",
        **(extra or {}),
    }


def imported_from(tree: Path) -> dict[str, str]:
    """Where a child process given :func:`child_env` and run in ``tree`` imports kvbench, its
    configs and its plugins from, and the version it reports (the speed gate's and the planted
    campaign's check that a tree runs its own code under its own name)."""
    code = (
        "import json, kvbench, kvbench.conf, kvbench_plugins; from importlib.metadata import version; "
        "print(json.dumps({'kvbench': kvbench.__file__, 'conf': list(kvbench.conf.__path__)[0], "
        "'plugins': list(kvbench_plugins.__path__)[0], 'version': version('kvbench')}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=child_env(tree), capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)
