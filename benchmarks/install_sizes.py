"""What each install brings: the numbers of the README's table "Installing: what each extra brings".

    python benchmarks/install_sizes.py                  # every extra; 10 to 20 minutes, mostly downloads
    python benchmarks/install_sizes.py --only test wandb

Each install runs in a fresh virtual environment of this Python: ``pip install -e '<repo>[<extra>]'``
(the plain ``pip install -e <repo>`` for ``base``). The packages are those ``pip list`` shows beyond
an empty environment's (kvbench itself included); the size is ``du`` of the environment beyond an
empty one's. Results: ``benchmarks/results/install_sizes.{json,md}``. Exit status 0; 2 when an
install fails (its last line says why).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def extras() -> list[str]:
    """``base`` and every extra pyproject.toml declares, in its order."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise SystemExit(
            "install_sizes.py reads pyproject.toml with tomllib: run it with Python 3.11 or newer"
        ) from None
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return ["base", *project["optional-dependencies"]]


def venv(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    return folder / "bin" / "python"


def packages(python: Path) -> set[str]:
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True
    )
    return {row["name"].lower() for row in json.loads(listed.stdout)}


def size_bytes(folder: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(folder)], capture_output=True, text=True, check=True).stdout.split()[0])


def measure(extra: str, work: Path, empty: tuple[set[str], int]) -> dict:
    folder = work / extra
    python = venv(folder)
    target = str(ROOT) if extra == "base" else f"{ROOT}[{extra}]"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "-e", target], capture_output=True, text=True
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"install_sizes: {extra}: the install failed: {tail}")
    return {
        "extra": extra,
        "packages": len(packages(python) - empty[0]),
        "size_bytes": size_bytes(folder) - empty[1],
    }


def markdown(rows: list[dict], command: str) -> str:
    lines = [
        "# What each install brings",
        "",
        f"`{command}`; Python {sys.version.split()[0]}, each in a fresh virtual environment",
        "",
        "| install | packages | size |",
        "|---|---:|---:|",
    ]
    for row in rows:
        name = "`pip install -e .`" if row["extra"] == "base" else f"`.[{row['extra']}]`"
        size = row["size_bytes"]
        shown = f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"
        lines.append(f"| {name} | {row['packages']} | {shown} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=extras(), help="these installs only")
    args = parser.parse_args()
    wanted = args.only or extras()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvbench-install-") as tmp:
        work = Path(tmp)
        empty_python = venv(work / "empty")
        empty = (packages(empty_python), size_bytes(work / "empty"))
        for i, extra in enumerate(wanted, 1):
            rows.append(measure(extra, work, empty))
            print(f"[{i}/{len(wanted)}] {extra}: {rows[-1]['packages']} packages", flush=True)
    command = " ".join(["python", "benchmarks/install_sizes.py", *sys.argv[1:]])
    from kvbench.io.atomic import write_json, write_text

    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / "install_sizes.json", {"command": command, "rows": rows})
    write_text(RESULTS / "install_sizes.md", markdown(rows, command))
    print(markdown(rows, command))


if __name__ == "__main__":
    main()
