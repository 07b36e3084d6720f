"""How long kvbench takes to start: the commands a user types most, timed as a user waits for them,
beside the floor any Hydra application pays.

    python benchmarks/startup.py               # 5 timed rounds after one warm-up round
    python benchmarks/startup.py --repeat 3    # quicker, noisier

The floor is ``benchmarks/minimal_hydra/app.py``: a ``@hydra.main`` application with a small
config tree (four groups) that composes its config, prints one line and exits. Each command
(that app, then ``kvbench`` with the arguments below) runs as a fresh process (the ``kvbench``
script next to this Python, or ``python -m kvbench.commands.entry`` where there is none), in a
scratch folder so that nothing lands in the repository. The commands run in rounds: each round
runs every command once, in turn, so that a machine busier in one minute than the next slows all
of them alike (a shared machine's load moves absolute times by a third from one hour to the
next). Measured, per command:

- ``wall_s``: wall time from start to exit, the median of ``--repeat`` rounds after one untimed
  warm-up round (which fills the OS file cache and Python's bytecode cache: the children run
  without ``PYTHONDONTWRITEBYTECODE``, as an installed package runs, compiled once); min and
  max are kept as a sign of the noise;
- ``vs_hydra``: the median over the rounds of this command's time / the minimal Hydra app's
  time in the same round (a paired ratio: the load of the moment cancels out);
- ``peak_rss_mib``: the process's peak resident memory, the largest over the timed runs (its own
  rusage, from ``os.wait4`` in child_process.py, so one run's peak is not hidden under an earlier,
  larger one's, as it would be in ``getrusage(RUSAGE_CHILDREN)``);
- the exit status, which must be the expected one (0, or 2 for the typo): a timing of a command that
  failed would measure the failure.

The minimal app also runs writing what a kvbench run writes by default, with the same libraries
and nothing else (``output.tables=true``: a one-row table as Parquet and CSV; ``output.figure=true``:
one matplotlib figure saved as PNG): each 1-request kvbench run is paired with the app writing the
same kinds of output (``vs_own_floor``), which says how much of its time is kvbench's own and how
much the libraries its outputs need.

Also: the imports of the 1-request run (``python -X importtime``) with the largest cumulative time,
which say where the start-up time goes. The goals: under a second for every command, and a
1-request run within 1.5x the minimal Hydra application.
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
from report_files import check_report, write_report

GOAL_S = 1.0
#: a 1-request run's goal: at most this many times the minimal Hydra application's time
GOAL_VS_HYDRA = 1.5
MINIMAL_HYDRA_APP = Path(__file__).resolve().parent / "minimal_hydra" / "app.py"
RUN_1 = ["workload.num_requests=1"]  # W&B is off by default (and an optional extra)
#: name -> (arguments, expected exit status); a run's folder is appended per run (a fresh one each
#: time, so that no run finds the previous one's files). The minimal Hydra app is the baseline.
COMMANDS = {
    "minimal_hydra": (RUN_1, 0),
    # the same app writing what kvbench writes by default, with the same libraries: the floor of
    # a run that writes its tables, and of one that also draws its figure
    "minimal_hydra_tables": ([*RUN_1, "output.tables=true"], 0),
    "minimal_hydra_outputs": ([*RUN_1, "output.tables=true", "output.figure=true"], 0),
    "run_1_request": (RUN_1, 0),
    "run_1_request_no_output": ([*RUN_1, "output.write=false"], 0),
    "run_1_request_no_figures": ([*RUN_1, "output.figures=false"], 0),  # its tables, no figure
    "help": (["--help"], 0),
    "version": (["--version"], 0),
    "run_1_request_wandb_offline": ([*RUN_1, "wandb.mode=offline"], 0),  # needs kvbench[wandb]
    "typo": (["allocator=pagd"], 2),
}
BASELINE = "minimal_hydra"
#: the minimal Hydra app's commands
HYDRA_APPS = ("minimal_hydra", "minimal_hydra_tables", "minimal_hydra_outputs")
RUNS = (
    *HYDRA_APPS,
    "run_1_request",
    "run_1_request_no_output",
    "run_1_request_no_figures",
    "run_1_request_wandb_offline",
)
#: the runs the 1.5x goal is about
GOAL_RUNS = ("run_1_request", "run_1_request_no_output", "run_1_request_no_figures")
#: each of those runs' own floor: the minimal Hydra app writing the same outputs
OWN_FLOOR = {
    "run_1_request": "minimal_hydra_outputs",
    "run_1_request_no_output": "minimal_hydra",
    "run_1_request_no_figures": "minimal_hydra_tables",
}


def kvbench_command() -> list[str]:
    """The ``kvbench`` script this Python installed, as a user runs it; or the module."""
    script = Path(sys.executable).with_name("kvbench")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "kvbench.commands.entry"]


def command(name: str) -> list[str]:
    """The argv that starts ``name`` (without its run folder)."""
    args, _ = COMMANDS[name]
    if name in HYDRA_APPS:
        return [sys.executable, str(MINIMAL_HYDRA_APP), *args]
    return [*kvbench_command(), *args]


def display(name: str) -> str:
    """How the table shows a command."""
    args, _ = COMMANDS[name]
    return " ".join(["minimal Hydra app" if name in HYDRA_APPS else "kvbench", *args])


def child_env() -> dict[str, str]:
    """The environment, without a WANDB_MODE that would override the mode each command asks for, and
    without PYTHONDONTWRITEBYTECODE: an installed package runs from its bytecode cache."""
    env = dict(os.environ)
    env.pop("WANDB_MODE", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_once(name: str, scratch: Path, round_: int):
    """One run of ``name``; exits if its status is not the expected one."""
    run_dir = scratch / f"{name}-{round_}"
    argv = command(name) + ([f"hydra.run.dir={run_dir}"] if name in RUNS else [])
    child = measure_child(argv, env=child_env(), cwd=str(scratch))
    expected = COMMANDS[name][1]
    if child.returncode != expected:
        tail = " | ".join(child.stderr.strip().splitlines()[-3:])
        sys.exit(f"startup: `{' '.join(argv)}` exited {child.returncode}, not {expected}: {tail}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return child


def measure(names: list[str], repeat: int, scratch: Path) -> dict[str, dict]:
    """One warm-up round, then ``repeat`` timed rounds, each running every command once in turn."""
    walls_s: dict[str, list[float]] = {name: [] for name in names}
    rss_mib: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeat + 1):
        for name in names:
            child = run_once(name, scratch, round_)
            if round_:  # round 0 is the warm-up
                walls_s[name].append(child.wall_s)
                rss_mib[name].append(child.peak_rss_bytes / 2**20)
        if round_:
            print(
                f"round {round_}: " + ", ".join(f"{n} {walls_s[n][-1]:.2f} s" for n in names),
                file=sys.stderr,
                flush=True,
            )
    base = walls_s[BASELINE]
    measured = {
        name: {
            "command": display(name),
            "exit_status": COMMANDS[name][1],
            "wall_s": statistics.median(walls_s[name]),
            "wall_min_s": min(walls_s[name]),
            "wall_max_s": max(walls_s[name]),
            "walls_s": walls_s[name],
            # paired: each round's ratio, then their median
            "vs_hydra": statistics.median(w / b for w, b in zip(walls_s[name], base)),
            "peak_rss_mib": max(rss_mib[name]),
        }
        for name in names
    }
    for name, floor in OWN_FLOOR.items():
        if name in walls_s and floor in walls_s:  # paired with its own floor, round by round
            measured[name]["own_floor"] = floor
            measured[name]["vs_own_floor"] = statistics.median(w / f for w, f in zip(walls_s[name], walls_s[floor]))
    return measured


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
    proc = subprocess.run(argv, cwd=scratch, capture_output=True, text=True, env=child_env())
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


def _goal(name: str, row: dict) -> tuple[str, str]:
    """The goal a command is held to, in words, and whether it is met."""
    if name == BASELINE:
        return "the floor", ""
    if name in HYDRA_APPS:
        return "a floor with outputs", ""
    if name in GOAL_RUNS:
        met = row["vs_hydra"] <= GOAL_VS_HYDRA and row["wall_s"] < GOAL_S
        return f"< {GOAL_S:g} s, <= {GOAL_VS_HYDRA:g}x", "yes" if met else "no"
    return f"< {GOAL_S:g} s", "yes" if row["wall_s"] < GOAL_S else "no"


def markdown(result: dict) -> str:
    lines = [
        "# kvbench start-up time",
        "",
        f"Measured {result['measured_utc']} with `{result['invocation']}` on {result['machine']} "
        f"({result['cpu_cores']} CPU cores, Python {result['python']}): {result['repeat']} rounds after one "
        "warm-up round, each round running every command once in turn, as a fresh process (with Python's "
        "bytecode cache, as an installed package runs); the median wall time, and the median of each "
        "round's ratio to the minimal Hydra application's time in that round (`benchmarks/minimal_hydra/app.py`: "
        "a `@hydra.main` app with four config groups that composes, prints one line and exits). "
        "With `output.tables=true` the same app also writes a one-row table as Parquet and CSV, and with "
        "`output.figure=true` it draws one matplotlib figure and saves it as PNG: the libraries a kvbench "
        "run writes its default outputs with, and nothing else. *vs its own floor* pairs a kvbench run with "
        "the app writing the same kinds of output (nothing; tables; tables and a figure).",
        "",
        "| command | exit | median wall s | min-max s | vs minimal Hydra app | vs its own floor "
        "| peak RSS MiB | goal | met |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, row in result["commands"].items():
        goal, met = _goal(name, row)
        own = f"{row['vs_own_floor']:.2f}x" if "vs_own_floor" in row else ""
        lines.append(
            f"| `{row['command']}` | {row['exit_status']} | {row['wall_s']:.2f} | "
            f"{row['wall_min_s']:.2f}-{row['wall_max_s']:.2f} | {row['vs_hydra']:.2f}x | {own} | "
            f"{row['peak_rss_mib']:.0f} | {goal} | {met} |"
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
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--top", type=positive_int, default=15, help="imports listed (default 15)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results",
        help="folder for startup.json and startup.md (default benchmarks/results)",
    )
    args = parser.parse_args()
    check_report("startup", args.out, ["startup.json", "startup.md"])
    with tempfile.TemporaryDirectory(prefix="kvbench-startup-") as tmp:
        scratch = Path(tmp)
        commands = measure(list(COMMANDS), args.repeat, scratch)
        for row in commands.values():
            own = f", {row['vs_own_floor']:.2f}x its own floor" if "vs_own_floor" in row else ""
            print(f"{row['command']}: {row['wall_s']:.2f} s, {row['vs_hydra']:.2f}x the minimal Hydra app{own}")
        imports = top_imports(scratch, args.top)
    result = {
        "measured_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "invocation": " ".join(["python", "benchmarks/startup.py", *sys.argv[1:]]),
        "machine": platform.machine(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "repeat": args.repeat,
        "goal_s": GOAL_S,
        "goal_vs_hydra": GOAL_VS_HYDRA,
        "baseline": display(BASELINE),
        "commands": commands,
        "top_imports": imports,
    }
    write_report(
        "startup", args.out, {"startup.json": json.dumps(result, indent=2) + "\n", "startup.md": markdown(result)}
    )
    print(f"wrote {args.out / 'startup.json'} and {args.out / 'startup.md'}")


if __name__ == "__main__":
    from kvbench.commands.signals import exit_interrupted, handle_sigterm

    handle_sigterm()  # SIGTERM unwinds like Ctrl-C: the running command is stopped, nothing is written
    try:
        main()
    except KeyboardInterrupt as exc:
        exit_interrupted(exc, "startup", "no report was written")
