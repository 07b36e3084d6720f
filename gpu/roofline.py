"""Real-mode step times against the roofline ``(weight bytes + KV bytes) / HBM bandwidth``.

    python gpu/roofline.py <real run folder> ...

For each run folder (steps table with ``measured_s``, from ``output.steps=true``) prints the median
and p90 over decode-only steps of measured time / roofline time, and the sim's prediction error
(``predicted_s`` when the table has it). Used by gpu/run_all.sh step 4.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def roofline_ratios(folder: Path) -> dict:
    steps = pd.read_parquet(folder / "steps.parquet")
    summary = json.loads((folder / "summary.json").read_text())
    bandwidth = json.loads((folder / "config.json").read_text())["hardware"]["hbm_bandwidth_bytes_per_s"]
    decode = steps[(steps["num_prefill_tokens"] == 0) & (steps["num_decode_seqs"] > 0)]
    roofline_s = (decode["num_steps"] * summary["weight_bytes"] + decode["kv_read_bytes"]) / bandwidth
    ratio = (decode["measured_s"] / roofline_s).to_numpy(float)
    row = {
        "run": folder.name,
        "decode_steps": int(decode["num_steps"].sum()),
        "measured_over_roofline_p50": float(np.median(ratio)),
        "measured_over_roofline_p90": float(np.quantile(ratio, 0.9)),
    }
    if "predicted_s" in steps:
        err = (steps["predicted_s"] - steps["measured_s"]).abs() / steps["measured_s"]
        row.update(sim_error_p50=float(err.median()), sim_error_p90=float(err.quantile(0.9)))
    return row


def main(folders: list[str]) -> None:
    for folder in map(Path, folders):
        try:
            print(json.dumps(roofline_ratios(folder)))
        except (OSError, KeyError, ValueError) as exc:
            print(f"{folder}: no roofline ratio ({type(exc).__name__}: {exc})")


if __name__ == "__main__":
    main(sys.argv[1:])
