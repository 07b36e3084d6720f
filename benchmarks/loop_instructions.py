"""The simulator's loop in two versions of kvbench, counted in machine instructions: a comparison
that a busy machine cannot blur.

    python benchmarks/loop_instructions.py                       # the change under test against what came before
    python benchmarks/loop_instructions.py --base 031b30f --head HEAD --config arrivals --config events
    python benchmarks/loop_instructions.py --base 570ef83 --head HEAD --config chat --streamed

On the 2-core machines kvbench is developed on, one run of the same loop takes 20 % more or less
wall time from one minute to the next; the speed gate (``speed_gate.py``) cancels that with the
median of 20 paired runs and still moves by about 4 % between two gates. Valgrind's instruction
count does not move at all: the same code on the same work executes the same instructions. It is
no wall time (a cache miss costs more than an add), but a change that removes work shows as
fewer instructions, to the instruction, and the same change counted twice gives the same number.

Each side (``--base``, ``--head``: commits, or by default those ``speed_gate.py`` picks) runs each
of the speed gate's configs or ``preempt`` (``--config``, default ``arrivals``) twice under
``valgrind --tool=cachegrind --cache-sim=no``, each a process of its own: once up to the loop
(imports, Hydra's compose, the plugins, the requests), once with the loop (``Engine.run``, and the
tables it builds at the end). The loop's count is the difference. Both trees are compiled first, so
that no module's compilation is counted. Both sides must simulate the same
steps and tokens, or the comparison is refused. A run of the ``arrivals`` config takes about a
minute under valgrind, most of it the imports: four runs per config.

With ``--streamed`` the loop writes its step table as the ``kvbench`` command does: each batch of
rows to the step files (``StepFiles``) and the summary's running sums (``StepTotals``), and a third
run per side also commits the files after the loop (closes and renames them; a version that writes
``steps.csv`` from the Parquet file does so there). The report then gives the loop's count and the
loop's with the commit: where writing the CSV moved out of the loop, the first falls and the second
says what the whole run pays for the move. Six runs per config.

Exit status: 0 counted, 2 cannot compare (no valgrind, no git, an unknown commit, different work).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from main_exits import one_line_failures, valgrind_missing
from source_trees import TreeError, child_env, export_pair, import_path
from speed_gate import BASE, add_revision_arguments, default_revisions, head_without_base
from speed_gate import CONFIGS as GATE_CONFIGS
from vllm_v0 import vllm_v0_scheduling

#: the speed gate's configs, and one of this script's own: a batch that preempts. 300 lecture
#: requests of 512 + 2,048 tokens at t = 0 through vLLM v0 (paged, recompute): 128 of them at full
#: length would need 2.8x the KV budget, so the batch preempts (292 preemptions, 9,237 steps in 941
#: step rows, about 60 sequences decoding per row), the regime where passes over the batch are most
#: of a turn (its loop is too long for the gate's paired 50 ms runs)
#: vLLM v0's scheduling as scale.py runs it: paged 16-token blocks, prefill first, recompute
VLLM_V0 = vllm_v0_scheduling()
CONFIGS = {
    **GATE_CONFIGS,
    # chat: scale.py's chat-like traffic (kvbench's workload=lognormal, medians 512/128 tokens) at
    # Poisson 12/s through vLLM v0, 2,000 requests: about 4 steps per step row, the regime in which
    # writing the step table is the largest share of the loop
    "chat": [
        *BASE,
        "workload=lognormal",
        "workload.num_requests=2000",
        "workload.arrival=poisson",
        "workload.rate_per_s=12",
        *VLLM_V0,
    ],
    "preempt": [
        *BASE,
        "workload=lecture_chat",
        "workload.num_requests=300",
        "workload.prompt_tokens=512",
        "workload.output_tokens=2048",
        *VLLM_V0,
    ],
}

#: a child's start: a config composed from the JSON overrides in its last argument, set up, its
#: requests made and its engine built (the loop not run)
PRELUDE = """
import json, sys
import numpy as np
from kvbench.api import compose
from kvbench.app.run import setup
from kvbench.core.request import requests_from_workload
from kvbench.engine import Engine
from kvbench.exec.sim import SimExecutor
cfg, _ = compose(json.loads(sys.argv[-1]))
s = setup(cfg)
requests = requests_from_workload(s.workload_source.generate(np.random.default_rng(int(cfg.seed))), int(cfg.seed))
engine = Engine(s.scheduler, SimExecutor(s.cost), event_driven=bool(cfg.event_driven))
"""
#: one run of a config, up to (``setup``) or through (``loop``) the loop; prints its work as JSON
CHILD = (
    PRELUDE
    + """
if sys.argv[1] == "loop":
    record = engine.run(requests)
    print(json.dumps([int(record.steps["num_steps"].sum()), len(record.steps), len(record.requests)]))
else:
    print(json.dumps(None))
"""
)
#: the same with the step table streamed to its files as the command writes it (``--streamed``): up
#: to the loop (``setup``), through it (``loop``), or through it and the files' commit (``commit``)
STREAMED_CHILD = (
    PRELUDE
    + """
import shutil, tempfile
from pathlib import Path
from kvbench.metrics.step_totals import StepTotals
from kvbench.output.step_files import StepFiles
folder = Path(tempfile.mkdtemp())
files, totals, work = StepFiles(folder), StepTotals(s.budget_bytes, s.model.kv_bytes_per_token), [0, 0]
def sink(batch):
    files(batch)
    totals.add(batch)
    work[0] += int(batch["num_steps"].sum())
    work[1] += len(batch["num_steps"])
engine.step_sink = sink
if sys.argv[1] == "setup":
    print(json.dumps(None))
else:
    record = engine.run(requests)
    if sys.argv[1] == "commit":
        files.commit()
    print(json.dumps([*work, len(record.request_columns)]))
shutil.rmtree(folder)
"""
)
#: what makes two runs of the same code count the same instructions (to about a thousand in 3.4
#: billion): one thread for OpenBLAS, OpenMP and Arrow, whose idle workers spin a varying while
#: (valgrind runs one thread at a time), the C library's allocator for Arrow (mimalloc's background
#: work), and a fixed hash seed (string hashes and set order vary per process)
COUNTED_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "ARROW_DEFAULT_MEMORY_POOL": "system",
    "PYTHONHASHSEED": "0",
}
#: cachegrind's total, as it prints it on stderr ("==123== I refs:      6,374,700,436")
I_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


class NotComparable(RuntimeError):
    """The two sides cannot be counted against each other: one line saying why."""


def count(tree: Path, mode: str, overrides: list[str], child: str = CHILD) -> tuple[int, list | None]:
    """(instructions, the run's work) of one run of ``tree``'s kvbench under valgrind."""
    return count_with(child_env(tree, COUNTED_ENV), tree, mode, overrides, f"kvbench in {tree}", child)


def count_with(
    env: dict[str, str], cwd: Path, mode: str, overrides: list[str], what: str, child: str = CHILD
) -> tuple[int, list | None]:
    """(instructions, the run's work) of one ``child`` run (:data:`CHILD`, :data:`STREAMED_CHILD`)
    under valgrind, with ``env`` (which says whose kvbench it imports); ``what`` names that kvbench
    in an error."""
    argv = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        "-c",
        child,
        mode,
        json.dumps(overrides),
    ]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    match = I_REFS.search(done.stderr)
    if done.returncode != 0 or match is None:
        lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("==")]
        raise NotComparable(f"{what} failed under valgrind: {lines[-1] if lines else done.returncode}")
    output = done.stdout.strip().splitlines()
    if not output:
        raise NotComparable(f"{what} printed nothing under valgrind")
    return int(match.group(1).replace(",", "")), json.loads(output[-1])


def loop_instructions(tree: Path, overrides: list[str]) -> tuple[int, list]:
    """(instructions of the loop alone, its work: steps, step rows, requests)."""
    through, work = count(tree, "loop", overrides)
    before, _ = count(tree, "setup", overrides)
    return through - before, work


def streamed_instructions(tree: Path, overrides: list[str]) -> tuple[int, int, list]:
    """(instructions of the loop streaming its step table to files, of committing the files after
    it, the work: steps, step rows, requests)."""
    committed, work = count(tree, "commit", overrides, STREAMED_CHILD)
    through, _ = count(tree, "loop", overrides, STREAMED_CHILD)
    before, _ = count(tree, "setup", overrides, STREAMED_CHILD)
    return through - before, committed - through, work


def compile_tree(tree: Path) -> None:
    """Compile the tree's modules where its child processes import them from: a module compiled
    on its first import would count in whichever run imports it first (the loop's, for one
    imported late), and the children write no bytecode."""
    done = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(import_path(tree))], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()
        raise NotComparable(f"the kvbench in {tree} does not compile: {lines[-1] if lines else done.returncode}")


def compare(base: Path, head: Path, configs: list[str], progress=None, streamed: bool = False) -> list[dict]:
    for tree in (base, head):
        compile_tree(tree)
    rows = []
    for name in configs:
        if streamed:
            base_n, base_commit, base_work = streamed_instructions(base, CONFIGS[name])
            head_n, head_commit, head_work = streamed_instructions(head, CONFIGS[name])
        else:
            base_n, base_work = loop_instructions(base, CONFIGS[name])
            head_n, head_work = loop_instructions(head, CONFIGS[name])
        if base_work != head_work:
            raise NotComparable(
                f"{name}: the two versions simulate different work (steps, step rows, requests: base "
                f"{base_work}, head {head_work}); count them again once the change is the base"
            )
        row = {"config": name, "base": base_n, "head": head_n, "steps": base_work[0], "rows": base_work[1]}
        if streamed:
            row.update(base_commit=base_commit, head_commit=head_commit)
        rows.append(row)
        if progress is not None:
            progress(f"{name}: head/base {head_n / base_n:.4f}")
    return rows


def report(rows: list[dict], base_name: str, head_name: str) -> str:
    if rows and "base_commit" in rows[0]:
        return _streamed_report(rows, base_name, head_name)
    lines = [
        f"loop instructions (valgrind): head {head_name} against base {base_name}",
        "",
        "| config | steps | step rows | base instructions | head instructions | head / base |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['config']} | {r['steps']:,} | {r['rows']:,} | {r['base']:,} | {r['head']:,} | {r['head'] / r['base']:.4f} |"
        for r in rows
    ]
    return "\n".join(lines)


def _streamed_report(rows: list[dict], base_name: str, head_name: str) -> str:
    lines = [
        f"loop instructions (valgrind), the step table streamed to its files: head {head_name} against base {base_name}",
        "",
        "| config | steps | step rows | loop base | loop head | head / base | loop + commit base "
        "| loop + commit head | head / base |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        base_all, head_all = r["base"] + r["base_commit"], r["head"] + r["head_commit"]
        lines.append(
            f"| {r['config']} | {r['steps']:,} | {r['rows']:,} | {r['base']:,} | {r['head']:,} "
            f"| {r['head'] / r['base']:.4f} | {base_all:,} | {head_all:,} | {head_all / base_all:.4f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/loop_instructions.py", description=__doc__.split("\n\n")[0]
    )
    add_revision_arguments(parser)
    parser.add_argument(
        "--config",
        action="append",
        choices=sorted(CONFIGS),
        help="a config to count: the speed gate's, chat or preempt (repeatable; default: arrivals)",
    )
    parser.add_argument(
        "--streamed",
        action="store_true",
        help="stream the step table to its files as the kvbench command does, and count their commit too",
    )
    args = parser.parse_args(argv)
    if head_without_base("loop instructions", args) or valgrind_missing("loop instructions"):
        return 2
    base_rev, head_rev = (args.base, args.head) if args.base else default_revisions()
    with (
        one_line_failures("loop instructions", TreeError, NotComparable) as ending,
        tempfile.TemporaryDirectory(prefix="kvbench-instructions-") as tmp,
    ):
        base_tree, base_name, head_tree, head_name = export_pair(base_rev, head_rev, Path(tmp))
        rows = compare(
            base_tree,
            head_tree,
            args.config or ["arrivals"],
            progress=lambda m: print(f"  {m}", file=sys.stderr),
            streamed=args.streamed,
        )
    if ending.exit_status is not None:
        return ending.exit_status
    print(report(rows, base_name, head_name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
