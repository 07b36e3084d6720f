"""The TPOT tail of ``kvbench validate``: for every group (model, GPU, engine) whose median TPOT
error is above a threshold, where its measured TPOTs sit between the two step prices a closed-loop
client allows (:mod:`kvbench.validation.bounds`), and what a lock-step step of a dense model is
made of (GEMMs against the weights' read at full HBM bandwidth, attention, all-reduces).

It reads the rows a ``kvbench validate`` run wrote (``rows.parquet``) and prices each row's two
bounds on the row's own profiled clock (the run's objects are built, nothing is simulated)::

    python -m kvbench.validation.tpot_tail --rows results/validate/<date>/<time>/rows.parquet \\
        --out docs/validation/tpot-tail

``position`` is where a TPOT lies between the bounds: 0 at lock-step, 1 at the steady state.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.api import ConfigError, build, pyplot, write_frame
from kvbench.validation import bounds, silicon

GROUP = ["model_path", "system", "backend"]
#: bytes per weight element of the dense GEMMs by the replay's GEMM table
WEIGHT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "nvfp4": 0.5}


def _gemm_parts(cost, batch: int, weight_bytes: float) -> tuple[float, float]:
    """A dense model's lock-step GEMMs: their measured time and the time to read their weights at
    the hardware config's HBM bandwidth (ms), for ``batch`` tokens."""
    layers = cost.model.num_layers
    shapes = cost._layer_shapes
    gemm_s = layers * sum(cost.tables.gemm.latency_s(batch, n, k) for n, k in shapes)
    read_s = layers * sum(n * k for n, k in shapes) * weight_bytes / cost.hardware.hbm_bandwidth_bytes_per_s
    return gemm_s * 1e3, read_s * 1e3


def row_bounds(rows: pd.DataFrame, advance=lambda: None) -> pd.DataFrame:
    """Each row's bounds, positions and (dense rows) GEMM parts."""
    out = []
    for _, row in rows.iterrows():
        overrides = silicon.replay(row, "profiled").overrides
        setup = build(list(overrides))
        cost = setup.cost
        # the step's token budget of the replay's scheduler (each framework's preset sets its own)
        b = bounds.step_bounds(row, cost, setup.scheduler.config.max_num_batched_tokens)
        span = b.mixed_ms - b.decode_ms
        record = {
            "id": row["id"],
            "lockstep_ms": b.decode_ms,
            "steady_ms": b.mixed_ms,
            "measured_position": (row["silicon_tpot_ms"] - b.decode_ms) / span if span > 0 else np.nan,
            "kvbench_position": (row["profiled_tpot_ms"] - b.decode_ms) / span if span > 0 else np.nan,
            "where": bounds.classify(row["silicon_tpot_ms"], b),
            "gemm_ms": np.nan,
            "weight_read_ms": np.nan,
            "floor_ms": np.nan,
        }
        if row["architecture"] == "dense":
            batch, context_tokens = int(row["batch_size"]), int(row["isl"]) + int(row["osl"]) // 2
            gemm = dict(o.split("=", 1) for o in overrides)["kernel.gemm"]
            record["gemm_ms"], record["weight_read_ms"] = _gemm_parts(cost, batch, WEIGHT_BYTES[gemm])
            # no engine decodes faster than it reads its weights and its batch's KV once per step
            kv_bytes = batch * context_tokens * cost.model.kv_bytes_per_token
            kv_ms = kv_bytes / cost.hardware.hbm_bandwidth_bytes_per_s * 1e3
            record["floor_ms"] = record["weight_read_ms"] + kv_ms
        out.append(record)
        advance()
    return pd.DataFrame(out)


def tail(rows: pd.DataFrame, threshold: float, advance=lambda: None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-row table, per-group table) of the aggregated groups above ``threshold`` median error."""
    rows = rows[(rows["mode"] == "agg") & (rows["profiled_status"] == "ok")].copy()
    rows["tpot_error"] = rows["profiled_tpot_ms"] / rows["silicon_tpot_ms"] - 1
    medians = rows.groupby(GROUP)["tpot_error"].apply(lambda e: e.abs().median())
    over = medians[medians > threshold].index
    picked = rows.set_index(GROUP).loc[over].reset_index() if len(over) else rows.iloc[:0]
    if picked.empty:
        raise ConfigError(f"no group has a median TPOT error above {threshold:.0%}: lower --threshold")
    per_row = picked.merge(row_bounds(picked, advance), on="id")
    groups = []
    for key, g in per_row.groupby(GROUP, sort=False):
        counts = g["where"].value_counts()
        groups.append(
            {
                **dict(zip(GROUP, key)),
                "rows": len(g),
                "tpot_ape_median": g["tpot_error"].abs().median(),
                "tpot_error_median": g["tpot_error"].median(),
                "below_lockstep": int(counts.get(bounds.BELOW, 0)),
                "between": int(counts.get(bounds.BETWEEN, 0)),
                "above_steady": int(counts.get(bounds.ABOVE, 0)),
                "below_hbm_floor": int((g["silicon_tpot_ms"] < g["floor_ms"]).sum()),
                "measured_position_median": g["measured_position"].median(),
                "kvbench_position_median": g["kvbench_position"].median(),
                "gemm_over_weight_read_median": (g["gemm_ms"] / g["weight_read_ms"]).median(),
                "lockstep_gemm_share_median": (g["gemm_ms"] / g["lockstep_ms"]).median(),
            }
        )
    table = pd.DataFrame(groups).sort_values("tpot_ape_median", ascending=False).reset_index(drop=True)
    return per_row, table


def figure(per_row: pd.DataFrame, table: pd.DataFrame):
    """Each group's measured and kvbench positions between lock-step (0) and steady state (1)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(table) + 1.6))
    labels = []
    for i, t in table.iterrows():
        g = per_row[(per_row[GROUP] == t[GROUP].to_numpy()).all(axis=1)]
        y = len(table) - 1 - i
        ax.scatter(g["measured_position"].clip(-0.5, 2.0), np.full(len(g), y + 0.12), s=14, c="tab:blue")
        ax.scatter(g["kvbench_position"].clip(-0.5, 2.0), np.full(len(g), y - 0.12), s=14, c="tab:orange")
        labels.append((y, f"{t['model_path'].split('/')[-1]} {t['system']} {t['backend']} ({t['rows']})"))
    ax.set_yticks([y for y, _ in labels], [name for _, name in labels], fontsize=8)
    for x in (0.0, 1.0):
        ax.axvline(x, color="grey", lw=0.8, ls="--")
    ax.scatter([], [], c="tab:blue", label="measured")
    ax.scatter([], [], c="tab:orange", label="kvbench")
    ax.set_xlabel("TPOT position: 0 = lock-step decode step, 1 = steady-state mixed step (clipped to [-0.5, 2])")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Where each TPOT lies between the closed loop's two step prices")
    fig.tight_layout()
    return fig


def markdown(table: pd.DataFrame) -> str:
    lines = [
        "| model | GPU | engine | rows | TPOT error (median, signed) | below HBM floor | below lock-step | between "
        "| above steady | position measured / kvbench | GEMM / weight read |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _, t in table.iterrows():
        dense = not np.isnan(t["gemm_over_weight_read_median"])
        ratio = f"{t['gemm_over_weight_read_median']:.2f}x" if dense else "—"
        lines.append(
            f"| {t['model_path']} | {t['system']} | {t['backend']} | {t['rows']} | {t['tpot_ape_median']:.1%} "
            f"({t['tpot_error_median']:+.1%}) | {t['below_hbm_floor'] if dense else '—'} | {t['below_lockstep']} | {t['between']} | {t['above_steady']} | "
            f"{t['measured_position_median']:.2f} / {t['kvbench_position_median']:.2f} | {ratio} |"
        )
    return "\n".join(lines)


def _read(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ConfigError(f"--rows {path} is not a file: give the rows.parquet (or rows.csv) kvbench validate wrote")
    frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    missing = {"id", "mode", "silicon_tpot_ms", "profiled_tpot_ms", "profiled_status"} - set(frame.columns)
    if missing:
        raise ConfigError(f"--rows {path} lacks {', '.join(sorted(missing))}: it is not a kvbench validate rows table")
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvbench.validation.tpot_tail", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", required=True, help="the rows.parquet (or rows.csv) of a kvbench validate run")
    parser.add_argument("--out", required=True, help="folder for tail_rows.*, tail_groups.* and tail.png")
    parser.add_argument("--threshold", type=float, default=0.20, help="median TPOT error a group must exceed")
    args = parser.parse_args(argv)
    if not 0 <= args.threshold < 10:
        print("tpot_tail: error: --threshold must be a fraction in [0, 10), e.g. 0.2", file=sys.stderr)
        return 2
    out = Path(args.out)
    names = ("tail_rows.csv", "tail_rows.parquet", "tail_groups.csv", "tail_groups.parquet", "tail.png")
    if (out.exists() and not out.is_dir()) or any((out / n).exists() and not (out / n).is_file() for n in names):
        print(f"tpot_tail: error: --out {out} must be a folder whose tail files are plain files", file=sys.stderr)
        return 2
    try:
        rows = _read(Path(args.rows))
        per_row, table = tail(rows, args.threshold)
    except ConfigError as exc:
        print(f"tpot_tail: error: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    keep = [*GROUP, "id", "tp_size", "isl", "osl", "batch_size", "silicon_tpot_ms", "profiled_tpot_ms"]
    keep += [
        "lockstep_ms",
        "steady_ms",
        "measured_position",
        "kvbench_position",
        "where",
        "gemm_ms",
        "weight_read_ms",
        "floor_ms",
    ]
    write_frame(per_row[keep], out, "tail_rows", "%.6g")
    write_frame(table, out, "tail_groups", "%.6g")
    figure(per_row, table).savefig(out / "tail.png", dpi=110)
    print(markdown(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
