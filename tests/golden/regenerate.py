"""Regenerate the golden result folders: ``python tests/golden/regenerate.py [SCENARIO ...]``.

Each scenario of ``scenarios.yaml`` is run by the real ``kvbench`` CLI into a temporary folder, and
only what ``kvbench compare`` reads is kept under ``tests/golden/<scenario>/``:

    multirun.yaml            the sweep's overrides (hydra.overrides.task): the job labels; the rest
                             of Hydra's file names the generating machine's paths
    <job>/summary.parquet    the metrics compared
    <job>/summary.csv        the same row, for a readable diff in review
    <job>/config.json        the resolved config jobs are matched by
    <job>/.hydra/overrides.yaml
    <job>/COMPLETE           rewritten to vouch for exactly the files kept

Run it only when a change to kvbench's numbers is intended, and commit the result with that change.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from kvbench.io.atomic import mark_complete, write_text

GOLDEN_DIR = Path(__file__).resolve().parent
KEPT_FILES = ("summary.parquet", "summary.csv", "config.json")
MAIN = "from kvbench.commands.main import main; main()"  # the `kvbench` console script's entry point


def scenarios() -> dict[str, list[str]]:
    """Scenario name -> the full kvbench command line (without the sweep folder)."""
    data = yaml.safe_load((GOLDEN_DIR / "scenarios.yaml").read_text())
    return {name: [*map(str, args), *map(str, data["common"])] for name, args in data["scenarios"].items()}


def run_scenario(name: str, sweep_dir: Path) -> subprocess.CompletedProcess:
    """Run scenario ``name`` with the real CLI into ``sweep_dir`` (a folder that does not exist yet)."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    args = [*scenarios()[name], f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.run(
        [sys.executable, "-c", MAIN, *args],
        cwd=sweep_dir.parent,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def keep_for_golden(sweep_dir: Path, golden: Path) -> None:
    """Copy the files compare reads from a finished sweep into ``golden`` (a new folder)."""
    golden.mkdir(parents=True)
    task = OmegaConf.select(OmegaConf.load(sweep_dir / "multirun.yaml"), "hydra.overrides.task")
    write_text(golden / "multirun.yaml", OmegaConf.to_yaml({"hydra": {"overrides": {"task": list(task)}}}))
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()):
        (golden / job.name / ".hydra").mkdir(parents=True)
        for name in KEPT_FILES:
            shutil.copy2(job / name, golden / job.name / name)
        shutil.copy2(job / ".hydra" / "overrides.yaml", golden / job.name / ".hydra" / "overrides.yaml")
        mark_complete(golden / job.name, list(KEPT_FILES))


def regenerate(name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = Path(tmp) / name
        proc = run_scenario(name, sweep_dir)
        if proc.returncode != 0:
            sys.exit(f"regenerate: scenario {name} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        fresh = GOLDEN_DIR / f".{name}.new"
        shutil.rmtree(fresh, ignore_errors=True)
        keep_for_golden(sweep_dir, fresh)
    # the old folder is replaced only once the new one is whole
    shutil.rmtree(GOLDEN_DIR / name, ignore_errors=True)
    fresh.rename(GOLDEN_DIR / name)
    print(f"regenerate: {GOLDEN_DIR / name}")


def main(argv: list[str]) -> None:
    known = scenarios()
    unknown = [name for name in argv if name not in known]
    if unknown:
        sys.exit(f"regenerate: unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    for name in argv or known:
        regenerate(name)


if __name__ == "__main__":
    main(sys.argv[1:])
