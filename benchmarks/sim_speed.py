"""How fast the simulator is: simulated requests per wall-clock second.

    python benchmarks/sim_speed.py                    # 10,000 lecture_chat requests, paged, block 16
    python benchmarks/sim_speed.py --requests 2000 --repeat 5 allocator=naive

The reference is Vidur, which needs about 30 s for 10,000 requests (so about 333 requests/s);
the result is printed as a ratio to it. Wall time counts the engine loop only (the same figure a
run reports as ``sim_wall_s``), not Python start-up or config composition. The best of
``--repeat`` runs is reported, since this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import sys

VIDUR_S_PER_10K_REQUESTS = 30.0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="extra kvbench overrides, e.g. allocator=naive")
    args = parser.parse_args(argv)

    from kvbench.api import run

    overrides = [
        "workload=lecture_chat", f"workload.num_requests={args.requests}", "allocator=paged",
        "allocator.block_size_tokens=16", "kernel=torch", "progress=false", "wandb.mode=disabled",
        *args.overrides,
    ]  # fmt: skip
    walls = [run(overrides).summary["sim_wall_s"] for _ in range(args.repeat)]
    best_s = min(walls)
    vidur_s = VIDUR_S_PER_10K_REQUESTS * args.requests / 10_000
    report = {
        "requests": args.requests,
        "overrides": args.overrides,
        "best_wall_s": round(best_s, 3),
        "all_wall_s": [round(w, 3) for w in walls],
        "simulated_requests_per_wall_s": round(args.requests / best_s, 1),
        "speedup_vs_vidur": round(vidur_s / best_s, 1),
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
