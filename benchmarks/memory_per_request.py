"""How much memory a kvbench run takes per simulated request, by workload kind: the numbers behind
the memory check (``kvbench/app/checks.py``) that refuses a run before it exhausts the machine.

    python benchmarks/memory_per_request.py            # every kind; about 10 minutes on 2 cores
    python benchmarks/memory_per_request.py --only trace_azure
    python benchmarks/memory_per_request.py --only trace_azure --sizes 200000 1000000

Each kind runs the real ``kvbench`` command in a fresh process at two sizes, N1 and N2 requests
(results, tables and figures written as by default; W&B disabled, since its offline run is a
separate process), and the growth of the peak resident set (``ru_maxrss``) between the two,
divided by N2 - N1, is the cost of one more request. Trace kinds replay a trace made by repeating
a packaged one (times shifted by its span, Mooncake's hash ids offset per copy so that every copy
is new content), so that the parse of the file is measured too.

Results: ``benchmarks/results/memory_per_request.{json,md}``; with ``--sizes N1 N2`` (the same two
sizes for every kind run) ``memory_per_request-N1-N2.{json,md}`` instead, so that a slope measured
far from the default sizes never replaces the table the memory check quotes. Exit status 0, 2 on
bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from main_exits import one_line_failures

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TRACES = ROOT / "kvbench" / "traces"
COMMON = ["wandb.mode=disabled", "progress=false"]

CHILD = """
import resource, sys
from kvbench.commands.main import main
sys.argv = ["kvbench", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    if exc.code:
        raise
print("maxrss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@dataclass(frozen=True)
class Kind:
    name: str
    what: str
    sizes: tuple[int, int]
    #: overrides for n requests in work folder w (a trace kind writes its file there first)
    overrides: object


def synthetic(preset: str, *extra: str):
    return lambda n, work: [f"workload={preset}", f"workload.num_requests={n}", *extra]


def azure_file(n: int, work: Path) -> Path:
    """An Azure 2023 conversation trace of ``n`` rows: the packaged one repeated, shifted in time."""
    import pandas as pd

    base = pd.read_csv(TRACES / "azure_llm_2023_conv.csv")
    stamps = pd.to_datetime(base["TIMESTAMP"])
    span = stamps.max() - stamps.min() + pd.Timedelta(seconds=1)
    copies = -(-n // len(base))
    frames = [base.assign(TIMESTAMP=(stamps + i * span).dt.strftime("%Y-%m-%d %H:%M:%S.%f")) for i in range(copies)]
    path = work / f"azure_{n}.csv"
    pd.concat(frames).head(n).to_csv(path, index=False)
    return path


def mooncake_file(n: int, work: Path) -> Path:
    """A Mooncake conversation trace of ``n`` lines: the packaged one repeated, shifted in time,
    each copy's hash ids offset so that no copy shares a prefix with another."""
    lines = [
        json.loads(line)
        for line in (TRACES / "mooncake_fast25_conversation_trace.jsonl").read_text().splitlines()
        if line
    ]
    span = lines[-1]["timestamp"] - lines[0]["timestamp"] + 1
    top = max(max(r["hash_ids"], default=0) for r in lines) + 1
    path = work / f"mooncake_{n}.jsonl"
    with path.open("w") as out:
        for i in range(n):
            copy, r = divmod(i, len(lines))
            row = dict(
                lines[r],
                timestamp=lines[r]["timestamp"] + copy * span,
                hash_ids=[h + copy * top for h in lines[r]["hash_ids"]],
            )
            out.write(json.dumps(row) + "\n")
    return path


KINDS = (
    Kind("synthetic", "workload=lecture_chat (all at once)", (20_000, 100_000), synthetic("lecture_chat")),
    Kind(
        "synthetic_poisson",
        "workload=sharegpt_like (Poisson arrivals, many steps)",
        (20_000, 100_000),
        synthetic("sharegpt_like"),
    ),
    Kind(
        "fan_out_4",
        "workload=lecture_chat workload.num_branches=4",
        (10_000, 50_000),
        synthetic("lecture_chat", "workload.num_branches=4"),
    ),
    Kind(
        "synthetic_prefix_cached",
        "workload=lecture_chat workload.shared_prefix_tokens=256 allocator.prefix_caching=true",
        (20_000, 100_000),
        synthetic("lecture_chat", "workload.shared_prefix_tokens=256", "allocator.prefix_caching=true"),
    ),
    Kind(
        "trace_azure",
        "workload=azure_conv replaying an Azure 2023 trace file",
        (20_000, 100_000),
        lambda n, work: ["workload=azure_conv", f"workload.path={azure_file(n, work)}"],
    ),
    Kind(
        "trace_mooncake_cached",
        "workload=mooncake_conversation allocator.prefix_caching=true (hash ids, prefix cache)",
        (6_000, 18_000),
        lambda n, work: [
            "workload=mooncake_conversation",
            f"workload.path={mooncake_file(n, work)}",
            "model=llama2-7b-32k",
            "allocator.prefix_caching=true",
        ],
    ),
)


def peak_rss_bytes(overrides: list[str], work: Path) -> int:
    out = work / "run"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *overrides, *COMMON, f"hydra.run.dir={out}", "check_memory=false"],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("maxrss_kb ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"memory_per_request: kvbench {' '.join(overrides)} failed:\n{done.stderr[-2000:]}")
    return int(lines[-1].split()[1]) * 1024


def measure(kind: Kind, sizes: tuple[int, int] | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="kvbench-memory-") as tmp:
        work = Path(tmp)
        n1, n2 = sizes or kind.sizes
        rss1 = peak_rss_bytes(kind.overrides(n1, work), work)
        rss2 = peak_rss_bytes(kind.overrides(n2, work), work)
    per = (rss2 - rss1) / (n2 - n1)
    row = {
        "kind": kind.name,
        "what": kind.what,
        "n1": n1,
        "n2": n2,
        "peak_rss_n1_bytes": rss1,
        "peak_rss_n2_bytes": rss2,
        "bytes_per_request": round(per),
    }
    print(
        f"{kind.name}: {per:,.0f} B per request ({rss1 / 1e6:,.0f} MB at {n1:,}, {rss2 / 1e6:,.0f} MB at {n2:,})",
        flush=True,
    )
    return row


def markdown(rows: list[dict]) -> str:
    # the commands that measured the rows (a run with --only adds to the rows an earlier one kept)
    commands = dict.fromkeys(r.get("command", "python benchmarks/memory_per_request.py") for r in rows)
    lines = [
        "# Memory per simulated request",
        "",
        f"{', '.join(f'`{c}`' for c in commands)} ({os.uname().machine}, Python {sys.version.split()[0]}): growth of "
        "the peak resident set of a whole `kvbench` run between N1 and N2 requests, over N2 - N1.",
        "",
        "| kind | workload | N1 | N2 | peak RSS at N1 | peak RSS at N2 | bytes per request |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['kind']}` | {r['what']} | {r['n1']:,} | {r['n2']:,} | {r['peak_rss_n1_bytes'] / 1e6:,.0f} MB | "
            f"{r['peak_rss_n2_bytes'] / 1e6:,.0f} MB | {r['bytes_per_request']:,} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/memory_per_request.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--only", action="append", choices=[k.name for k in KINDS], help="one kind (repeatable)")
    parser.add_argument(
        "--sizes", nargs=2, type=int, metavar=("N1", "N2"), help="the two run sizes for every kind (N1 < N2)"
    )
    args = parser.parse_args(argv)
    if args.sizes is not None and not 1 <= args.sizes[0] < args.sizes[1]:
        parser.error(f"--sizes needs 1 <= N1 < N2, got {args.sizes[0]} {args.sizes[1]}")
    stem = "memory_per_request" if args.sizes is None else "memory_per_request-{}-{}".format(*args.sizes)
    path = RESULTS / f"{stem}.json"
    rows = {r["kind"]: r for r in json.loads(path.read_text())} if path.is_file() else {}
    command = " ".join(["python benchmarks/memory_per_request.py", *argv])
    with one_line_failures("memory_per_request") as ending:  # no error to name: Ctrl-C only
        for kind in KINDS:
            if not args.only or kind.name in args.only:
                rows[kind.name] = {
                    **measure(kind, None if args.sizes is None else tuple(args.sizes)),
                    "command": command,
                }
    if ending.exit_status is not None:  # interrupted, nothing written: a table is replaced whole or not at all
        return ending.exit_status
    ordered = [rows[k.name] for k in KINDS if k.name in rows]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ordered, indent=1) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(ordered))
    print(markdown(ordered))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
