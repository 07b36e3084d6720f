"""How long kvbench takes to start: the commands a user types most, timed as a user waits for them.

    python benchmarks/startup.py               # 5 timed repeats of each command after one warm-up
    python benchmarks/startup.py --repeat 3    # quicker, noisier

Each command runs as a fresh process (the ``kvbench`` script next to this Python, or
``python -m kvbench.commands.main`` where there is none), in a scratch folder so that nothing lands in the
repository. Measured, per command:

- ``wall_s``: wall time from start to exit, the median of ``--repeat`` runs after one untimed warm-up
  (which fills the OS file cache); min and max are kept as a sign of the noise;
- ``peak_rss_mib``: the process's peak resident memory, the largest over the timed runs (its own
  rusage, from ``os.wait4`` in child_process.py, so one run's peak is not hidden under an earlier,
  larger one's, as it would be in ``getrusage(RUSAGE_CHILDREN)``);
- the exit status, which must be the expected one (0, or 2 for the typo): a timing of a command that
  failed would measure the failure.

Also: the imports of the 1-request run (``python -X importtime``) with the largest cumulative time,
which say where the start-up time goes. The goal is under a second for every command.
Writes ``<out>/startup.json`` and ``<out>/startup.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

# benchmarks/child_process.py (this script's folder is on sys.path): wall time and own peak RSS
from child_process import measure as measure_child

GOAL_S = 1.0
RUN_1 = ["workload.num_requests=1"]  # W&B is off by default (and an optional extra)
#: name -> (kvbench arguments, expected exit status); the run dir is appended per run (a fresh one
#: each time, so that no run finds the previous one's files)
COMMANDS = {
    "help": (["--help"], 0),
    "version": (["--version"], 0),
    "run_1_request": (RUN_1, 0),
    "run_1_request_wandb_offline": (["workload.num_requests=1", "wandb.mode=offline"], 0),  # needs kvbench[wandb]
    "typo": (["allocator=pagd"], 2),
}
RUNS = ("run_1_request", "run_1_request_wandb_offline")


def kvbench_command() -> list[str]:
    """The ``kvbench`` script this Python installed, as a user runs it; or the module."""
    script = Path(sys.executable).with_name("kvbench")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "kvbench.commands.main"]


def quiet_env() -> dict[str, str]:
    """The environment, without a WANDB_MODE that would override the mode each command asks for."""
    env = dict(os.environ)
    env.pop("WANDB_MODE", None)
    return env


def measure(name: str, args: list[str], expected: int, repeat: int, scratch: Path) -> dict:
    """One warm-up, then ``repeat`` timed runs of ``kvbench args``; exits if the status is unexpected."""
    walls_s, rss_mib = [], []
    for i in range(repeat + 1):
        run_dir = scratch / f"{name}-{i}"
        argv = kvbench_command() + args + ([f"hydra.run.dir={run_dir}"] if name in RUNS else [])
        child = measure_child(argv, env=quiet_env(), cwd=str(scratch))
        if child.returncode != expected:
            tail = " | ".join(child.stderr.strip().splitlines()[-3:])
            sys.exit(f"startup: `{' '.join(argv)}` exited {child.returncode}, not {expected}: {tail}")
        shutil.rmtree(run_dir, ignore_errors=True)
        if i:  # run 0 is the warm-up
            walls_s.append(child.wall_s)
            rss_mib.append(child.peak_rss_bytes / 2**20)
    return {
        "command": " ".join(["kvbench", *args]),
        "exit_status": expected,
        "wall_s": statistics.median(walls_s),
        "wall_min_s": min(walls_s),
        "wall_max_s": max(walls_s),
        "walls_s": walls_s,
        "peak_rss_mib": max(rss_mib),
    }


def top_imports(scratch: Path, top: int) -> list[dict]:
    """The ``top`` imports of the 1-request run with the largest cumulative time (-X importtime)."""
    cli = kvbench_command()
    argv = [
        sys.executable,
        "-X",
        "importtime",
        *(cli[1:] if cli[0] == sys.executable else cli),
        *RUN_1,
        f"hydra.run.dir={scratch / 'importtime'}",
    ]
    proc = subprocess.run(argv, cwd=scratch, capture_output=True, text=True, env=quiet_env())
    if proc.returncode != 0:
        sys.exit(f"startup: `{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    rows = []
    for line in proc.stderr.splitlines():
        # "import time: self [us] | cumulative | imported package", nesting shown by indentation
        if not line.startswith("import time:") or "imported package" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        rows.append(
            {
                "module": name.strip(),
                "depth": depth,
                "cumulative_ms": int(cumulative_us) / 1000,
                "self_ms": int(self_us) / 1000,
            }
        )
    return sorted(rows, key=lambda row: -row["cumulative_ms"])[:top]


def markdown(result: dict) -> str:
    lines = [
        "# kvbench start-up time",
        "",
        f"Measured {result['measured_utc']} with `{result['invocation']}` on {result['machine']} "
        f"({result['cpu_cores']} CPU cores, Python {result['python']}): each command run "
        f"{result['repeat']} times after one warm-up, as a fresh process; the median wall time.",
        "",
        "| command | exit | median wall s | min-max s | peak RSS MiB | goal | met |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for row in result["commands"].values():
        met = "yes" if row["wall_s"] < GOAL_S else "no"
        lines.append(
            f"| `{row['command']}` | {row['exit_status']} | {row['wall_s']:.2f} | "
            f"{row['wall_min_s']:.2f}-{row['wall_max_s']:.2f} | {row['peak_rss_mib']:.0f} | < {GOAL_S:g} s | {met} |"
        )
    lines += [
        "",
        f"Runs add `hydra.run.dir=<a scratch folder>`. Imports of `kvbench {' '.join(RUN_1)}` with "
        "the largest cumulative time (`python -X importtime`, one run; a package's time includes "
        "the imports nested under it):",
        "",
        "| module | depth | cumulative ms | self ms |",
        "|---|---:|---:|---:|",
    ]
    for row in result["top_imports"]:
        lines.append(f"| `{row['module']}` | {row['depth']} | {row['cumulative_ms']:.1f} | {row['self_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def positive_int(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed runs per command (default 5)")
    parser.add_argument("--top", type=positive_int, default=15, help="imports listed (default 15)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results",
        help="folder for startup.json and startup.md (default benchmarks/results)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvbench-startup-") as tmp:
        scratch = Path(tmp)
        commands = {}
        for name, (kv_args, expected) in COMMANDS.items():
            commands[name] = measure(name, kv_args, expected, args.repeat, scratch)
            print(f"{commands[name]['command']}: {commands[name]['wall_s']:.2f} s", flush=True)
        imports = top_imports(scratch, args.top)
    result = {
        "measured_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "invocation": " ".join(["python", "benchmarks/startup.py", *sys.argv[1:]]),
        "machine": platform.machine(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "repeat": args.repeat,
        "goal_s": GOAL_S,
        "commands": commands,
        "top_imports": imports,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "startup.md").write_text(markdown(result))
    print(f"wrote {args.out / 'startup.json'} and {args.out / 'startup.md'}")


if __name__ == "__main__":
    main()
