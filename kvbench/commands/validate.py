"""``kvbench validate``: replay public end-to-end measurements of real engines and report how far
kvbench's clocks are from them (:mod:`kvbench.validation`).

    kvbench validate
    kvbench validate --model Qwen/Qwen3-32B --backend trtllm --workers 2 --out results/validate/qwen

It needs no extra: without the ``profiles`` extra it replays the excerpt of the measurements
kvbench ships (the rows of its dense models), priced by its excerpt of the tables. The extra adds
aiconfigurator's own estimate beside kvbench's clocks (``--no-aic`` leaves it out).
"""

from __future__ import annotations

import importlib.util
import math
import shlex
from datetime import datetime
from pathlib import Path

from rich import box
from rich.table import Table

from kvbench.app.folders import check_writable
from kvbench.app.progress import progress_bar
from kvbench.commands.common import Parser, run_cli
from kvbench.errors import ConfigError, require, visible
from kvbench.io.atomic import COMPLETE
from kvbench.io.textio import read_json_object
from kvbench.output.report import wide_console
from kvbench.slo.common import check_folder_files, folder_files, write_folder
from kvbench.validation import client as client_shape
from kvbench.validation.overhead import HELD_OUT, IN_SAMPLE, source_line
from kvbench.validation.silicon import FITTED, REASONS, SCHEDULERS
from kvbench.validation.validate import (
    GOALS,
    GROUP_TPOT_LIMIT,
    MAX_DISAGG_TOKENS,
    MOE_TPOT_GOAL,
    parity_figure,
    replay_jobs,
    run_validation,
    worst,
)


def _pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 100:.1f} %"


#: the error columns: (metric, statistic, header); a header on two lines keeps each column narrow
ERRORS = (
    ("ttft", "median", "TTFT\nmedian"),
    ("ttft", "p90", "TTFT\np90"),
    ("tpot", "median", "TPOT\nmedian"),
    ("tpot", "p90", "TPOT\np90"),
)
#: how the tables name each clock: the profiled clock unfitted (h = 0), plus the per-step host
#: overhead held out and in-sample (kvbench.validation.overhead)
CLOCK_LABELS = {
    "profiled": "profiled h=0",
    HELD_OUT: "+h held-out",
    IN_SAMPLE: "+h in-sample",
    "roofline": "roofline",
    "aic": "aic",
}
HEADERS = {"system": "GPU", "backend": "engine", "tp_size": "TP", "batch_size": "batch", "isl": "ISL", "osl": "OSL"}


def _grid(title: str) -> Table:
    """A table without vertical rules: what fits 100 columns (a pipe's width) with no cell wrapped."""
    return Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True
    )


def _cell(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _model(path: str) -> str:
    """``Llama-3.1-8B-Instruct`` for ``meta-llama/Llama-3.1-8B-Instruct``: the name alone keeps the
    worst rows' table within 100 columns (the sample's models differ by name; the tables above
    give each one's full path)."""
    return path.rpartition("/")[2]


def _table(title: str, frame, clocks, keys) -> Table:
    """One row per clock of each row of ``frame`` (its ``keys`` on the first): median and p90 errors."""
    table = _grid(title)
    for key in keys:
        table.add_column(HEADERS.get(key, key), justify="right" if key in ("tp_size", "rows") else "left")
    table.add_column("clock")
    for _, _, header in ERRORS:
        table.add_column(header, justify="right", no_wrap=True)
    for _, row in frame.iterrows():
        cells = [_cell(row[k]) for k in keys]
        for i, clock in enumerate(clocks):
            table.add_row(
                *(cells if i == 0 else [""] * len(cells)),
                CLOCK_LABELS.get(clock, clock),
                *(_pct(row[f"{clock}_{metric}_{stat}"]) for metric, stat, _ in ERRORS),
                end_section=i == len(clocks) - 1,
            )
    return table


def _worst_table(metric: str, frame) -> Table:
    table = _grid(f"largest profiled {metric.upper()} errors")
    for key in ("model_path", "system", "backend", "tp_size", "isl", "osl", "batch_size"):
        table.add_column(
            "model" if key == "model_path" else HEADERS[key],
            justify="left" if key in ("model_path", "system", "backend") else "right",
        )
    for header in ("measured\nms", "profiled\nms", "error"):
        table.add_column(header, justify="right", no_wrap=True)
    for _, row in frame.iterrows():
        table.add_row(
            _model(str(row["model_path"])),
            *(_cell(row[k]) for k in ("system", "backend", "tp_size", "isl", "osl", "batch_size")),
            f"{row[f'silicon_{metric}_ms']:.1f}",
            f"{row[f'profiled_{metric}_ms']:.1f}",
            _pct(row[f"profiled_{metric}_ape"]),
        )
    return table


def _refused_table(refused) -> Table:
    table = _grid("not replayed, by reason")
    table.add_column("reason")
    table.add_column("rows", justify="right")
    table.add_column("what it means")
    for reason, n in refused.items():
        table.add_row(str(reason), str(int(n)), REASONS.get(str(reason), ""))
    return table


def _failed_table(failed) -> Table:
    table = _grid("admitted rows whose replay kvbench refused (no prediction), by clock and reason")
    table.add_column("replays", justify="right")
    table.add_column("clock: first line of the refusal")
    for status, n in failed.items():
        table.add_row(str(int(n)), visible(str(status), 160))
    return table


def _overhead_lines(v) -> list[str]:
    """Each framework's in-sample step overhead with its source and its held-out errors."""
    lines = []
    for backend, fit in (v.fits or {}).items():
        part = v.rows[(v.rows["backend"] == backend) & (v.rows["mode"] == "agg")]
        medians = [float(part[f"{HELD_OUT}_{m}_ape"].median()) for m in ("tpot", "ttft")]
        lines.append(source_line(fit, *medians))
    return lines


def goal_lines(v) -> list[str]:
    """The goals, each with the profiled clock's number and whether it is met."""
    lines = []
    for subset, metric, goal in (
        ("TP1", "tpot", GOALS["tpot"]),
        ("TP1", "ttft", GOALS["ttft"]),
        ("all MoE", "tpot", MOE_TPOT_GOAL),
    ):
        pick = v.headline[v.headline["subset"] == subset]
        for clock in ("profiled", HELD_OUT):
            if not len(pick) or f"{clock}_{metric}_median" not in pick:
                continue
            got = pick.iloc[0][f"{clock}_{metric}_median"]
            verdict = "no prediction for" if math.isnan(got) else "meets" if got <= goal else "misses"
            lines.append(
                f"{subset} {CLOCK_LABELS[clock]} median {metric.upper()} error {_pct(got)}: {verdict} the goal of "
                f"{_pct(goal)}"
            )
    predicted = v.groups.dropna(subset=["profiled_tpot_median"])
    over = predicted[predicted["profiled_tpot_median"] > GROUP_TPOT_LIMIT]
    lines.append(
        f"groups (model, GPU, engine) with a profiled median TPOT error above {_pct(GROUP_TPOT_LIMIT)}: "
        f"{len(over)} of the {len(predicted)} with a profiled prediction ({len(v.groups)} groups)"
    )
    if "aic_tpot_median" in v.groups:
        both = v.groups.dropna(subset=["profiled_tpot_median", "aic_tpot_median"])
        better = int((both["profiled_tpot_median"] <= both["aic_tpot_median"]).sum())
        lines.append(f"groups where kvbench's median TPOT error is at most aiconfigurator's: {better} of {len(both)}")
    return lines


#: what the output folder receives (the names ``write_folder`` below gives it)
TABLES = ("rows", "groups", "headline")
DOCUMENT = "validate.json"
FILES = folder_files(TABLES, ["parity.png", DOCUMENT])


def _refuse_finished(out_dir: Path) -> None:
    """A complete result in ``--out`` is never overwritten: a replay takes minutes, and its numbers
    may be the ones a report quotes. Refused in one line that says what is there."""
    if (out_dir / COMPLETE).is_file():
        try:
            command = read_json_object(out_dir / DOCUMENT, "validate record").get("command", "?")
        except ConfigError:
            command = "not a validate folder"
        raise ConfigError(
            f"--out {visible(str(out_dir), 200)} already holds a complete result ({visible(str(command), 200)}): "
            "kvbench validate never overwrites one; choose another --out folder, or remove this one to write it again"
        )


def _main(argv: list[str]) -> int:
    parser = Parser(
        "kvbench validate",
        "Replay public end-to-end TTFT/TPOT measurements of real vLLM, SGLang and TRT-LLM deployments "
        "(aiconfigurator-core's silicon sample) on kvbench's profiled clock and its roofline, and report the errors. "
        "Runs on what kvbench ships (the dense rows on H100/H200, the MoE rows at the layouts its excerpt "
        "holds; any other row is refused in one line, counted); the profiles extra (pip install -e "
        "'.[profiles]' in a clone) prices every row and adds aiconfigurator's own estimate beside them.",
    )
    parser.add_argument("--model", action="append", help="only this model_path (repeatable), e.g. Qwen/Qwen3-32B")
    parser.add_argument(
        "--system", action="append", help="only this GPU (repeatable): h100_sxm, h200_sxm, b200_sxm, b300_sxm, gb200"
    )
    parser.add_argument("--backend", action="append", help="only this engine (repeatable): vllm, sglang, trtllm")
    parser.add_argument("--mode", action="append", help="only these rows (repeatable): agg (aggregated), disagg")
    parser.add_argument(
        "--tp", type=int, action="append", help="only aggregated rows of this TP size (repeatable), e.g. 1"
    )
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N admitted rows")
    parser.add_argument(
        "--waves",
        type=int,
        default=client_shape.WAVES,
        help=f"the client sends this many times its concurrency (default {client_shape.WAVES}: the sample does not "
        "record how many requests each benchmark sent)",
    )
    parser.add_argument(
        "--warmup-waves",
        type=int,
        default=client_shape.WARMUP_WAVES,
        help="leave the requests of the first K waves out of the means (default 0: vllm bench serve counts "
        "every request it sends)",
    )
    parser.add_argument(
        "--desync",
        type=float,
        default=client_shape.DESYNC,
        help="spread the first wave's sends over this fraction (0 to 1) of one request's unloaded latency "
        "(default 0: all at t=0, as a benchmark client starts them)",
    )
    parser.add_argument(
        "--schedulers",
        default="shared",
        help="shared (default): kvbench's chunked prefill at 8,192 tokens a step for every engine; framework: "
        "each engine's own admission rule (engine=vllm_v1, sglang, trtllm with their default limits)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="replay a disaggregated row only if it simulates at most this many output tokens "
        "(default 4,000,000; 0: any)",
    )
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: one per CPU)")
    parser.add_argument("--no-aic", action="store_true", help="leave out aiconfigurator's own estimate")
    parser.add_argument("--out", default=None, help="output folder (default results/validate/<date>/<time>/)")
    args, overrides = parser.parse(argv)
    require(not overrides, "kvbench validate", overrides[0] if overrides else None, "takes no kvbench overrides")
    require(args.limit is None or args.limit >= 1, "--limit", args.limit, "use an integer >= 1")
    require(args.max_tokens is None or args.max_tokens >= 0, "--max-tokens", args.max_tokens, "use an integer >= 0")
    require(args.workers is None or args.workers >= 1, "--workers", args.workers, "use an integer >= 1")
    for tp in args.tp or ():
        require(tp >= 1, "--tp", tp, "use an integer >= 1")
    client = client_shape.ClientShape(args.waves, args.warmup_waves, args.desync)
    client.validate()
    require(args.schedulers in SCHEDULERS, "--schedulers", args.schedulers, f"choose one of {', '.join(SCHEDULERS)}")
    now = datetime.now()
    out_dir = Path(args.out) if args.out else Path("results") / "validate" / f"{now:%Y-%m-%d}" / f"{now:%H-%M-%S-%f}"
    check_writable(out_dir, "--out", named=bool(args.out))
    check_folder_files(out_dir, FILES)
    _refuse_finished(out_dir)
    from kvbench.validation.silicon import MODELS, admitted, architecture, read_silicon, select

    frame, _ = read_silicon()
    rows, _ = admitted(frame)
    # the replays (two clocks for a dense row, the profiled one for the others; a disaggregated row
    # only where deployment=disagg exists), and aiconfigurator's estimate of each row where the
    # package is installed
    picked = select(rows, args.model, args.system, args.backend, args.limit, args.mode, args.tp)
    max_tokens = MAX_DISAGG_TOKENS if args.max_tokens is None else (args.max_tokens or None)
    picked = picked.assign(architecture=[architecture(MODELS[m]) for m in picked["model_path"]])
    with_aic = not args.no_aic and importlib.util.find_spec("aiconfigurator_core") is not None
    total = len(replay_jobs(picked, max_tokens, client.waves, args.schedulers)) + (len(picked) if with_aic else 0)
    with progress_bar(total, "replaying", enabled=True, unit="runs") as advance:
        v = run_validation(
            models=args.model,
            modes=args.mode,
            max_tokens=max_tokens,
            systems=args.system,
            backends=args.backend,
            limit=args.limit,
            workers=args.workers,
            with_aic=not args.no_aic,
            advance=advance,
            tps=args.tp,
            client=client,
            schedulers=args.schedulers,
        )
    clocks = [c for c in ("profiled", HELD_OUT, IN_SAMPLE, "roofline", "aic") if f"{c}_ttft_ape" in v.rows]
    console = wide_console()
    console.print(f"{len(v.rows)} rows of {v.source} replayed")
    if len(v.refused):
        console.print(_refused_table(v.refused))
    console.print(FITTED)
    console.print(client.describe())
    overhead_lines = _overhead_lines(v)
    for line in overhead_lines:
        console.print(line)
    if v.aic_status:
        console.print(f"aiconfigurator's own estimate left out: {v.aic_status}")
    if len(v.failed):
        console.print(_failed_table(v.failed))
    console.print(_table("absolute percentage error", v.headline, clocks, ["subset", "rows"]))
    for line in goal_lines(v):
        console.print(line)
    for (arch, model), groups in v.groups.groupby(["architecture", "model_path"], sort=False):
        console.print(
            _table(f"{model} ({arch}): by GPU and engine", groups, clocks, ["system", "backend", "mode", "rows"])
        )
    for metric, frame_worst in worst(v.rows).items():
        console.print(_worst_table(metric, frame_worst))
    command = shlex.join(["kvbench", "validate", *argv])
    write_folder(
        out_dir,
        dict(zip(TABLES, (v.rows, v.groups, v.headline))),
        {"parity.png": parity_figure(v.rows, clocks)},
        {
            DOCUMENT: {
                "command": command,
                "source": v.source,
                "aic": v.aic_status or "ran",
                "fitted": FITTED,
                "schedulers": args.schedulers,
                "client": {
                    "waves": client.waves,
                    "warmup_waves": client.warmup_waves,
                    "desync": client.desync,
                    "text": client.describe(),
                },
                "step_overhead_s": {
                    b: {
                        "in_sample": f.step_overhead_s,
                        "rows": f.rows,
                        "groups": f.groups,
                        "versions": list(f.versions),
                    }
                    for b, f in (v.fits or {}).items()
                },
                "step_overhead_sources": overhead_lines,
                "not_replayed": {str(k): int(n) for k, n in v.refused.items()},
                "replays_refused": {str(k): int(n) for k, n in v.failed.items()},
            }
        },
    )
    console.print(f"wrote {out_dir}/ (rows, groups, headline as Parquet and CSV; parity.png)")
    return 0


def main() -> None:
    run_cli(_main, "kvbench validate")


if __name__ == "__main__":
    main()
