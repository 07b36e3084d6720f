"""``kvbench diff-engine``: kvbench's decisions against another engine's own scheduler, step by step
(:mod:`kvbench.validation.differential`).

    kvbench diff-engine --peer nano_vllm engine=nano_vllm allocator.block_size_tokens=256
    kvbench diff-engine --peer vllm_v1 engine=vllm_v1 workload=azure_conv workload.num_requests=2000

The overrides are any kvbench run's: the same requests and caps go to both sides. Exit status 0
when every step is identical, 1 when they diverge (the first divergent step is printed with both
sides' decisions), 2 for bad input or a peer that is not installed.

nano-vllm comes from its repository, not PyPI (kvbench.validation.peers.nano_vllm): the installed
``nanovllm`` package, or a checkout given with ``--nano-vllm-path``. Its Config takes block sizes
that are multiples of 256 tokens only; ``--any-block-size`` runs its scheduler at another anyway.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from rich.table import Table

from kvbench.app.run import check_engine_choice
from kvbench.commands.common import Parser, compose_checked, run_cli
from kvbench.errors import ConfigError, require
from kvbench.io.atomic import check_target, json_text, write_json
from kvbench.output.report import wide_console
from kvbench.validation.differential import DEFAULT_STEP_S, PEERS, describe, difference, run_differential

#: ``--json -``: the report to stdout (the usual convention), the table to stderr
STDOUT = "-"
#: the longest line of one side's decisions printed (the JSON report has them whole)
_SHOWN_CHARS = 400


def _main(argv: list[str]) -> int:
    parser = Parser(
        "kvbench diff-engine",
        "Run kvbench and another engine's own scheduler (vLLM V1, nano-vllm) over the same requests and caps, "
        "and compare what every step schedules, every preemption and every request's finish step.",
    )
    parser.add_argument(
        "--peer", default=None, help=f"the engine to compare with: {', '.join(PEERS)} (default: engine.name)"
    )
    parser.add_argument("--step-ms", type=float, default=DEFAULT_STEP_S * 1e3, help="every step's length on both sides")
    parser.add_argument(
        "--json",
        default=None,
        metavar="FILE",
        help="also write the comparison, both sides' steps included, here (-: to stdout, the table then to stderr)",
    )
    parser.add_argument(
        "--nano-vllm-path",
        default=None,
        metavar="DIR",
        help="nano_vllm: load its scheduler from this checkout of nano-vllm (default: the installed nanovllm package)",
    )
    parser.add_argument(
        "--any-block-size",
        action="store_true",
        help="nano_vllm: run its scheduler at a block size its Config refuses (not a multiple of 256 tokens)",
    )
    args, overrides = parser.parse(argv)
    require(
        math.isfinite(args.step_ms) and 1e-3 <= args.step_ms <= 1e6,
        "--step-ms",
        args.step_ms,
        "use a length in [0.001, 1e6] ms",
    )
    cfg, choices = compose_checked(overrides)
    check_engine_choice(cfg, choices)  # engine.name=vllm_v1 alone would set the peer, not its preset
    peer = args.peer or str(cfg.engine.name)
    if peer not in PEERS:
        raise ConfigError(f"--peer={peer!r}: choose one of {', '.join(PEERS)} (or engine=<one of them>)")
    peer_options = {}
    if args.nano_vllm_path is not None:
        peer_options["nano_vllm_path"] = args.nano_vllm_path
    if args.any_block_size:
        peer_options["allow_any_block_size"] = True
    if peer_options and peer != "nano_vllm":
        raise ConfigError(f"--nano-vllm-path and --any-block-size are nano_vllm's options, not --peer={peer}'s")
    to_stdout = args.json == STDOUT
    if args.json is not None and not to_stdout:  # said before the run, not after it
        out = Path(args.json)
        require(out.parent.is_dir(), "--json", args.json, "its folder does not exist")
        check_target(out, f"give the path of a file, or --json {STDOUT} for stdout")
    c = run_differential(cfg, peer, args.step_ms / 1e3, peer_options, progress=bool(cfg.progress))
    console = wide_console()
    if to_stdout:  # stdout holds the JSON alone, for a pipe to read
        console.file = sys.stderr
    table = Table(
        title=f"{c.num_requests} requests, every step {args.step_ms:g} ms on both sides", title_justify="left"
    )
    for column in ("side", "steps", "preemptions", "peak blocks", "finished"):
        table.add_column(column, justify="left" if column == "side" else "right")
    for side, numbers in c.per_side.items():
        table.add_row(side, *(f"{numbers[k]:,}" for k in ("steps", "preemptions", "peak_blocks", "finished")))
    console.print(table)
    console.print(
        f"identical steps: {c.num_identical_steps:,} of {max(len(c.kvbench.steps), len(c.peer.steps)):,}; "
        f"identical finish steps: {c.num_identical_finish_steps:,} of {c.num_requests:,}"
    )
    if c.identical:
        console.print(f"kvbench and {c.peer.engine} made the same decisions at every step")
    else:
        d = c.first_divergence
        console.print(f"first divergent step: {d.step}")
        console.print(f"  kvbench: {describe(d.kvbench)[:_SHOWN_CHARS]}")
        console.print(f"  {c.peer.engine}: {describe(d.peer)[:_SHOWN_CHARS]}")
        console.print("  differing: " + difference(d).replace("\n", "\n             ")[: 4 * _SHOWN_CHARS])
    if args.json is not None:
        report = {
            "peer": c.peer.engine,
            "identical": c.identical,
            "first_divergent_step": None if c.identical else c.first_divergence.step,
            "identical_steps": c.num_identical_steps,
            "identical_finish_steps": c.num_identical_finish_steps,
            "requests": c.num_requests,
            "per_side": c.per_side,
            "steps": {
                side.engine: [
                    {
                        "scheduled": {str(k): v for k, v in st.scheduled.items()},
                        "preempted": st.preempted,
                        "finished": st.finished,
                    }
                    for st in side.steps
                ]
                for side in (c.kvbench, c.peer)
            },
        }
        if to_stdout:
            sys.stdout.write(json_text(report))
        else:
            write_json(Path(args.json), report)  # written whole: a reader never sees half a file
            console.print(f"wrote {args.json}")
    return 0 if c.identical else 1


def main() -> None:
    run_cli(_main, "kvbench diff-engine")


if __name__ == "__main__":
    main()
