"""The held-out check of the kernel transfer (:mod:`kvbench.exec.transfer`): every measured
decode-attention table of SGLang's FlashInfer and Triton backends that has a TRT-LLM
``torch_flow`` partner on its GPU is hidden and predicted from the rest, and scored point by point.
Needs the full tables (aiconfigurator-core 0.12.0: ``pip install -e '.[profiles]'``)::

    python -m kvbench.studies.transfer --out docs/transfer

writes ``heldout_tables.csv`` (one row per hidden table), ``heldout.csv`` (per kernel and KV
dtype: median and p90 absolute relative latency error over every point) and
``predicted_vs_measured.png``, and refreshes ``kvbench/profiles/transfer_heldout.csv``, the file a
run's label reads its held-out error from (tests/kvbench/exec/test_transfer.py re-derives it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import ConfigError
from kvbench.exec import transfer
from kvbench.specs import profiles


def compute() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per-table rows, per-point rows, per-kernel-and-dtype summary) of both kernels."""
    tables, points = [], []
    for kernel in transfer.STAND_INS:
        rows, pts = transfer.leave_one_out(kernel)
        tables.append(rows)
        points.append(pts)
    points_frame = pd.concat(points, ignore_index=True)
    return pd.concat(tables, ignore_index=True), points_frame, transfer.heldout_summary(points_frame)


def figure(points: pd.DataFrame, path: Path) -> None:
    from kvbench.api import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, (kernel, part) in zip(axes, points.groupby("kernel")):
        ax.loglog(part["measured"], part["predicted"], ".", ms=1.5, alpha=0.3)
        lo, hi = part["measured"].min(), part["measured"].max()
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        err = np.abs(part["predicted"] / part["measured"] - 1)
        ax.set_title(f"{kernel}: held-out median {100 * err.median():.1f} %, p90 {100 * err.quantile(0.9):.1f} %")
        ax.set_xlabel("measured latency (ms)")
        ax.set_ylabel("predicted with its table hidden (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvbench.studies.transfer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/transfer"), help="folder for the CSVs and figure")
    args = parser.parse_args(argv)
    try:
        if profiles.table_root().excerpt:
            raise ConfigError(f"the held-out check needs every table: {profiles.INSTALL_HINT}")
        if args.out.exists() and not args.out.is_dir():
            raise ConfigError(f"--out {args.out} is not a folder")
        tables, points, summary = compute()
    except ConfigError as exc:
        print(f"kvbench: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tables.round(4).to_csv(args.out / "heldout_tables.csv", index=False)
    summary.to_csv(args.out / "heldout.csv", index=False)
    summary.to_csv(transfer.HELDOUT_FILE, index=False)
    figure(points, args.out / "predicted_vs_measured.png")
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
