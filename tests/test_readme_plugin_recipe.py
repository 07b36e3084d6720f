"""The README's plugin recipe, followed word for word: its files, built from the README's own
code blocks, installed as a distribution, then selected on the command line it shows."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from kvbench_cli import kvbench

README = Path(__file__).resolve().parents[1] / "README.md"
#: a file of the recipe: "`path`:" or "`path` (why):" on its own line, then a fenced block
FILE_BLOCK = re.compile(r"^`(?P<path>[\w./-]+)`(?: \([^)]*\))?:\n\n```\w*\n(?P<body>.*?)```", re.M | re.S)
SMALL = ["workload.num_requests=40", "wandb.mode=disabled", "progress=false"]


def recipe() -> tuple[dict[str, str], list[str]]:
    """The recipe's files (path -> text) and its shell commands, from the README's Plugins section."""
    text = README.read_text()
    heading = re.search(r"\*\*Your own allocator in (\w+) files\*\*", text)
    section = text[heading.start() :]
    section = section[: section.index("\n### ")]
    files = {m["path"]: m["body"] for m in FILE_BLOCK.finditer(section)}
    [commands] = re.findall(r"```bash\n(.*?)```", section, re.S)
    return files, [line for line in commands.splitlines() if line.strip()]


def test_the_recipe_has_every_file_a_plugin_needs():
    files, commands = recipe()
    count = re.search(r"\*\*Your own allocator in (\w+) files\*\*", README.read_text())[1]
    assert count == {3: "three", 4: "four", 5: "five"}[len(files)], "the heading counts the files it lists"
    assert set(files) == {
        "pyproject.toml",
        "my_kvbench_plugin/__init__.py",
        "my_kvbench_plugin/conf/__init__.py",
        "my_kvbench_plugin/conf/allocator/my_allocator.yaml",
    }
    assert "name: my_allocator" in files["my_kvbench_plugin/conf/allocator/my_allocator.yaml"]
    assert commands[0] == "pip install ./my-kvbench-plugin"


@pytest.fixture
def installed_recipe(tmp_path):
    files, commands = recipe()
    root = tmp_path / "my-kvbench-plugin"
    for path, body in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(body)
    install = shlex.split(commands[0])
    assert install[:2] == ["pip", "install"]
    # offline and fast: no build isolation (setuptools is already here), kvbench already installed
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, *install[2:]], cwd=tmp_path, check=True)
    yield tmp_path, commands[1:]
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", "my-kvbench-plugin"], check=True)


def test_the_recipe_installs_and_its_allocator_runs_in_a_sweep(installed_recipe):
    cwd, commands = installed_recipe
    [sweep_command] = commands
    args = shlex.split(sweep_command)
    assert args[0] == "kvbench"
    proc = kvbench(*args[1:], *SMALL, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    [sweep] = list((cwd / "results" / "multirun").glob("*/*"))
    table = pd.read_csv(sweep / "comparison.csv")
    assert set(table["allocator"]) == {"paged", "my_allocator"}
    # the plugin starts as the paged allocator, so on identical requests it admits identically
    paged, mine = (table[table["allocator"] == name].iloc[0] for name in ("paged", "my_allocator"))
    assert mine["peak_concurrency"] == paged["peak_concurrency"]
    # tab completion and --cfg see the plugin's option too (Hydra's search path, not a pre-check)
    show = kvbench("allocator=my_allocator", "--cfg", "job", "--package", "allocator", cwd=cwd)
    assert show.returncode == 0 and "name: my_allocator" in show.stdout, show.stderr
