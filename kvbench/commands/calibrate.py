"""``kvbench calibrate``: fit the simulator's efficiency terms to real runs' measured steps
(:mod:`kvbench.calibrate`) and write the calibration files. Runs measured on a CPU are refused in
one line (a fit would file a CPU's timings under the hardware config's GPU).

    kvbench calibrate results/<real run> [more run folders or sweep folders] [--out <folder>]
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from kvbench.calibrate import DEFAULT_OUT, fit, load_run, run_folders, write_fit
from kvbench.errors import ConfigError, error_line


def _parse(args_in: list[str]):
    from kvbench.commands.arguments import OneLineParser

    parser = OneLineParser(
        prog="kvbench calibrate",
        description="Fit the simulator's efficiency terms to real runs' step times measured on the GPU "
        "their hardware config describes (runs measured on a CPU are refused).",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="real run folders (or sweep folders of them)")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"calibration folder: writes <out>/<hardware>/<kernel>.json (default {DEFAULT_OUT}); "
        "use it with calibration_dir=<out>",
    )
    return parser.parse_args(args_in)


def main(argv: list[str] | None = None) -> None:
    from kvbench.commands.signals import exit_interrupted, handle_sigterm

    handle_sigterm()
    args_in = sys.argv[1:] if argv is None else argv
    try:
        args = _parse(args_in)
        from kvbench.app.progress import progress_bar

        folders = [f for folder in args.runs for f in run_folders(folder)]
        runs = []
        with progress_bar(len(folders), "reading runs", enabled=True, unit="runs") as advance:
            for folder in folders:
                runs.append(load_run(folder))
                advance(1)
        result = fit(runs)
        from kvbench.app.folders import check_writable

        check_writable(args.out, "--out")
        written = write_fit(result, args.out, shlex.join(["kvbench", "calibrate", *args_in]))
    except ConfigError as exc:
        print(error_line("kvbench calibrate", str(exc).removeprefix("kvbench calibrate: ")), file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as exc:
        print(
            error_line(
                "kvbench calibrate", f"could not write {exc.filename or 'the calibration'}: {exc.strerror or exc}"
            ),
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    except KeyboardInterrupt as exc:
        exit_interrupted(exc, "kvbench calibrate", "no calibration file was half-written")
    print(f"measured on {'; '.join(result.measured_on) or 'an unrecorded machine'}")
    for (kernel, layout), e in sorted(result.decode_efficiency.items()):
        print(f"{result.hardware} {kernel} [{layout}]: decode efficiency {e:.4f}")
    if result.prefill_flops_efficiency is not None:
        print(f"prefill FLOP efficiency {result.prefill_flops_efficiency:.4f}")
    print(
        f"step overhead {result.step_overhead_s * 1e6:.2f} us; fit over {result.num_rows} rows, "
        f"relative error p50 {result.relative_error_p50:.2%} p90 {result.relative_error_p90:.2%}"
    )
    for path in written:
        print(f"wrote {path}")
    print(f"use it: kvbench ... calibration_dir={args.out}")


if __name__ == "__main__":
    main()
