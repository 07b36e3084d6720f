"""The comparison people ask of disaggregated serving: one model, one GPU, one SLO, the
aggregated engine against 1P1D, 2P1D and 1P2D, by the goodput each layout gives per GPU.

Each layout serves Poisson arrivals of identical requests at the largest arrival rate per GPU at
which 90 % of requests meet both SLOs (DistServe's measure), found by bisection over whole runs
(``kvbench slo-search``'s, over ``rate per GPU x the layout's GPUs``); its *goodput per GPU* is the
requests per second that met both SLOs at that rate, divided by its GPUs. At that rate the table
also gives the TTFT, the TPOT and, for a disaggregated layout, where the TTFT goes. Every number comes from runs of kvbench itself; the figure and the CSV are written
where ``--out`` says (the README shows the committed ones)::

    KVBENCH_PROFILE_TABLES=excerpt python -m kvbench.studies.disagg_layouts --out docs/disagg
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from kvbench.api import ConfigError, bisect, pyplot, run, write_frame

MODEL = ("model=llama3.1-8b", "hardware=h100-sxm", "kernel=vllm_fa3")
PROMPT_TOKENS, OUTPUT_TOKENS = 2048, 256
TTFT_SLO_S, TPOT_SLO_S, ATTAINMENT = 0.2, 0.012, 0.9
#: (name, overrides, GPUs): each worker is one H100 (TP1)
LAYOUTS = (
    ("aggregated", ("deployment=aggregated",), 1),
    ("1P1D", ("deployment=disagg",), 2),
    ("2P1D", ("deployment=disagg", "deployment.prefill_workers=2"), 3),
    ("1P2D", ("deployment=disagg", "deployment.decode_workers=2"), 3),
)
#: the bisection's bracket of arrival rates per GPU (req/s) and its tolerance
LOW_PER_GPU, HIGH_PER_GPU, REL_TOL = 1.0, 32.0, 0.03


def workload(num_requests: int, rate_per_s: float) -> list[str]:
    return [
        "workload=synthetic",
        "workload.lengths=fixed",
        f"workload.prompt_tokens={PROMPT_TOKENS}",
        f"workload.output_tokens={OUTPUT_TOKENS}",
        f"workload.s_max_tokens={PROMPT_TOKENS + OUTPUT_TOKENS}",
        f"workload.num_requests={num_requests}",
        "workload.arrival=poisson",
        f"workload.rate_per_s={rate_per_s!r}",
        f"slo.ttft_s={TTFT_SLO_S}",
        f"slo.tpot_s={TPOT_SLO_S}",
        "progress=false",
    ]


def layout_row(name: str, overrides: tuple[str, ...], gpus: int, num_requests: int) -> dict:
    """One layout: the largest rate per GPU meeting the SLOs, and its run's numbers."""
    results = {}

    def passes(per_gpu: float) -> bool:
        results[per_gpu] = run([*MODEL, *overrides, *workload(num_requests, per_gpu * gpus)]).summary
        return results[per_gpu]["slo_attainment"] >= ATTAINMENT

    search = bisect(passes, LOW_PER_GPU, HIGH_PER_GPU, integer=False, rel_tol=REL_TOL, max_runs=12)
    if search.status != "bracketed":
        raise ConfigError(f"{name}: the SLOs are not bracketed by {LOW_PER_GPU}..{HIGH_PER_GPU} req/s per GPU")
    best = results[search.low]
    row = {
        "layout": name,
        "gpus": gpus,
        "goodput_per_gpu_req_s": best["goodput_requests_per_s"] / gpus,
        "rate_per_gpu_req_s": search.low,
        "slo_attainment": best["slo_attainment"],
        "ttft_p50_ms": best["ttft_p50_s"] * 1e3,
        "ttft_p90_ms": best["ttft_p90_s"] * 1e3,
        "tpot_p50_ms": best["tpot_p50_s"] * 1e3,
        "tpot_p90_ms": best["tpot_p90_s"] * 1e3,
        "output_tok_s_per_gpu": best["throughput_tokens_per_s"] / gpus,
    }
    for part in ("prefill_queue", "prefill", "transfer", "first_decode"):
        row[f"ttft_{part}_mean_ms"] = best.get(f"ttft_{part}_mean_s", math.nan) * 1e3
    return row


def table(num_requests: int = 400) -> pd.DataFrame:
    return pd.DataFrame([layout_row(name, o, gpus, num_requests) for name, o, gpus in LAYOUTS])


def markdown(frame: pd.DataFrame) -> str:
    """The README's table: each layout's goodput per GPU and its latencies at that load."""
    lines = [
        "| layout | GPUs | goodput per GPU (req/s) | TTFT p50 / p90 (ms) | TPOT p50 / p90 (ms) "
        "| TTFT mean = queue + prefill + KV + 1st decode (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for r in frame.itertuples(index=False):
        parts = (
            r.ttft_prefill_queue_mean_ms,
            r.ttft_prefill_mean_ms,
            r.ttft_transfer_mean_ms,
            r.ttft_first_decode_mean_ms,
        )
        split = "one engine" if any(math.isnan(p) for p in parts) else " + ".join(f"{p:.1f}" for p in parts)
        lines.append(
            f"| {r.layout} | {r.gpus} | {r.goodput_per_gpu_req_s:.2f} | {r.ttft_p50_ms:.1f} / {r.ttft_p90_ms:.1f} "
            f"| {r.tpot_p50_ms:.2f} / {r.tpot_p90_ms:.2f} | {split} |"
        )
    return "\n".join(lines)


def figure(frame: pd.DataFrame):
    plt = pyplot()
    fig, (good, ttft) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    colors = ["#7f7f7f", "#1f77b4", "#2ca02c", "#ff7f0e"]
    good.bar(frame["layout"], frame["goodput_per_gpu_req_s"], color=colors)
    for x, value in enumerate(frame["goodput_per_gpu_req_s"]):
        good.annotate(f"{value:.2f}", (x, value), ha="center", va="bottom", fontsize=8)
    good.set_ylabel("goodput per GPU (req/s, 90 % meet both SLOs)")
    good.set_title(f"TTFT <= {TTFT_SLO_S * 1e3:.0f} ms, TPOT <= {TPOT_SLO_S * 1e3:.0f} ms")
    x = range(len(frame))
    ttft.bar([i - 0.2 for i in x], frame["ttft_p90_ms"], width=0.4, label="TTFT p90 (ms)", color="#1f77b4")
    twin = ttft.twinx()
    twin.bar([i + 0.2 for i in x], frame["tpot_p90_ms"], width=0.4, label="TPOT p90 (ms)", color="#ff7f0e")
    ttft.axhline(TTFT_SLO_S * 1e3, color="#1f77b4", linestyle="--", linewidth=1)
    twin.axhline(TPOT_SLO_S * 1e3, color="#ff7f0e", linestyle="--", linewidth=1)
    ttft.set_xticks(list(x), frame["layout"])
    ttft.set_ylabel("TTFT p90 (ms)")
    twin.set_ylabel("TPOT p90 (ms)")
    ttft.set_title("at each layout's goodput (dashed: the SLOs)")
    handles = ttft.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ttft.legend(handles=handles, loc="lower center", fontsize=8)
    fig.suptitle(
        f"Llama-3.1-8B on H100 (vllm_fa3 tables), {PROMPT_TOKENS} + {OUTPUT_TOKENS} tokens, Poisson arrivals",
        fontsize=10,
    )
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvbench.studies.disagg_layouts", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="folder for layouts.csv, layouts.parquet and layouts.png")
    parser.add_argument("--requests", type=int, default=400, help="requests per run (default 400)")
    args = parser.parse_args(argv)
    if args.requests < 10:
        print("disagg_layouts: error: --requests must be at least 10", file=sys.stderr)
        return 2
    out = Path(args.out)
    targets = [out / name for name in ("layouts.csv", "layouts.parquet", "layouts.png")]
    if (out.exists() and not out.is_dir()) or any(t.exists() and not t.is_file() for t in targets):
        print(f"disagg_layouts: error: --out {out} must be a folder whose layouts.* are plain files", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    try:
        frame = table(args.requests)
    except ConfigError as exc:
        print(f"disagg_layouts: error: {exc}", file=sys.stderr)
        return 1
    write_frame(frame, out, "layouts", "%.6g")
    fig = figure(frame)
    fig.savefig(out / "layouts.png", dpi=110)
    print(markdown(frame))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
