"""The wheel carries what an installed kvbench needs: the config tree, the plugins, the entry points,\nits license and the notices of the data it ships."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from kvbench.app.config import CONFIG_GROUPS

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_conf_plugins_and_entry_points(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("kvbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for group in CONFIG_GROUPS:
        yamls = [n for n in names if n.startswith(f"kvbench/conf/{group}/") and n.endswith(".yaml")]
        assert yamls, f"conf/{group}/*.yaml missing from the wheel"
    assert "kvbench/conf/config.yaml" in names
    assert {
        "kvbench_plugins/allocators/paged.py",
        "kvbench_plugins/kernels/triton_paged.py",
        "kvbench_plugins/schedulers/chunked.py",
        "kvbench_plugins/preemption/swap.py",
    } <= names
    assert "kvbench/sched/scheduler.py" in names and "kvbench/core/step.py" in names
    assert "kvbench/kernels/triton_decode.py" in names
    assert "kvbench/studies/paper/data/vllm_paper_reference.json" in names
    [entry_points] = [n for n in names if n.endswith("entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[kvbench]" in text and "paged = kvbench_plugins.allocators.paged" in text
    assert "kvbench = kvbench.commands.entry:main" in text
    # kvbench's license, and beside the aiconfigurator-core excerpt its Apache-2.0 text and notice
    assert {"kvbench/profiles/LICENSE", "kvbench/profiles/NOTICE", "kvbench/profiles/README.md"} <= names
    licenses = {n.partition(".dist-info/licenses/")[2] for n in names if ".dist-info/licenses/" in n}
    assert licenses == {"LICENSE", "kvbench/profiles/LICENSE", "kvbench/profiles/NOTICE"}
    [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
    for name in ("LICENSE", "kvbench/profiles/LICENSE"):
        assert "Apache License\n                           Version 2.0" in (ROOT / name).read_text()
    assert "NVIDIA CORPORATION & AFFILIATES" in (ROOT / "kvbench/profiles/NOTICE").read_text()
    # kvbench writes its own code: nano-vllm is a dependency loaded where installed, never a copy
    assert not [n for n in names if "_nanovllm" in n or n.startswith("nanovllm/")]


def test_every_package_of_the_source_tree_is_listed_in_pyproject():
    """A folder left out of pyproject's ``packages`` imports fine from an editable install and is
    missing from a real one (a stale ``build/`` folder can even hide it from a local wheel)."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    # each folder installs as the package its deepest package-dir entry names (plugins/ as
    # kvbench_plugins, plugins/hydra_sweeper/ as hydra_plugins.kvbench_sweeper)
    folders = sorted(((ROOT / d).resolve(), p) for p, d in setuptools["package-dir"].items())

    def package_of(folder: Path) -> str:
        root, package = max(((d, p) for d, p in folders if folder.is_relative_to(d)), key=lambda e: len(e[0].parts))
        return ".".join((package, *folder.relative_to(root).parts))

    found = {
        package_of(init.parent.resolve())
        for init in [*ROOT.glob("kvbench/**/__init__.py"), *ROOT.glob("plugins/**/__init__.py")]
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_the_package_imports_from_the_folder_that_holds_a_clone_named_kvbench(tmp_path):
    """``cd ..; python -c 'from kvbench.api import run'``: the clone's root (a folder named kvbench
    with a ``plugins/`` package in it) must not shadow the installed package. A wheel install never
    had the problem; an editable one has it unless it puts a real package on the path (pyproject's
    ``[tool.distutils.editable_wheel] mode = "strict"``)."""
    (tmp_path / "kvbench").symlink_to(ROOT, target_is_directory=True)
    done = subprocess.run(
        [sys.executable, "-c", "from kvbench.api import run; import kvbench; print(kvbench.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("__init__.py"), "a namespace package (the clone's root) was imported"
