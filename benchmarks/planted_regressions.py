"""Planted regressions: does each gate catch what it is there for?

    python benchmarks/planted_regressions.py                  # every mutant, then the speed gate
    python benchmarks/planted_regressions.py --only victim_order --only slowdown_1.3x
    python benchmarks/planted_regressions.py --busy           # a CPU-bound process runs meanwhile

Each semantic mutant is a one-line bug planted in a copy of the working tree (an off-by-one in
block rounding, the watermark ignored, the victim order reversed, a cost-model constant moved by
2 %, ...). The copy is made importable in this virtual environment (``source_trees.py``) and three
detectors run in it, each of them as CI runs it:

- the golden gate (``tests/test_golden.py``: two sweeps against committed results, by ``kvbench compare``);
- the paper check (``tests/test_paper.py``: ``kvbench paper`` against the committed ``paper/``);
- the rest of the unit suite, fastest-to-fail folders first, stopping at the first failure.

A mutant is caught when any of them fails; the table names which did, and the first failing unit
test. An unmutated copy (the control) must pass all three.

Each planted slowdown makes the simulator's loop 1.3x or 3x slower (it spins, at the loop's end,
for 0.3 or 2 times the loop's own time so far) and is timed against the unmutated copy by the
paired speed gate (``speed_gate.py``) ``--speed-runs`` times; the unchanged copy against itself
``--control-runs`` times is the false-alarm rate. The in-suite speed gates
(``benchmarks/test_speed_gate.py``, the README's test command) run once in each slowed copy.

Results: ``benchmarks/results/planted_regressions.{json,md}`` (docs/ci.md quotes the table).
Exit status: 0 every mutant caught and no false alarm, 1 otherwise, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from report_files import check_report, write_report
from source_trees import ROOT, child_env, export_worktree
from speed_gate import CONFIGS, MAX_SLOWDOWN, NotComparable, compare_trees

RESULTS = ROOT / "benchmarks" / "results"
PYTEST = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
PYTEST_TIMEOUT_S = 3600
#: the unit suite's folders, fastest to fail on a semantic bug first; anything not listed runs
#: after them, and the paper's own tests (a minute to build) and the GPU script's dry run last
UNIT_ORDER = (
    "tests/plugins/allocators",
    "tests/plugins/preemption",
    "tests/plugins/schedulers",
    "tests/kvbench/memory",
    "tests/kvbench/sched",
    "tests/kvbench/test_engine.py",
    "tests/kvbench/metrics",
    "tests/kvbench/exec",
    "tests/kvbench/workload",
    "tests/kvbench/specs",
    "tests/plugins/workloads",
    "tests/kvbench/slo",
)
UNIT_LAST = ("tests/kvbench/studies/paper", "tests/gpu")
#: the gates themselves (run apart), and tests that install packages into this shared environment
#: (they check packaging, not numbers, and would race with a parallel run)
UNIT_EXCLUDED = (
    "tests/test_golden.py",
    "tests/test_paper.py",
    "tests/test_readme_plugin_recipe.py",
    "tests/test_packaging.py",
)
UNIT_DESELECTED = ("tests/kvbench/commands/test_main.py::test_an_outside_distribution_adds_an_allocator",)


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str  #: the bug, in words
    path: str  #: the file it is planted in
    old: str  #: text that occurs exactly once in that file
    new: str


#: one-line bugs of the kinds a change to an allocator, a scheduler or the cost model could make
SEMANTIC = (
    Mutant(
        "block_rounding",
        "paged allocation takes n // B + 1 blocks: one too many when n is a multiple of B",
        "plugins/allocators/paged.py",
        "num_blocks = -(-num_tokens // self._block_size_tokens)",
        "num_blocks = num_tokens // self._block_size_tokens + 1",
    ),
    Mutant(
        "watermark_ignored",
        "admission keeps no watermark free",
        "kvbench/sched/admission.py",
        "self._headroom_bytes = self.watermark_bytes if self.num_running_seqs else 0",
        "self._headroom_bytes = 0",
    ),
    Mutant(
        "victim_order",
        "preemption takes the oldest running request instead of the newest",
        "kvbench/sched/preemption.py",
        "    return len(candidates) - 1\n",
        "    return 0\n",
    ),
    Mutant(
        "weights_time_2pct",
        "a cost-model constant moved by 2 %: weights stream at 98 % of HBM bandwidth",
        "kvbench/exec/costmodel.py",
        "self.model.weight_bytes / self.hardware.hbm_bandwidth_bytes_per_s",
        "self.model.weight_bytes / (0.98 * self.hardware.hbm_bandwidth_bytes_per_s)",
    ),
    Mutant(
        "prefix_cache_mru",
        "the prefix cache evicts its most recently used block instead of the least",
        "plugins/allocators/paged.py",
        "self._evictable.popitem(last=False)",
        "self._evictable.popitem(last=True)",
    ),
    Mutant(
        "freed_block_kept",
        "a freed sequence keeps its first block (a leak, as a preempted request keeping one block)",
        "plugins/allocators/paged.py",
        "                self._free_block_ids.extend(reversed(table))\n",
        "                self._free_block_ids.extend(reversed(table[1:]))\n",
    ),
    Mutant(
        "recompute_count",
        "a recompute preemption counts one position fewer as recomputed",
        "kvbench/sched/victims.py",
        "victim.num_recomputed_tokens += kv_tokens",
        "victim.num_recomputed_tokens += kv_tokens - 1",
    ),
    Mutant(
        "tpot_denominator",
        "TPOT divides by all output tokens, not by the tokens after the first",
        "kvbench/metrics/summary.py",
        "/ (longest_tokens[has_tpot] - 1)",
        "/ longest_tokens[has_tpot]",
    ),
    Mutant(
        "percentile_method",
        "percentiles take the lower sample instead of interpolating",
        "kvbench/metrics/summary.py",
        "float(np.percentile(values, p))",
        "float(np.percentile(values, p, method='lower'))",
    ),
    Mutant(
        "swap_overhead_once",
        "a swap pays the per-copy overhead once instead of once per copy",
        "kvbench/exec/costmodel.py",
        "transfer.num_runs * hw.host_transfer_overhead_s",
        "hw.host_transfer_overhead_s",
    ),
    Mutant(
        "seq_cap_off_by_one",
        "admission stops one sequence below max_num_seqs",
        "kvbench/sched/admission.py",
        "            if self._seqs_counted(plan) + group.num_live > cfg.max_num_seqs:",
        "            if self._seqs_counted(plan) + group.num_live >= cfg.max_num_seqs:",
    ),
    Mutant(
        "chunked_decodes_free",
        "chunked prefill does not charge decodes to the step's token budget",
        "plugins/schedulers/chunked.py",
        "budget -= self.run_running(plan, budget)",
        "self.run_running(plan, budget)",
    ),
    Mutant(
        "copy_cost_halved",
        "a device copy is priced as a read only (bytes / bandwidth, not 2 x bytes)",
        "kvbench/exec/costmodel.py",
        "return 2.0 * num_bytes / self.hardware.hbm_bandwidth_bytes_per_s",
        "return num_bytes / self.hardware.hbm_bandwidth_bytes_per_s",
    ),
)

#: the loop's end, where a planted slowdown spins for (factor - 1) x the loop's wall time so far
LOOP_END = ("kvbench/engine.py", "        return recorder.finish()\n")
SLOWDOWNS = (1.3, 3.0)


def slowdown(factor: float) -> Mutant:
    path, old = LOOP_END
    spin = (
        f"        _clock = __import__('time').perf_counter\n"
        f"        _until = _clock() + {factor - 1!r} * (_clock() - recorder._wall_start_s)\n"
        f"        while _clock() < _until:\n            pass\n"
    )
    return Mutant(f"slowdown_{factor:g}x", f"the loop takes {factor:g}x its time", path, old, spin + old)


def plant(mutant: Mutant | None, dest: Path) -> Path:
    """A copy of the working tree in ``dest``, with ``mutant`` planted (None: unchanged)."""
    export_worktree(dest)
    if mutant is not None:
        target = dest / mutant.path
        text = target.read_text()
        if text.count(mutant.old) != 1:
            raise SystemExit(
                f"planted_regressions: {mutant.name}: the text to replace occurs {text.count(mutant.old)} "
                f"times in {mutant.path} (the code moved: update the mutant)"
            )
        target.write_text(text.replace(mutant.old, mutant.new))
    return dest


@dataclass
class Detection:
    passed: bool
    first_failure: str
    wall_s: float


def run_in(tree: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run in ``tree`` as a child that imports the tree's own kvbench, warnings off and
    output captured, for at most PYTEST_TIMEOUT_S; a non-zero exit is the caller's to read."""
    return subprocess.run(
        argv,
        cwd=tree,
        env=child_env(tree, {"PYTHONWARNINGS": "ignore"}),
        capture_output=True,
        text=True,
        timeout=PYTEST_TIMEOUT_S,
        check=False,
    )


def pytest_in(tree: Path, args: list[str]) -> Detection:
    started = time.perf_counter()
    done = run_in(tree, [*PYTEST, *args])
    failures = [line for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    first = re.sub(r"\s+-\s.*$", "", failures[0]).split(" ", 1)[1] if failures else ""
    if done.returncode not in (0, 1) and not first:
        first = f"pytest exit {done.returncode}: {(done.stdout + done.stderr).strip().splitlines()[-1:]}"
    return Detection(done.returncode == 0, first, time.perf_counter() - started)


def unit_paths(tree: Path) -> list[str]:
    files = sorted(str(p.relative_to(tree)) for p in (tree / "tests").rglob("test_*.py"))
    files = [f for f in files if f not in UNIT_EXCLUDED]

    def rank(name: str) -> tuple[int, str]:
        for i, prefix in enumerate(UNIT_ORDER):
            if name.startswith(prefix):
                return i, name
        last = next((i for i, prefix in enumerate(UNIT_LAST) if name.startswith(prefix)), None)
        return (len(UNIT_ORDER) + 1 + last if last is not None else len(UNIT_ORDER)), name

    return sorted(files, key=rank)


#: run in a planted tree: re-runs the golden scenarios, compares them with the committed folders,
#: and prints how far the largest simulated metric moved (relative; wall-clock and provenance aside)
SHIFT_CODE = """
import json, math, sys, tempfile
from pathlib import Path
import pandas as pd
sys.path.insert(0, "tests/golden")
import regenerate
from kvbench.commands.compare import run
largest, moved = 0.0, 0
with tempfile.TemporaryDirectory() as tmp:
    for name in sorted(regenerate.scenarios()):
        fresh, out = Path(tmp) / name, Path(tmp) / (name + "-compare")
        assert regenerate.run_scenario(name, fresh).returncode == 0, name
        run([str(regenerate.GOLDEN_DIR / name), str(fresh), "--tol", "*wall_s=ignore", "--out", str(out)])
        rows = pd.read_parquet(out / "compare.parquet")
        rows = rows[rows["verdict"].isin(["within", "beyond"])]
        moved += len(rows)
        largest = max([largest, *(abs(float(r)) for r in rows["change_rel"] if not math.isnan(float(r)))])
print(json.dumps({"largest_rel": largest, "metrics_moved": moved}))
"""


def golden_shift(tree: Path) -> dict[str, float]:
    """How far a planted bug moves the golden scenarios: the largest relative change of any simulated
    metric (inf: a metric that was 0), and how many (job, metric) values moved at all."""
    done = run_in(tree, [sys.executable, "-c", SHIFT_CODE])
    if done.returncode != 0:
        return {"largest_rel": math.nan, "metrics_moved": -1}
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class SemanticResult:
    name: str
    what: str
    golden: Detection
    paper: Detection
    unit: Detection
    #: how far the golden scenarios' metrics moved (``golden_shift``)
    shift: dict[str, float] = field(default_factory=dict)

    @property
    def caught_by(self) -> list[str]:
        return [
            gate for gate, d in (("golden", self.golden), ("paper", self.paper), ("unit", self.unit)) if not d.passed
        ]


def detect(mutant: Mutant | None, workdir: Path) -> SemanticResult:
    tree = plant(mutant, workdir / (mutant.name if mutant else "control"))
    golden = pytest_in(tree, ["tests/test_golden.py"])
    paper = pytest_in(tree, ["tests/test_paper.py"])
    unit = pytest_in(tree, [*unit_paths(tree), *(f"--deselect={d}" for d in UNIT_DESELECTED)])
    name, what = (mutant.name, mutant.what) if mutant else ("control", "nothing planted (must pass everything)")
    result = SemanticResult(name, what, golden, paper, unit, golden_shift(tree))
    print(
        f"- {name}: caught by {', '.join(result.caught_by) or 'NOTHING'}; golden metrics moved {result.shift}"
        f"{'; first unit failure ' + unit.first_failure if unit.first_failure else ''}",
        flush=True,
    )
    return result


@dataclass
class SpeedResult:
    name: str
    factor: float
    ratios: list[dict[str, float]] = field(default_factory=list)  #: per gate run: config -> head/base
    failed_runs: int = 0
    in_suite: Detection | None = None
    busy: bool = False  #: another CPU-bound process ran meanwhile


def speed_runs(name: str, factor: float, base: Path, head: Path, runs: int, busy: bool) -> SpeedResult:
    result = SpeedResult(name, factor, busy=busy)
    for number in range(runs):
        try:
            verdicts = compare_trees(base, head)
        except NotComparable as exc:
            raise SystemExit(f"planted_regressions: {name}: {exc}") from None
        result.ratios.append({v.config: round(v.ratio, 4) for v in verdicts})
        result.failed_runs += not all(v.passed for v in verdicts)
        print(f"  {name} run {number + 1}/{runs}: {result.ratios[-1]}", flush=True)
    return result


def busy_process() -> subprocess.Popen:
    """Another CPU-bound process for the whole campaign: one core spinning, as on a shared machine."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _caught(detection: dict) -> bool:
    return not detection["passed"]


def shift_text(shift: dict) -> str:
    largest = shift.get("largest_rel")
    if largest is None or math.isnan(largest):
        return ""
    if not shift["metrics_moved"]:
        return " (nothing moved)"
    return " (from 0)" if math.isinf(largest) else f" ({largest:.2g})"


def markdown(results: dict) -> str:
    """The tables of docs/ci.md, from the JSON results (``semantic`` and ``speed`` rows by name)."""

    def cell(d: dict) -> str:
        return "**caught**" if _caught(d) else "pass"

    lines = [
        "# Planted regressions",
        "",
        f"`python benchmarks/planted_regressions.py` on {results.get('cores')} cores (rows merged across runs by name).",
        "",
        "| mutant | the bug | golden gate (largest change) | paper check | unit suite (first failing test) |",
        "|---|---|---|---|---|",
    ]
    semantic = list(results["semantic"].values())
    for r in semantic:
        unit = cell(r["unit"]) + (f" `{r['unit']['first_failure']}`" if r["unit"]["first_failure"] else "")
        lines.append(
            f"| `{r['name']}` | {r['what']} | {cell(r['golden'])}{shift_text(r.get('shift', {}))} | "
            f"{cell(r['paper'])} | {unit} |"
        )
    mutants = [r for r in semantic if r["name"] != "control"]
    gates = {gate: sum(_caught(r[gate]) for r in mutants) for gate in ("golden", "paper", "unit")}
    caught = sum(any(_caught(r[gate]) for gate in gates) for r in mutants)
    lines += [
        "",
        f"Caught: {caught} of {len(mutants)} mutants (golden gate {gates['golden']}, paper check "
        f"{gates['paper']}, unit suite {gates['unit']}).",
        "",
    ]
    shifted = [
        (r["shift"]["largest_rel"], r["name"])
        for r in mutants
        if r.get("shift", {}).get("metrics_moved", 0) > 0 and not math.isnan(r["shift"]["largest_rel"])
    ]
    if shifted:
        least, name = min(shifted)
        lines += [
            f"Largest change of a golden metric: at least {least:.2g} relative for every mutant that moved the "
            f"golden scenarios (the least, `{name}`), against the golden gate's float tolerance of 1e-9.",
            "",
        ]
    if results["speed"]:
        # every config any row timed, the gate's own first (rows measured before a config joined show "—")
        timed = {c for sp in results["speed"].values() for r in sp["ratios"] for c in r}
        configs = [c for c in CONFIGS if c in timed] + sorted(timed - set(CONFIGS))
        lines += [
            f"Paired speed gate (`benchmarks/speed_gate.py`: head/base, the median over its pairs, must be <= "
            f"{MAX_SLOWDOWN}):",
            "",
            "| planted | machine | gate runs | failed | "
            + "".join(f"head/base, {c} | " for c in configs)
            + "in-suite gates (`pytest benchmarks`) |",
            "|---|---|---:|---:|" + "---|" * len(configs) + "---|",
        ]
        for sp in results["speed"].values():
            spans = {
                c: f"{min(r[c] for r in sp['ratios'] if c in r):.3f}-{max(r[c] for r in sp['ratios'] if c in r):.3f}"
                for c in configs
                if any(c in r for r in sp["ratios"])
            }
            suite = sp["in_suite"]
            suite = "—" if suite is None else ("pass" if suite["passed"] else f"**caught** `{suite['first_failure']}`")
            machine = "busy (another CPU-bound process)" if sp["busy"] else "idle"
            lines.append(
                f"| {sp['name']} | {machine} | {len(sp['ratios'])} | {sp['failed_runs']} | "
                + "".join(f"{spans.get(c, '—')} | " for c in configs)
                + f"{suite} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    names = [m.name for m in SEMANTIC] + ["control"] + [slowdown(f).name for f in SLOWDOWNS] + ["speed_control"]
    parser = argparse.ArgumentParser(
        prog="python benchmarks/planted_regressions.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--only", action="append", choices=names, help="one mutant or control (repeatable)")
    parser.add_argument("--speed-runs", type=int, default=5, help="paired-gate runs per planted slowdown (default 5)")
    parser.add_argument(
        "--control-runs", type=int, default=10, help="paired-gate runs of the unchanged build (default 10)"
    )
    parser.add_argument("--busy", action="store_true", help="keep another CPU-bound process running throughout")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for planted_regressions.{json,md}")
    args = parser.parse_args(argv)
    chosen = set(args.only or names)
    check_report("planted_regressions", args.out, ["planted_regressions.json", "planted_regressions.md"])
    hog = busy_process() if args.busy else None
    try:
        with tempfile.TemporaryDirectory(prefix="kvbench-planted-") as tmp:
            work = Path(tmp)
            semantic = [detect(m, work) for m in SEMANTIC if m.name in chosen]
            if "control" in chosen:
                semantic.append(detect(None, work))
            speed = []
            base = plant(None, work / "speed-base")
            if "speed_control" in chosen:
                speed.append(
                    speed_runs("unchanged", 1.0, base, plant(None, work / "speed-same"), args.control_runs, args.busy)
                )
            for factor in SLOWDOWNS:
                mutant = slowdown(factor)
                if mutant.name in chosen:
                    head = plant(mutant, work / mutant.name)
                    result = speed_runs(mutant.name, factor, base, head, args.speed_runs, args.busy)
                    result.in_suite = pytest_in(
                        head, ["benchmarks/test_speed_gate.py", "--benchmark-enable", "-k", "not paired"]
                    )
                    speed.append(result)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    path = args.out / "planted_regressions.json"
    results = json.loads(path.read_text()) if path.is_file() else {"semantic": {}, "speed": {}}
    results["semantic"].update({r.name: asdict(r) for r in semantic})
    results["speed"].update({sp.name: asdict(sp) for sp in speed})
    results["cores"] = os.cpu_count()
    text = markdown(results)
    write_report(
        "planted_regressions",
        args.out,
        {"planted_regressions.json": json.dumps(results, indent=1) + "\n", "planted_regressions.md": text},
    )
    print(text)
    missed = [r.name for r in semantic if r.name != "control" and not r.caught_by]
    false_alarms = [r.name for r in semantic if r.name == "control" and r.caught_by]
    speed_missed = [sp.name for sp in speed if sp.factor > 1 and sp.failed_runs < len(sp.ratios)]
    speed_alarms = [sp.name for sp in speed if sp.factor == 1 and sp.failed_runs]
    return 1 if missed or false_alarms or speed_missed or speed_alarms else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
