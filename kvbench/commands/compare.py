"""``kvbench compare BASE HEAD``: the same jobs run twice, metric by metric, against tolerances.

    kvbench compare results/multirun/base results/multirun/head
    kvbench compare base head --tol 'ttft_*=rel:0.05' --tolerances my_tolerances.yaml --all
    kvbench compare base head --out results/compare     # also write compare.{parquet,csv,png}

It prints and writes nothing unless ``--out DIR`` asks for the files.

Exit status: 0 every metric within tolerance; 1 some metric beyond it; 2 unusable input (a
missing or non-result folder, an incomplete, damaged or failed job, jobs that do not match, a bad
tolerance, an unreadable file), each said in one line; 3 kvbench itself failed (a bug: the line
says so and the traceback follows). A CI gate can act on each: only 1 means "a metric moved".
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from rich.text import Text

from kvbench.commands.arguments import OneLineParser
from kvbench.compare.configs import IGNORED_KEYS
from kvbench.compare.diff import FAILING, compare_jobs, unused_patterns
from kvbench.compare.load import load_side
from kvbench.compare.match import explain_unmatched, match_jobs, nearest_differing_keys
from kvbench.compare.report import console, print_report, verdict_line
from kvbench.compare.save import FILES, save
from kvbench.compare.tolerance import SPEC_HELP, default_rules, load_rules, parse_option
from kvbench.errors import ConfigError, error_line

PROG = "kvbench compare"
OK, BEYOND, UNUSABLE, INTERNAL = 0, 1, 2, 3


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog=PROG,
        description="Compare two kvbench result folders (a run or a sweep each), job by job and metric by "
        "metric. Jobs are matched by their resolved config (config.json) less progress, output "
        "and wandb. It prints a table and writes nothing unless --out DIR. Exit status: 0 within tolerance, 1 some "
        "metric beyond it, 2 unusable input.",
        epilog=f"Tolerance {SPEC_HELP}. Rules are fnmatch globs over summary columns; the last match wins: "
        "the shipped kvbench/compare/tolerances.yaml, then --tolerances, then each --tol.",
    )
    parser.add_argument("base", type=Path, help="the reference: a run folder or a sweep folder")
    parser.add_argument("head", type=Path, help="the candidate: a run folder or a sweep folder")
    parser.add_argument(
        "--tolerances",
        type=Path,
        metavar="FILE",
        help="YAML file of rules, tolerances: {<glob>: <spec>}, read after the defaults",
    )
    parser.add_argument(
        "--tol",
        action="append",
        default=[],
        metavar="PATTERN=SPEC",
        help="one more rule, read last (repeatable), e.g. --tol 'ttft_*=rel:0.05'",
    )
    parser.add_argument("--all", action="store_true", help="list every metric, not only those that differ")
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="also write compare.parquet, compare.csv and compare.png into DIR (created if missing; "
        "default: print only, write nothing)",
    )
    parser.add_argument(
        "--ignore-config",
        action="append",
        default=[],
        metavar="KEY",
        help="also ignore this config key (and what is under it) when matching jobs (repeatable)",
    )
    return parser


def run(argv: list[str]) -> int:
    from kvbench.app.folders import check_writable
    from kvbench.io.atomic import COMPLETE, check_targets

    args = build_parser().parse_args(argv)
    user_rules = ([] if args.tolerances is None else load_rules(args.tolerances)) + [parse_option(t) for t in args.tol]
    rules = default_rules() + user_rules
    ignored = IGNORED_KEYS + tuple(key.strip() for key in args.ignore_config)
    if any(not key for key in ignored):
        raise ConfigError("--ignore-config needs a config key, e.g. --ignore-config calibration_dir")
    out_dir = args.out
    if out_dir is not None:
        for side, folder in (("BASE", args.base), ("HEAD", args.head)):
            # its COMPLETE marker would make a sweep folder read as one broken run
            if out_dir.resolve() == folder.resolve() or folder.resolve() in out_dir.resolve().parents:
                raise ConfigError(f"--out {out_dir} is inside {side} ({folder}); write the comparison elsewhere")
        check_writable(out_dir, "--out")  # before any reading: an unwritable folder is one line up front
        check_targets(out_dir, (*FILES, COMPLETE), "remove it or choose another --out DIR")
    base, head = load_side(args.base, "base"), load_side(args.head, "head")
    matching = match_jobs(base, head, ignored)
    if not matching.pairs:
        raise ConfigError(_none_matched(matching, ignored))
    if matching.base_only or matching.head_only:
        raise ConfigError(f"{explain_unmatched(matching, ignored)}; run the same sweep on both sides")

    frame = compare_jobs(matching.pairs, rules)
    out = console()
    for rule in unused_patterns(frame, user_rules):
        out.print(
            Text(f"kvbench compare: warning: {rule.source} pattern {rule.pattern!r} matches no metric", style="yellow")
        )
    print_report(frame, len(matching.pairs), args.all, out)
    if out_dir is not None:
        save(frame, out_dir)
        out.print(f"comparison: {out_dir} (compare.parquet, compare.csv, compare.png)", highlight=False, soft_wrap=True)
    out.print(verdict_line(frame, len(matching.pairs), out.width), highlight=False, soft_wrap=True)
    return BEYOND if frame["verdict"].isin(FAILING).any() else OK


#: keys spelled out in the suggested --ignore-config flags; past it, a count
MAX_SUGGESTED_KEYS = 3


def _none_matched(matching, ignored: tuple[str, ...]) -> str:
    """One line: jobs pair only where their configs agree; the keys that kept them apart, the first
    unmatched job's differences, and the --ignore-config flags that would pair them anyway (for
    keys that cannot change a number: a path, a tag)."""
    keys = nearest_differing_keys(matching, ignored)
    shown = ", ".join(keys[:MAX_SUGGESTED_KEYS]) + (
        f" and {len(keys) - MAX_SUGGESTED_KEYS} more" if len(keys) > MAX_SUGGESTED_KEYS else ""
    )
    why = f" (jobs are paired by config, and the configs differ in {shown})" if keys else ""
    flags = " ".join(f"--ignore-config {key}" for key in keys[:MAX_SUGGESTED_KEYS])
    fix = f", or add {flags} if {'that key' if len(keys) == 1 else 'those keys'} cannot change a number" if keys else ""
    return (
        f"no job matched{why}: {explain_unmatched(matching, ignored, named=1)}; compare runs of the same command{fix}"
    )


def main(argv: list[str] | None = None) -> None:
    """Console entry (``kvbench compare ...``): exits with the comparison's status."""
    from kvbench.commands.signals import exit_interrupted, handle_sigterm

    handle_sigterm()
    try:
        status = run(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(error_line(PROG, exc), file=sys.stderr)
        sys.exit(UNUSABLE)
    except OSError as exc:  # the --out folder vanished or the disk filled: nothing is marked complete
        print(
            error_line(
                PROG,
                f"could not write {exc.filename or 'the comparison'}: {exc.strerror or exc}; "
                "free space or choose another --out DIR",
            ),
            file=sys.stderr,
        )
        sys.exit(UNUSABLE)
    except KeyboardInterrupt as exc:
        exit_interrupted(exc, PROG, "no comparison written is marked complete")
    except Exception as exc:
        # not "a metric moved" (1) nor bad input (2): a CI gate must be able to tell a kvbench bug apart
        print(
            f"{PROG}: internal error (a bug in kvbench, please report it): {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}",
            file=sys.stderr,
        )
        traceback.print_exc()
        sys.exit(INTERNAL)
    sys.exit(status)
