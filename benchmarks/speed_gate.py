"""The paired speed gate: the simulator's loop in two versions of kvbench, timed on this machine in
the same job, on identical work.

    python benchmarks/speed_gate.py                         # the change under test against what came before
    python benchmarks/speed_gate.py --base v0.1 --head HEAD
    python benchmarks/speed_gate.py --base-tree DIR --head-tree DIR   # two folders (planted regressions)

By default HEAD is the base when kvbench's code (``kvbench/``, ``plugins/``, ``conf/``) has uncommitted
changes, and the working tree is the head; otherwise the last commit is the head and its parent the
base. Both versions run in this virtual environment (``source_trees.py``), so only kvbench's code
differs between them.

Each side is one long-lived process of its kvbench; for each of :data:`CONFIGS` the two run it in
turn, ``PAIRS`` times (base first, then head first), so that a burst of load from elsewhere falls
on neighbouring runs of both. Each run is timed by its own loop clock (``sim_wall_s``: the loop
alone, no start-up, no config composing, no table building). The statistic is the median over the
pairs of head / base: on a shared machine single runs of identical code vary by 2x (docs/ci.md),
and a pair's ratio cancels the slow drifts while the median drops the bursts. The gate fails when
that median exceeds :data:`MAX_SLOWDOWN` for any config.

Both sides must simulate exactly the same steps, or the ratio is not a speed ratio: a change that
moves kvbench's decisions is refused (exit 2), and timed again once it is the base.

Exit status: 0 within the bound, 1 slower than the bound, 2 cannot compare (no git, an unknown
commit, different work). ``docs/ci.md`` reports how often it catches planted slowdowns and how often
an unchanged build fails it on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from main_exits import one_line_failures
from source_trees import TreeError, child_env, export_pair, uncommitted_source_change

#: the largest head / base loop-time ratio that passes. An unchanged build measured 0.95-1.07 on a
#: 2-core machine kept busy by another process (docs/ci.md); 1.15 leaves room for a noisier machine
#: and sits well below the smallest slowdown the gate must catch (1.3x).
MAX_SLOWDOWN = 1.15
#: timed pairs per config (one base run and one head run each), after one untimed pair
PAIRS = 20
BASE = [
    "wandb.mode=disabled",
    "progress=false",
    "kernel=torch",
    "hardware.kv_budget_bytes=62277025792",
]
COMMON = [*BASE, "workload=lecture_chat"]
#: the loops the gate times, by name: kvbench commands on which the two sides must agree step for
#: step, each about 50 ms of loop on a 2-core machine (short runs: a burst of load spoils fewer)
CONFIGS = {
    # many events: 3,000 requests through vLLM's 128 sequences, most steps admissions and finishes
    "events": [
        *COMMON,
        "workload.num_requests=3000",
        "scheduler=prefill_first",
        "allocator=paged",
        "scheduler.max_num_batched_tokens=4096",
        "scheduler.max_num_seqs=128",
    ],
    # long quiet decode runs: 2,000 requests of 512 + 1,024 tokens, reserve-to-max (event-driven spans)
    "decode": [
        *COMMON,
        "workload.num_requests=2000",
        "workload.output_tokens=1024",
        "allocator=naive",
        "allocator.s_max_tokens=4096",
        "scheduler.max_num_seqs=128",
        "scheduler.max_num_batched_tokens=100000000",
    ],
    # arrivals: the packaged arXiv-summarization lengths (its first 120 requests, 2,600/290 tokens on
    # average) at Poisson 3/s through vLLM v0's scheduling: every arrival cuts a run of decode steps
    # short (about 7,400 steps), the regime of scale.py's 100,000-request traces
    "arrivals": [
        *BASE,
        "workload=arxiv",
        "workload.num_requests=120",
        "workload.rate_per_s=3",
        "scheduler=prefill_first",
        "allocator=paged",
        "scheduler.max_num_batched_tokens=4096",
        "scheduler.max_num_seqs=128",
        "preemption=recompute",
    ],
}

#: a side's worker process: reads a config name per line, runs it, answers one JSON line
WORKER = """
import json, sys
import kvbench
from kvbench.api import run
configs = json.loads(sys.argv[1])
print(json.dumps({"kvbench_file": kvbench.__file__}), flush=True)
for line in sys.stdin:
    s = run(configs[line.strip()]).summary
    print(json.dumps([s["sim_wall_s"], s["num_steps"], s["num_output_tokens"]]), flush=True)
"""


class NotComparable(RuntimeError):
    """The two sides cannot be timed against each other: one line saying why."""


@dataclass(frozen=True)
class Verdict:
    config: str
    #: head / base loop time of each timed pair
    ratios: tuple[float, ...]
    base_median_s: float
    head_median_s: float
    num_steps: int

    @property
    def ratio(self) -> float:
        """The median of the pairs' ratios: a burst of load spoils a pair or two, not the median."""
        return statistics.median(self.ratios)

    @property
    def passed(self) -> bool:
        return self.ratio <= MAX_SLOWDOWN


class Worker:
    """One side: a process of ``tree``'s kvbench that runs a config each time it is asked."""

    def __init__(self, tree: Path, configs: dict[str, list[str]]) -> None:
        self.tree = tree
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(configs)],
            env=child_env(tree),
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        where = self._answer()["kvbench_file"]
        if not Path(where).is_relative_to(tree):
            raise NotComparable(f"the process meant for {tree} imported kvbench from {where}")

    def _answer(self):
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            error = self.proc.stderr.read().strip().splitlines()
            raise NotComparable(f"kvbench in {self.tree} failed: {error[-1] if error else self.proc.returncode}")
        return json.loads(line)

    def run(self, config: str) -> tuple[float, int, int]:
        """(loop seconds, steps, output tokens) of one run of ``config``."""
        self.proc.stdin.write(config + "\n")
        self.proc.stdin.flush()
        return tuple(self._answer())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


def compare_trees(
    base: Path, head: Path, configs: dict[str, list[str]] = CONFIGS, pairs: int = PAIRS, progress=None
) -> list[Verdict]:
    """Time both trees, run for run in turn (base first in even pairs, head first in odd ones)."""
    workers = {"base": Worker(base, configs), "head": Worker(head, configs)}
    try:
        verdicts = []
        for name in configs:
            runs = {"base": [], "head": []}
            for number in range(pairs + 1):
                for side in ("base", "head") if number % 2 == 0 else ("head", "base"):
                    runs[side].append(workers[side].run(name))
            for side in runs:
                del runs[side][0]  # the untimed pair: first calls import and warm what later runs reuse
            work = {run[1:] for side in runs for run in runs[side]}
            if len(work) != 1:
                raise NotComparable(
                    f"{name}: the two versions simulate different work (steps, output tokens: base "
                    f"{sorted({r[1:] for r in runs['base']})}, head {sorted({r[1:] for r in runs['head']})}); "
                    "time them again once the change is the base"
                )
            base_s, head_s = ([r[0] for r in runs[side]] for side in ("base", "head"))
            verdicts.append(
                Verdict(
                    name,
                    tuple(h / b for b, h in zip(base_s, head_s)),
                    statistics.median(base_s),
                    statistics.median(head_s),
                    runs["base"][0][1],
                )
            )
            if progress is not None:
                progress(f"{name}: head/base {verdicts[-1].ratio:.3f}")
        return verdicts
    finally:
        for worker in workers.values():
            worker.close()


def default_revisions() -> tuple[str, str | None]:
    """(base, head): HEAD against the working tree when kvbench's code has uncommitted changes,
    else the last commit against its parent. ``None`` as head means the working tree."""
    return ("HEAD", None) if uncommitted_source_change() else ("HEAD~1", "HEAD")


def add_revision_arguments(parser: argparse.ArgumentParser) -> None:
    """``--base`` and ``--head``, for a benchmark that compares two commits as this gate picks them."""
    parser.add_argument("--base", help="the reference commit (default: HEAD or HEAD~1, as speed_gate.py picks)")
    parser.add_argument("--head", help="the commit under test (default: the working tree, or HEAD)")


def head_without_base(prog: str, args: argparse.Namespace) -> bool:
    """True, after saying so in one line, when ``--head`` is given alone: the default head goes
    with the default base only."""
    if args.head and not args.base:
        print(f"{prog}: error: give --base with --head", file=sys.stderr)
        return True
    return False


def report(verdicts: list[Verdict], base_name: str, head_name: str) -> str:
    lines = [f"speed gate: head {head_name} against base {base_name}, median of {PAIRS} paired runs"]
    for v in verdicts:
        lines.append(
            f"  {v.config:>8}: base {v.base_median_s * 1e3:7.1f} ms, head {v.head_median_s * 1e3:7.1f} ms (medians), "
            f"head/base {v.ratio:.3f} ({'ok' if v.passed else 'SLOWER'}, bound {MAX_SLOWDOWN}; {v.num_steps:,} steps)"
        )
    failed = [v.config for v in verdicts if not v.passed]
    lines.append(
        f"speed gate: {'FAIL: slower than x' + str(MAX_SLOWDOWN) + ' in ' + ', '.join(failed) if failed else 'OK'}"
    )
    return "\n".join(lines)


def run_gate(
    base_rev: str | None, head_rev: str | None, base_tree: Path | None, head_tree: Path | None
) -> tuple[list[Verdict], str]:
    with tempfile.TemporaryDirectory(prefix="kvbench-speed-gate-") as tmp:
        if base_tree is None or head_tree is None:
            if base_rev is None:
                base_rev, head_rev = default_revisions()
            base_tree, base_name, head_tree, head_name = export_pair(base_rev, head_rev, Path(tmp))
        else:
            base_name, head_name = str(base_tree), str(head_tree)
        verdicts = compare_trees(
            base_tree.resolve(), head_tree.resolve(), progress=lambda m: print(f"  {m}", file=sys.stderr)
        )
    return verdicts, report(verdicts, base_name, head_name)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/speed_gate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the reference commit (default: HEAD or HEAD~1, see above)")
    parser.add_argument("--head", help="the commit under test (default: the working tree, or HEAD)")
    parser.add_argument("--base-tree", type=Path, help="a folder holding a kvbench checkout, instead of --base")
    parser.add_argument("--head-tree", type=Path, help="a folder holding a kvbench checkout, instead of --head")
    args = parser.parse_args(argv)
    if (args.base_tree is None) != (args.head_tree is None) or (args.base_tree and (args.base or args.head)):
        print(
            "speed gate: error: give --base-tree and --head-tree together, and not with --base/--head", file=sys.stderr
        )
        return 2
    for folder in filter(None, (args.base_tree, args.head_tree)):
        if not (folder / "kvbench" / "__init__.py").is_file():
            print(f"speed gate: error: {folder} holds no kvbench checkout (no kvbench/__init__.py)", file=sys.stderr)
            return 2
    with one_line_failures("speed gate", TreeError, NotComparable) as ending:
        verdicts, text = run_gate(args.base, args.head, args.base_tree, args.head_tree)
    if ending.exit_status is not None:
        return ending.exit_status
    print(text)
    return 0 if all(v.passed for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
