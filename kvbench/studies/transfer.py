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

from kvbench.api import ConfigError, pyplot, write_text
from kvbench.api import kernel_transfer as transfer


def compute(method: str = "partner") -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per-table rows, per-point rows, per-kernel-and-dtype summary) of both kernels."""
    tables, points = [], []
    for kernel in transfer.STAND_INS:
        rows, pts = transfer.leave_one_out(kernel, method)
        tables.append(rows)
        points.append(pts)
    points_frame = pd.concat(points, ignore_index=True)
    return pd.concat(tables, ignore_index=True), points_frame, transfer.heldout_summary(points_frame)


def figure(points: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, (kernel, part) in zip(axes, points.groupby("kernel")):
        title = []
        for dtype, color in (("fp8", "tab:orange"), ("bfloat16", "tab:blue")):
            some = part[part["shape"].str.endswith(dtype)]
            err = np.abs(some["predicted"] / some["measured"] - 1)
            label = f"kv {dtype}: median {100 * err.median():.1f} %, p90 {100 * err.quantile(0.9):.1f} %"
            ax.loglog(some["measured"], some["predicted"], ".", ms=1.5, alpha=0.3, color=color, label=label)
            title.append(label)
        lo, hi = part["measured"].min(), part["measured"].max()
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.set_title(f"{kernel}, held out")
        ax.legend(loc="upper left", fontsize=8, markerscale=6)
        ax.set_xlabel("measured latency (ms)")
        ax.set_ylabel("predicted with its table hidden (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _percent(x: float) -> str:
    return f"{100 * x:.1f} %"


def _sources_text(sources) -> str:
    by_shape: dict = {}
    for t in sources:
        by_shape.setdefault(t.shape, []).append(t.system)
    return "; ".join(f"{', '.join(sorted(systems))} at {shape}" for shape, systems in sorted(by_shape.items()))


def distance_rows() -> list[str]:
    """One markdown row per candidate distance of the nearest-shape rule (Triton, bf16 KV)."""
    target = transfer.Table("h100_sxm", transfer.Shape(32, 32, 128, "bfloat16"))
    rows = []
    for name in transfer.DISTANCES:
        _, pts = transfer.leave_one_out("triton", distance=name)
        bf = pts[pts["shape"].str.endswith("bfloat16")]
        err = np.abs(bf["predicted"] / bf["measured"] - 1.0)
        big = err[bf["batch_size"] * bf["step"] > 100_000]
        sources = transfer.pick_sources("triton", target, distance=name)[0]
        chosen = " (chosen)" if name == transfer.DISTANCE else ""
        rows.append(
            f"| {name}{chosen} | {_percent(err.median())} | {_percent(err.quantile(0.9))} | {_percent(big.median())} "
            f"| {_sources_text(sources)} |"
        )
    return rows


def readme(summary: pd.DataFrame, tables: pd.DataFrame, points: pd.DataFrame) -> str:
    """docs/transfer/README.md: the method and the held-out numbers, as computed."""
    distances = distance_rows()
    llama2_triton = _sources_text(
        transfer.pick_sources("triton", transfer.Table("h100_sxm", transfer.Shape(32, 32, 128, "bfloat16")))[0]
    )
    lines = [
        "# The kernel transfer: kvbench's Triton and FlashInfer kernels on H100/H200",
        "",
        f"Written by `{COMMAND}` (aiconfigurator-core",
        "0.12.0 installed); every number below is computed there. The method is in `kvbench/exec/transfer.py`.",
        "",
        "No public table times SGLang's FlashInfer decode on H100 or H200, nor its Triton decode at",
        "Llama-2-7B's shape (32 heads, 32 KV heads, head_dim 128) on any GPU. Both were measured beside",
        "TRT-LLM's `torch_flow` attention on every GPU they ran on, and `torch_flow` was measured on",
        "H100/H200 at the runs' shapes. A transferred table is `torch_flow` on the target GPU times",
        "the kernel's ratio to `torch_flow` where both were measured, point by point of (batch, context):",
        "",
        "- FlashInfer: its tables at the target's exact shape on every other GPU (Llama-2-7B bf16:",
        "  L40S and RTX PRO 6000; the Blackwell tables hold grouped-query shapes only);",
        "- Triton: its tables at the nearest measured shapes on every GPU, by the distance between",
        f"  shapes that scored best held out (`{transfer.DISTANCE}`, each in log2; table below); for",
        f"  Llama-2-7B: {llama2_triton}.",
        "",
        "Held out: each measured table with a partner is hidden and predicted from the rest (for",
        "Triton every table of its shape on every GPU is hidden too: the runs it prices have none at",
        "theirs). Error: absolute relative latency error over every grid point of every hidden table.",
        "The alternative, carrying the source GPUs' fraction of HBM bandwidth (`mem_bw`) and the KV",
        "bytes to the target (`roofline`), is scored on the same points and loses:",
        "",
        "| method | kernel | KV dtype | hidden tables | points | median error | p90 error |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in summary.itertuples(index=False):
        lines.append(
            f"| {r.method} | {r.kernel} | {r.kv_dtype} | {r.tables} | {r.points:,d} | {_percent(r.median_error)} "
            f"| {_percent(r.p90_error)} |"
        )
    lines += [
        "",
        "The nearest-shape rule's distance, each candidate scored held out (Triton, bf16 KV), and the",
        "tables it picks for Llama-2-7B on H100:",
        "",
        "| distance | median error | p90 error | median above 100,000 tokens | Llama-2-7B's sources |",
        "|---|---:|---:|---:|---|",
        *distances,
        "",
        "The distance was picked on this same held-out score among these four, so Triton's held-out",
        "error is that of a selected rule (a little optimistic); FlashInfer's rule had no choice made.",
    ]
    at = tables[(tables.heads == 32) & (tables.kv_heads == 32) & (tables.head_dim == 128)]
    lines += [
        "",
        "At Llama-2-7B's shape (32/32 heads, head_dim 128), each hidden table:",
        "",
        "| kernel | GPU | KV dtype | from | median error | p90 error |",
        "|---|---|---|---|---:|---:|",
    ]
    for r in at.itertuples(index=False):
        lines.append(
            f"| {r.kernel} | {r.system} | {r.kv_dtype} | {r.sources} | {_percent(r.median_error)} "
            f"| {_percent(r.p90_error)} |"
        )
    buckets = []
    bf = points[points["shape"].str.endswith("bfloat16")]
    edges = [0, 1_000, 10_000, 100_000, np.inf]
    names = ["up to 1,000", "1,000 to 10,000", "10,000 to 100,000", "above 100,000"]
    for kernel, part in bf.groupby("kernel"):
        tokens = part["batch_size"] * part["step"]
        err = np.abs(part["predicted"] / part["measured"] - 1.0)
        for lo, hi, name in zip(edges, edges[1:], names):
            e = err[(tokens > lo) & (tokens <= hi)]
            buckets.append(
                f"| {kernel} | {name} | {len(e):,d} | {_percent(e.median())} | {_percent(e.quantile(0.9))} |"
            )
    lines += [
        "",
        "![predicted vs measured](predicted_vs_measured.png)",
        "",
        "By batch x context (bf16 KV, median and p90 error of the points in each bucket):",
        "",
        "| kernel | batch x context tokens | points | median error | p90 error |",
        "|---|---|---:|---:|---:|",
        *buckets,
        "",
        "FP8 KV transfers worse (FlashInfer above all, whose FP8 path on Ada differs from Blackwell's):",
        "runs price bf16 KV unless the model says fp8, and the label gives the error of the run's dtype.",
        "",
        "## What is a stand-in",
        "",
        "- kvbench's `triton` kernel is priced as SGLang 0.5.14's Triton decode backend, and its",
        "  `flashinfer` kernel as SGLang 0.5.14's FlashInfer backend: the same algorithms, not kvbench's",
        "  code. A GPU run (`kvbench bench-kernels`, `gpu/run_all.sh`) writes a calibration file, which",
        "  wins over the transfer.",
        "- Everything else in a step (GEMMs, all-reduces, prefill attention, elementwise work) is",
        "  SGLang 0.5.14's tables on the target GPU (`kernel=sglang_fa3`'s): SGLang runs both backends,",
        "  and its FA3 prefill stands in for FlashInfer's FA3-based prefill on Hopper and for Triton's.",
        "- The transfer prices H100 and H200 (`hardware=h100-sxm`, `h200`, `h200-sxm`); other GPUs keep",
        "  the uncalibrated roofline (`calibration: uncalibrated`).",
        "",
        "Data: aiconfigurator-core 0.12.0 (Apache-2.0, NVIDIA), `generation_attention_perf` tables;",
        "the rows the default runs and tests read are in kvbench's excerpt (`kvbench/profiles/`).",
        "A search for further public FlashInfer or Triton decode timings on H100/H200 (the kernels'",
        "benchmark folders, engine benchmark suites) found no table with a repository and license to",
        "cite, so none is used; a GPU run (`gpu/run_all.sh`) is the held-out check still to come.",
        "",
    ]
    return "\n".join(lines)


#: the command that writes docs/transfer/ and the held-out table runs read
COMMAND = "python -m kvbench.studies.transfer --out docs/transfer --heldout-file kvbench/profiles/transfer_heldout.csv"
#: what --out holds after a run
OUT_FILES = ("heldout_tables.csv", "heldout.csv", "predicted_vs_measured.png", "README.md")


def _not_a_file(path: Path) -> bool:
    """A path that exists (or dangles) and is no plain file: a folder, FIFO or device is never replaced."""
    return (path.exists() or path.is_symlink()) and not path.is_file()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvbench.studies.transfer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/transfer"), help="folder for the CSVs and figure")
    parser.add_argument(
        "--heldout-file",
        type=Path,
        default=None,
        help="also write the per-kernel held-out summary the runs' labels read here "
        "(kvbench/profiles/transfer_heldout.csv in a clone); default: only under --out",
    )
    args = parser.parse_args(argv)
    try:
        if args.out.exists() and not args.out.is_dir():
            raise ConfigError(f"--out {args.out} is not a folder")
        for path in [*(args.out / name for name in OUT_FILES), *([args.heldout_file] if args.heldout_file else [])]:
            if _not_a_file(path):
                raise ConfigError(f"{path} exists and is not a plain file: it is never replaced")
        if args.heldout_file is not None and not args.heldout_file.parent.is_dir():
            raise ConfigError(f"--heldout-file {args.heldout_file}: its folder does not exist")
        transfer.require_full_tables()
        tables, points, summary = compute()
    except ConfigError as exc:
        print(f"kvbench: {exc}", file=sys.stderr)
        return 2
    _, _, alternative = compute("roofline")
    args.out.mkdir(parents=True, exist_ok=True)
    both = pd.concat([summary, alternative], ignore_index=True)
    write_text(args.out / "heldout_tables.csv", tables.round(4).to_csv(index=False))
    write_text(args.out / "heldout.csv", both.to_csv(index=False))
    if args.heldout_file is not None:
        write_text(args.heldout_file, summary.to_csv(index=False))
    figure(points, args.out / "predicted_vs_measured.png")
    write_text(args.out / "README.md", readme(both, tables, points))
    print(both.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
