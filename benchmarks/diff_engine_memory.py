"""How much memory ``kvbench diff-engine`` takes: the numbers behind its memory check
(``kvbench/validation/differential.py``), which refuses a check that would exhaust the machine
before either side runs.

    python benchmarks/diff_engine_memory.py                     # nano-vllm's peer; about 4 minutes on 2 cores
    python benchmarks/diff_engine_memory.py --peer vllm_v1 --kvbench .venv-vllm/bin/kvbench

nano-vllm installs from its repository (README, "Engines by name"); vLLM's scheduler with
tools/install_vllm_scheduler.sh.

Both sides of a differential check keep every request's prompt token ids (the peer's own
sequences hold them again) and every step's decisions, so its memory grows with the prompt and
output tokens of its requests, far faster than a run's (``benchmarks/memory_per_request.py``).
Each point of a grid (requests x prompt tokens x output tokens, all requests synthetic) runs the
real command in a fresh process and reads its peak resident set (``ru_maxrss``). A linear model,
peak = base + prompt tokens x b + output tokens x c (all requests' tokens), is fitted by least
squares (a term per request adds nothing: fitted, it came out negative, 1.5 KB against 69 B a token);
each point is then predicted by the model fitted without it, and that held-out error is what is
reported. Results: ``benchmarks/results/diff_engine_memory-<peer>.{json,md}``. Exit status 0, 2 on
bad usage or a point that fails to run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

#: each peer's own preset and the block size it pages with
PEER_ARGS = {
    "nano_vllm": ["engine=nano_vllm", "allocator.block_size_tokens=256"],
    "vllm_v1": ["engine=vllm_v1"],
}
REQUESTS = (2000, 6000, 12000)
PROMPT_TOKENS = (256, 1024)
OUTPUT_TOKENS = (32, 256)
TERMS = ("base", "per_prompt_token", "per_output_token")

#: a peak RSS read by the child itself, after the check has run and before it exits
CHILD = """
import resource, sys
from kvbench.commands.diff_engine import _main
code = _main(sys.argv[1:])
print("maxrss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(0 if code in (0, 1) else code)
"""


def python_of(kvbench: Path) -> str:
    """The interpreter of the environment a ``kvbench`` script belongs to (its venv's python)."""
    return str(kvbench.parent / "python")


def measure(python: str, peer: str, n: int, prompt: int, output: int) -> int:
    """Peak RSS in bytes of one differential check of ``n`` requests of these lengths."""
    args = [
        f"--peer={peer}",
        *PEER_ARGS[peer],
        "workload=synthetic",
        f"workload.num_requests={n}",
        f"workload.prompt_tokens={prompt}",
        f"workload.output_tokens={output}",
        f"workload.s_max_tokens={prompt + output}",
        "check_memory=false",  # the check under measurement must not refuse its own points
    ]
    done = subprocess.run(
        [python, "-c", CHILD, *args], capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"}
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("maxrss_kb")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"diff_engine_memory: the point n={n} p={prompt} o={output} failed: {tail}")
    return int(lines[-1].split()[1]) * 1024


def design(points: list[dict]) -> np.ndarray:
    return np.array([[1.0, p["requests"] * p["prompt"], p["requests"] * p["output"]] for p in points])


def fit(points: list[dict]) -> np.ndarray:
    coef, *_ = np.linalg.lstsq(design(points), np.array([p["peak_bytes"] for p in points], dtype=float), rcond=None)
    return coef


def held_out_errors(points: list[dict]) -> list[float]:
    """Each point's relative error, predicted by the model fitted on the others."""
    errors = []
    for i, point in enumerate(points):
        coef = fit(points[:i] + points[i + 1 :])
        predicted = float((design([point]) @ coef)[0])
        errors.append(predicted / point["peak_bytes"] - 1)
    return errors


def markdown(report: dict) -> str:
    lines = [
        f"# Memory of `kvbench diff-engine --peer {report['peer']}`",
        "",
        f"`{report['command']}`; {report['machine']}",
        "",
        "| requests | prompt tokens | output tokens | peak RSS MB | held-out prediction error |",
        "|---:|---:|---:|---:|---:|",
    ]
    for p, err in zip(report["points"], report["held_out_relative_error"]):
        lines.append(
            f"| {p['requests']:,} | {p['prompt']:,} | {p['output']:,} | {p['peak_bytes'] / 1e6:,.1f} | {err * 100:+.1f} % |"
        )
    fitted = report["fit_all_points"]
    lines += [
        "",
        "Fitted on all points: " + ", ".join(f"{k} {v:,.0f} B" for k, v in fitted.items()),
        "",
        f"Held-out error: median {report['held_out_abs_median'] * 100:.1f} %, "
        f"largest {report['held_out_abs_max'] * 100:.1f} %.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", choices=sorted(PEER_ARGS), default="nano_vllm")
    parser.add_argument("--kvbench", type=Path, default=Path(sys.executable).parent / "kvbench")
    args = parser.parse_args()
    if not args.kvbench.is_file():
        parser.error(f"--kvbench {args.kvbench}: no such script")
    python = python_of(args.kvbench)
    points = []
    grid = list(itertools.product(REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS))
    for i, (n, prompt, output) in enumerate(grid, 1):
        peak = measure(python, args.peer, n, prompt, output)
        points.append({"requests": n, "prompt": prompt, "output": output, "peak_bytes": peak})
        print(f"[{i}/{len(grid)}] n={n} prompt={prompt} output={output}: {peak / 1e6:,.1f} MB", flush=True)
    errors = held_out_errors(points)
    report = {
        "peer": args.peer,
        "command": " ".join(["python", "benchmarks/diff_engine_memory.py", *sys.argv[1:]]),
        "machine": f"{os.uname().machine}, Python {sys.version.split()[0]}",
        "points": points,
        "fit_all_points": dict(zip(TERMS, (float(c) for c in fit(points)))),
        "held_out_relative_error": errors,
        "held_out_abs_median": float(np.median(np.abs(errors))),
        "held_out_abs_max": float(np.max(np.abs(errors))),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"diff_engine_memory-{args.peer}"
    from kvbench.io.atomic import write_json, write_text

    write_json(stem.with_suffix(".json"), report)
    write_text(stem.with_suffix(".md"), markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
