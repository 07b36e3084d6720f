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
        raise TreeError(f"git {' '.join(args)}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'failed'}")
    return done.stdout


def export_commit(revision: str, dest: Path) -> str:
    """Write the files of ``revision`` (a commit, tag or ``HEAD~1``) into ``dest``; its full hash."""
    commit = git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}").strip()
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True).stdout
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


def uncommitted_source_change() -> bool:
    """Whether kvbench's code (package, plugins, configs) in the working tree differs from HEAD."""
    paths = ("--", "kvbench", "plugins", "conf")
    return bool(git("diff", "--name-only", "HEAD", *paths).strip() or git("ls-files", "--others", "--exclude-standard", *paths).strip())


def _entry_points_text(tree: Path) -> str | None:
    """The tree's ``[project.entry-points.kvbench]`` as an ``entry_points.txt``; None without tomllib."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the installed kvbench's entry points are used instead
        return None
    project = tomllib.loads((tree / "pyproject.toml").read_text())["project"]
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
    (package / "conf").symlink_to(tree / "conf")
    (links / "kvbench_plugins").symlink_to(tree / "plugins")
    points = _entry_points_text(tree)
    if points is not None:
        info = links / "kvbench-0.0.0+tree.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvbench\nVersion: 0.0.0+tree\n")
        (info / "entry_points.txt").write_text(points)
    return links


def child_env(tree: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process that imports ``tree``'s kvbench."""
    path = [str(import_path(tree)), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONDONTWRITEBYTECODE": "1", **(extra or {})}


def which_kvbench(tree: Path) -> str:
    """Where a child process given :func:`child_env` imports kvbench from (a check for the caller)."""
    code = "import kvbench, kvbench_plugins; print(kvbench.__file__)"
    done = subprocess.run([sys.executable, "-c", code], env=child_env(tree), capture_output=True, text=True, check=True)
    return done.stdout.strip()
