"""How fast kvbench's engine loop is, measured against Vidur on identical requests, and what it holds.

    python benchmarks/loop_speed.py --vidur-run PATH/run.sh      # the full comparison (~10 min)
    python benchmarks/loop_speed.py --requests 2000 --repeat 3  # kvbench only, quick

Three configurations of Llama-2-7B on an H100 (7,424 KV blocks of 16 tokens: 62,277,025,792
bytes, what Vidur's memory planner gives), each with 10,000 requests of 512 prompt tokens arriving
at t = 0, with 128 and with 2,048 output tokens:

- ``vllm``: paged allocator, prefill-first scheduling (vLLM v0), at most 128 sequences and 4,096
  prompt tokens per step, a 1 % watermark, recompute preemption. At 2,048 output tokens 128
  sequences outgrow the cache: a storm of recompute preemptions;
- ``vllm32``: the same with at most 32 sequences, which never outgrow it;
- ``orca``: reserve-to-max (naive slots of 4,096 tokens, 29 of them), Orca-style mixed steps with
  no prompt-token budget.

Vidur 0.0.26 runs the same requests with ``SCHED=vllm|orca``, ``QPS=static``, ``LENGTHS=fixed``,
``BLOCK=16`` and the same ``BATCH_CAP``. Its runner (``--vidur-run``: a script that reads those variables
and ``N``, ``PROMPT``, ``DECODE`` from the environment and prints one JSON line holding
``wall_s_event_loop`` and ``batches``) is not part of kvbench. Both simulators' step counts are
printed side by side, as the check that they did the same work.

Measured, per configuration, in one process (this machine is shared and noisy, so kvbench's loop
is timed ``--repeat`` times, interleaved, and the minimum kept; Vidur once, as its loop takes
seconds to minutes):

- ``loop_s``: kvbench's engine loop (``Engine.run`` up to the last step recorded, before pandas
  builds the tables), event-driven; ``step_by_step_loop_s``: the reference loop on the same
  requests (only with ``--step-by-step``: it takes minutes at 2,048 tokens);
- ``vidur_loop_s``: Vidur's event loop (its simulate() minus writing outputs), and the ratio;
- ``tokens_16x_wall_ratio``: kvbench's loop time at 2,048 output tokens over 128;
- ``loop_peak_mib``: the most memory the loop allocated (tracemalloc, a separate run), and the
  process's peak RSS, which also counts the libraries kvbench imports.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

KV_BUDGET_BYTES = 7424 * 16 * 524_288  # Vidur's planner: 7,424 blocks of 16 Llama-2-7B tokens
COMMON = ["wandb.mode=disabled", "progress=false", "kernel=torch", "workload=lecture_chat",
          f"hardware.kv_budget_bytes={KV_BUDGET_BYTES}"]  # fmt: skip
VLLM = [*COMMON, "scheduler=prefill_first", "allocator=paged", "allocator.block_size_tokens=16",
        "scheduler.max_num_batched_tokens=4096", "preemption=recompute"]  # fmt: skip
#: name -> (Vidur's scheduler, batch cap, kvbench overrides)
CONFIGS = {
    "vllm": ("vllm", 128, [*VLLM, "scheduler.max_num_seqs=128"]),
    "vllm32": ("vllm", 32, [*VLLM, "scheduler.max_num_seqs=32"]),
    "orca": ("orca", 128, [*COMMON, "scheduler=mixed", "allocator=naive", "allocator.s_max_tokens=4096",
                           "scheduler.max_num_seqs=128", "scheduler.max_num_batched_tokens=100000000"]),
}  # fmt: skip
OUTPUTS = (128, 2048)


def build(overrides: list[str], event_driven: bool = True):
    """The engine and the requests of one configuration, ready to run (composition not timed)."""
    import numpy as np

    from kvbench.api import compose
    from kvbench.app.run import setup
    from kvbench.core.request import requests_from_workload
    from kvbench.engine import Engine
    from kvbench.exec.sim import SimExecutor

    cfg, _ = compose(overrides)
    s = setup(cfg)
    requests = requests_from_workload(s.workload_source.generate(np.random.default_rng(int(cfg.seed))), int(cfg.seed))
    return Engine(s.scheduler, SimExecutor(s.cost), event_driven=event_driven), requests


def time_loop(overrides: list[str], event_driven: bool = True) -> tuple[float, int]:
    engine, requests = build(overrides, event_driven)
    record = engine.run(requests)
    return record.sim_wall_s, int(record.steps["num_steps"].sum())


def loop_peak_mib(overrides: list[str]) -> float:
    engine, requests = build(overrides)
    gc.collect()
    tracemalloc.start()
    engine.run(requests)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def run_vidur(runner: str, sched: str, batch_cap: int, num_requests: int, output_tokens: int) -> dict:
    env = {**os.environ, "N": str(num_requests), "QPS": "static", "LENGTHS": "fixed", "PROMPT": "512",
           "DECODE": str(output_tokens), "SCHED": sched, "BLOCK": "16", "BATCH_CAP": str(batch_cap)}  # fmt: skip
    out = subprocess.run(["bash", runner], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--vidur-run", help="a Vidur 0.0.26 runner script (see the module docstring)")
    parser.add_argument("--step-by-step", action="store_true", help="also time the step-by-step reference loop")
    parser.add_argument("--out", type=Path, help="write the report here as JSON, and a Markdown table beside it (.md)")
    args = parser.parse_args(argv)

    report: dict = {"requests": args.requests, "repeat": args.repeat, "configs": {}}
    for name, (sched, batch_cap, base) in CONFIGS.items():
        rows = {}
        for output_tokens in OUTPUTS:
            overrides = [*base, f"workload.num_requests={args.requests}", f"workload.output_tokens={output_tokens}"]
            loops = [time_loop(overrides) for _ in range(args.repeat)]
            row = {"loop_s": min(t for t, _ in loops), "all_loop_s": [round(t, 4) for t, _ in loops],
                   "steps": loops[0][1], "loop_peak_mib": round(loop_peak_mib(overrides), 1)}  # fmt: skip
            if args.step_by_step:
                row["step_by_step_loop_s"] = time_loop(overrides, event_driven=False)[0]
            if args.vidur_run:
                vidur = run_vidur(args.vidur_run, sched, batch_cap, args.requests, output_tokens)
                row.update(vidur_loop_s=vidur["wall_s_event_loop"], vidur_batches=vidur["batches"],
                           vidur_peak_rss_mib=vidur.get("peak_rss_mb"),
                           loop_speedup_vs_vidur=round(vidur["wall_s_event_loop"] / row["loop_s"], 1))  # fmt: skip
            rows[output_tokens] = row
            print(json.dumps({"config": name, "output_tokens": output_tokens, **row}), file=sys.stderr)
        rows["tokens_16x_wall_ratio"] = round(rows[2048]["loop_s"] / rows[128]["loop_s"], 2)
        report["configs"][name] = rows
    report["process_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    report["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        args_text = " ".join("$VIDUR_RUN" if a == args.vidur_run else a for a in (argv or sys.argv[1:]))
        args.out.with_suffix(".md").write_text(markdown(report, f"python benchmarks/loop_speed.py {args_text}"))
    return report


def markdown(report: dict, command: str) -> str:
    """The report as a table a person reads."""
    lines = [
        f"# kvbench's loop against Vidur 0.0.26, {report['requests']:,} requests of 512 prompt tokens",
        "",
        f"Measured {report['measured_at']} with `{command}` (kvbench: best of {report['repeat']}; Vidur: one run).",
        "",
        "| config | output tokens | steps (kvbench / Vidur) | kvbench loop s | Vidur loop s | speed-up | kvbench loop peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rows in report["configs"].items():
        for output_tokens in OUTPUTS:
            row = rows[output_tokens]
            vidur = f"{row['vidur_loop_s']:.2f}" if "vidur_loop_s" in row else "-"
            batches = f"{row['vidur_batches']:,}" if "vidur_batches" in row else "-"
            speedup = f"{row['loop_speedup_vs_vidur']:.1f}x" if "loop_speedup_vs_vidur" in row else "-"
            lines.append(f"| {name} | {output_tokens:,} | {row['steps']:,} / {batches} | {row['loop_s']:.3f} | {vidur} | "
                         f"{speedup} | {row['loop_peak_mib']:.1f} |")  # fmt: skip
    lines += ["", "16x the output tokens (2,048 against 128), kvbench's loop time ratio:", ""]
    lines += [f"- {name}: {rows['tokens_16x_wall_ratio']:.2f}x" for name, rows in report["configs"].items()]
    lines += ["", f"Process peak RSS: {report['process_peak_rss_mib']:.0f} MiB (the libraries kvbench imports included).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
