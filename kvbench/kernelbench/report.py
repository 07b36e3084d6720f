"""What the kernel benchmark writes: the CSV, bandwidth-versus-block-size plots, calibration files.

A calibration file (format in :mod:`kvbench.specs.calibration`) holds, per block size, the kernel's
achieved bytes/s divided by the hardware config's *spec* HBM bandwidth, aggregated over the
(batch, context) points measured at every block size as ``sum(bytes read) / sum(median time)``:
that is the efficiency at which the simulator's ``bytes / (bandwidth * efficiency)`` reproduces
the total time of those decode steps. Rows whose output failed the correctness check are left out.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from kvbench.io.atomic import write_file, write_json

#: the columns of results.csv, in order (units in the names)
COLUMNS = [
    "kernel",
    "layout",
    "block_size_tokens",
    "batch",
    "context_tokens",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "dtype",
    "status",
    "plan_s",
    "time_median_s",
    "time_min_s",
    "bytes_read",
    "achieved_bytes_per_s",
    "fraction_of_copy_bw",
    "efficiency_vs_spec",
    "max_abs_err",
    "output_ok",
    "kernel_config",
]


def _usable(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["status"] == "ok") & (df["output_ok"] != False)]  # noqa: E712 - NaN (unchecked) counts as ok


def efficiency_table(df: pd.DataFrame, kernel: str, spec_bytes_per_s: float) -> dict[str, float]:
    """``{"8": eff, ..., "contiguous": eff}`` for one kernel (see the module docstring)."""
    rows = _usable(df[df["kernel"] == kernel])
    table: dict[str, float] = {}
    paged = rows[rows["layout"] == "paged"]
    if not paged.empty:
        # only the (batch, context) points measured at every block size, so block sizes compare fairly
        block_sizes = sorted(paged["block_size_tokens"].unique())
        points = paged.groupby(["batch", "context_tokens"])["block_size_tokens"].nunique()
        common = set(points[points == len(block_sizes)].index)
        for block_size in block_sizes:
            sel = paged[paged["block_size_tokens"] == block_size]
            sel = sel[[p in common for p in zip(sel["batch"], sel["context_tokens"])]]
            if not sel.empty:
                table[str(int(block_size))] = _aggregate(sel, spec_bytes_per_s)
    contiguous = rows[rows["layout"] == "contiguous"]
    if not contiguous.empty:
        table["contiguous"] = _aggregate(contiguous, spec_bytes_per_s)
    return table


def _aggregate(rows: pd.DataFrame, spec_bytes_per_s: float) -> float:
    return float(f"{rows['bytes_read'].sum() / rows['time_median_s'].sum() / spec_bytes_per_s:.4g}")


def write_calibrations(
    df: pd.DataFrame, out_dir: Path, hardware: str, spec_bytes_per_s: float, meta: dict
) -> list[Path]:
    """One ``<out_dir>/<hardware>/<kernel>.json`` per kernel plugin that has usable rows."""
    written = []
    sdpa = efficiency_table(df, "sdpa", spec_bytes_per_s).get("contiguous")
    for kernel in sorted(set(df["kernel"]) - {"sdpa"}):
        table = efficiency_table(df, kernel, spec_bytes_per_s)
        if not table:
            continue
        above_spec = {k: v for k, v in table.items() if v > 1}
        if above_spec:  # the simulator refuses such a file: the hardware config does not describe this GPU
            print(
                f"bench-kernels: warning: {kernel} read faster than hardware={hardware}'s spec bandwidth "
                f"(efficiency {above_spec}); no calibration written: use the hardware config of this GPU",
                file=sys.stderr,
            )
            continue
        path = out_dir / hardware / f"{kernel}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "hardware": hardware,
            "kernel": kernel,
            **meta,
            "efficiency_definition": "sum(bytes read) / sum(median cold-L2 time) / spec HBM bandwidth, over the "
            "(batch, context) points measured at every block size",
            "efficiency": table,
            "contiguous_sdpa_baseline": sdpa,
        }
        write_json(path, doc)
        written.append(path)
    return written


def plot_bandwidth(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``bandwidth_<kernel>.png``: fraction of copy bandwidth versus block size, one line per (batch, context)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI or on a GPU box
    import matplotlib.pyplot as plt

    written = []
    ok = _usable(df)
    sdpa = ok[ok["kernel"] == "sdpa"]
    for kernel in sorted(set(ok["kernel"]) - {"sdpa"}):
        rows = ok[ok["kernel"] == kernel]
        paged = rows[rows["layout"] == "paged"]
        if paged.empty:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, ((batch, context), sel) in enumerate(paged.groupby(["batch", "context_tokens"])):
            sel = sel.sort_values("block_size_tokens")
            color = f"C{i % 10}"
            ax.plot(
                sel["block_size_tokens"],
                sel["fraction_of_copy_bw"],
                "o-",
                color=color,
                label=f"B={batch}, ctx={context}",
            )
            contiguous = rows[
                (rows["layout"] == "contiguous") & (rows["batch"] == batch) & (rows["context_tokens"] == context)
            ]
            if not contiguous.empty:
                ax.axhline(float(contiguous["fraction_of_copy_bw"].iloc[0]), color=color, ls=":", lw=1)
            base = sdpa[(sdpa["batch"] == batch) & (sdpa["context_tokens"] == context)]
            if not base.empty:
                ax.axhline(float(base["fraction_of_copy_bw"].iloc[0]), color=color, ls="--", lw=0.8, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (tokens)")
        ax.set_ylabel("achieved bandwidth / measured copy bandwidth")
        ax.set_title(f"{kernel}: paged decode bandwidth (dotted: same kernel contiguous; dashed: torch SDPA)")
        ax.title.set_fontsize(9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        path = out_dir / f"bandwidth_{kernel}.png"
        fig.tight_layout()
        write_file(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
        plt.close(fig)
        written.append(path)
    return written
