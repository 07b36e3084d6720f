"""Proof that kvbench's committed numbers do not depend on the machine: ``python tests/portability.py``.

The golden gate (``tests/test_golden.py``) and the paper check (``tests/test_paper.py``) compare
fresh runs with committed files. Both must pass on any CPU, not only on the one that wrote the files,
so this script re-runs them where a float's last bits are most likely to move:

- numpy's SIMD dispatch switched off (``NPY_DISABLE_CPU_FEATURES``: every feature above the build's
  baseline, then AVX-512 only), so its sums and means take other code paths;
- OpenBLAS forced onto other CPU kernels (``OPENBLAS_CORETYPE``), as on an older or newer x86 CPU;
- the oldest numpy, pandas and pyarrow that pyproject.toml allows, in a fresh virtual environment
  (the newest are what the README's install resolves, so the main test run covers them).

Each setting runs ``pytest tests/test_golden.py tests/test_paper.py tests/kvbench/io/test_numeric_csv.py``
(the last: kvbench's CSV writer against the bytes this numpy and pandas write) in a subprocess; settings run
side by side, one per CPU core. Exit status: 0 every setting passed, 1 some setting failed (its
output is printed), 2 bad usage. CI runs it after the README's test command (``.ci/run``).

    python tests/portability.py                 # every setting
    python tests/portability.py --skip-oldest   # no new virtual environment (offline machines)
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import requires
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ["tests/test_golden.py", "tests/test_paper.py", "tests/kvbench/io/test_numeric_csv.py"]
#: the libraries whose code computes or writes kvbench's floats; their oldest allowed versions
#: are the lower bounds of the installed kvbench's requirements (pyproject.toml's)
OLDEST = ("numpy", "pandas", "pyarrow")
#: what the checks need besides kvbench (pytest's addopts name pytest-benchmark's options;
#: kvbench.testing imports hypothesis)
TEST_TOOLS = ("pytest", "pytest-benchmark", "hypothesis")
PYTEST_TIMEOUT_S = 1800


@dataclass
class Setting:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable
    #: builds what the setting runs in (a virtual environment); returns why it failed, or ""
    prepare: Callable[[], str] | None = None
    #: filled in when it has run
    passed: bool | None = None
    wall_s: float = 0.0
    output: str = ""


def numpy_features() -> tuple[list[str], list[str], dict[str, bool]]:
    """This numpy's baseline features, its dispatched ones, and which the CPU has."""
    try:
        from numpy._core import _multiarray_umath as umath  # numpy 2
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as umath
    return list(umath.__cpu_baseline__), list(umath.__cpu_dispatch__), dict(umath.__cpu_features__)


def dispatch_settings() -> list[Setting]:
    """numpy's SIMD paths off (all, then AVX-512 only) and OpenBLAS on other kernels, combined so
    that each run changes both libraries' code paths."""
    _, dispatched, has = numpy_features()
    above_baseline = " ".join(dispatched)
    avx512 = " ".join(f for f in dispatched if f.startswith(("AVX512", "X86_V4")))
    settings = [Setting("numpy at its baseline SIMD only", {"NPY_DISABLE_CPU_FEATURES": above_baseline})]
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return settings  # OpenBLAS's core types below are x86's
    settings[0].name += ", OpenBLAS Prescott kernels"
    settings[0].env["OPENBLAS_CORETYPE"] = "Prescott"
    settings.append(Setting("OpenBLAS Nehalem kernels", {"OPENBLAS_CORETYPE": "Nehalem"}))
    if has.get("AVX2"):  # OpenBLAS's Haswell kernels need AVX2
        settings.append(
            Setting(
                "numpy without AVX-512, OpenBLAS Haswell kernels",
                {"NPY_DISABLE_CPU_FEATURES": avx512, "OPENBLAS_CORETYPE": "Haswell"},
            )
        )
    return settings


def lower_bounds() -> dict[str, str]:
    """``{"numpy": "1.26", ...}``: the lower bound kvbench's requirements give each of OLDEST."""
    from packaging.requirements import Requirement

    bounds = {}
    for text in requires("kvbench") or []:
        req = Requirement(text)
        if req.name in OLDEST and req.marker is None:
            bounds[req.name] = next(s.version for s in req.specifier if s.operator == ">=")
    missing = set(OLDEST) - set(bounds)
    if missing:
        sys.exit(f"portability: kvbench's requirements give no lower bound (>=) for {', '.join(sorted(missing))}")
    return bounds


def oldest_setting(venv: Path) -> Setting:
    """A fresh virtual environment with kvbench and the oldest allowed numpy, pandas and pyarrow."""
    pins = [f"{name}=={version}" for name, version in lower_bounds().items()]
    python = venv / "bin" / "python"

    def prepare() -> str:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        done = subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-e",
                str(ROOT),
                *pins,
                *TEST_TOOLS,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return "" if done.returncode == 0 else f"pip install failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"

    return Setting("oldest allowed " + ", ".join(pins), python=str(python), prepare=prepare)


def versions(python: str, env: dict[str, str]) -> str:
    """What the subprocess really runs with: library versions and numpy's active SIMD features."""
    code = (
        "import numpy, pandas, pyarrow\n"
        "try:\n    from numpy._core import _multiarray_umath as u\n"
        "except ImportError:\n    from numpy.core import _multiarray_umath as u\n"
        "top = [f for f in u.__cpu_dispatch__ if u.__cpu_features__.get(f)]\n"
        "print(f'numpy {numpy.__version__}, pandas {pandas.__version__}, pyarrow {pyarrow.__version__}; '\n"
        '      f\'numpy SIMD beyond baseline: {" ".join(top) or "none"}\')'
    )
    done = subprocess.run([python, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, check=False)
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def run(setting: Setting) -> Setting:
    started = time.perf_counter()
    failure = setting.prepare() if setting.prepare is not None else ""
    if failure:
        setting.passed, setting.output = False, failure
        return setting
    env = {**os.environ, **setting.env, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [setting.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CHECKS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=PYTEST_TIMEOUT_S,
        check=False,
    )
    setting.wall_s = time.perf_counter() - started
    setting.passed = done.returncode == 0
    setting.output = f"{versions(setting.python, setting.env)}\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
    return setting


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tests/portability.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-oldest", action="store_true", help="leave out the oldest-versions environment")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvbench-portability-") as tmp:
        settings = dispatch_settings()
        if not args.skip_oldest:
            settings.append(oldest_setting(Path(tmp) / "oldest"))
        print(f"portability: {' + '.join(CHECKS)} under {len(settings)} settings", flush=True)
        with ThreadPoolExecutor(max_workers=max(1, min(len(settings), os.cpu_count() or 1))) as pool:
            for setting in pool.map(run, settings):
                verdict = "pass" if setting.passed else "FAIL"
                env = " ".join(f"{k}={v!r}" for k, v in setting.env.items()) or "-"
                print(
                    f"- {verdict}: {setting.name} ({setting.wall_s:.0f} s)\n    env: {env}\n    "
                    f"{setting.output.splitlines()[0] if setting.output else ''}",
                    flush=True,
                )
                if not setting.passed:
                    print(setting.output)
    failed = [s.name for s in settings if not s.passed]
    print(f"portability: {'FAIL: ' + '; '.join(failed) if failed else 'every setting passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
