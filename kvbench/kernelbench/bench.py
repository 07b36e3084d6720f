"""The kernel benchmark (``kvbench bench-kernels``, :mod:`kvbench.commands.bench_kernels`): time
every decode kernel across block sizes, batches and contexts.

    kvbench bench-kernels                                   # the full sweep on a CUDA GPU
    kvbench bench-kernels kernels=[triton] batch_sizes=[64] # a slice of it
    kvbench bench-kernels hardware=h100-sxm write_calibration=true
    kvbench bench-kernels dry_run=true                      # tiny shapes on CPU: tests the output path

For each kernel x block size x batch x context (and each kernel on the contiguous layout, one block
per sequence, plus torch SDPA on a contiguous cache as the baseline) it records the metadata
preparation time, the median cold-L2 kernel time, and the achieved bandwidth (KV and query bytes
read / time) as a fraction of the measured copy bandwidth and of the hardware config's spec
bandwidth. It writes ``results.csv``, ``bandwidth_<kernel>.png`` and
``calibrations/<hardware>/<kernel>.json`` into the run folder (``results/kernels/<timestamp>/``);
``write_calibration=true`` also copies the calibrations into ``kvbench/calibrations/``, where the
simulator reads them. Methodology: :mod:`kvbench.kernelbench.timing`; aggregation:
:mod:`kvbench.kernelbench.report`; the sweep itself:
:mod:`kvbench.kernelbench.sweep`.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore

from kvbench.errors import require
from kvbench.io.atomic import COMPLETE, check_targets, mark_complete, write_file, write_json

DTYPE_NAMES = ("float32", "float16", "bfloat16")


@dataclass
class BenchKernelsConfig:
    #: the hardware config (conf/hardware/<name>.yaml): names the calibration folder and gives the spec
    #: HBM bandwidth that efficiencies are fractions of; it should be the GPU this runs on
    hardware: Any = None
    #: kernel plugins to time (names registered in the ``kernel`` group)
    kernels: list = field(default_factory=lambda: ["triton", "flashinfer", "torch"])
    #: per-kernel option overrides on top of conf/kernel/<name>.yaml, e.g. {triton: {tile_tokens: 32}}
    kernel_options: dict = field(default_factory=dict)
    block_sizes: list = field(default_factory=lambda: [8, 16, 32, 64, 128, 256])
    batch_sizes: list = field(default_factory=lambda: [1, 16, 64, 256])
    context_tokens: list = field(default_factory=lambda: [512, 4096, 16384])
    #: also time each kernel with one block per sequence (the calibration's "contiguous" entry)
    contiguous: bool = True
    #: also time torch scaled_dot_product_attention on a contiguous cache (the baseline)
    sdpa_baseline: bool = True
    #: attention shape of one layer; the default is Llama-2-7B's (the lecture's model)
    num_heads: int = 32
    num_kv_heads: int = 32
    head_dim: int = 128
    dtype: str = "float16"
    #: hand blocks out in random order, as a long-running allocator's free list does
    shuffle_blocks: bool = True
    warmup_iters: int = 3
    timed_iters: int = 20
    #: metadata preparations timed (after one untimed call) for plan_s
    plan_iters: int = 3
    #: bytes overwritten before every timed iteration to evict the L2 (H200: 60 MB of L2)
    flush_l2_bytes: int = 256 * 2**20
    #: buffer size for the copy-bandwidth measurement
    copy_bytes: int = 2 * 2**30
    #: skip (and record) points whose KV cache is larger than this
    max_kv_cache_bytes: float = 100e9
    #: the torch reference gathers a float32 copy of the cache: skip it above this cache size
    torch_max_kv_cache_bytes: float = 2e9
    #: compare sequences 0 and B-1 of every output with the torch reference
    check_outputs: bool = True
    #: stop starting new measurements after this many seconds (0: no limit); the rest are recorded as skipped
    time_budget_s: float = 0.0
    #: tiny shapes on CPU, to exercise the CSV / plot / calibration path without a GPU
    dry_run: bool = False
    #: also copy the calibration files into kvbench/calibrations/<hardware>/ for the simulator
    write_calibration: bool = False
    seed: int = 0

    def validate(self) -> None:
        require(bool(self.kernels), "kernels", self.kernels, "name at least one kernel")
        for key in ("block_sizes", "batch_sizes", "context_tokens"):
            values = getattr(self, key)
            require(bool(values) and all(int(v) >= 1 for v in values), key, values, "use a list of positive integers")
        largest_block = max(self.block_sizes)
        require(
            all(c % largest_block == 0 for c in self.context_tokens),
            "context_tokens",
            self.context_tokens,
            f"each context must be a multiple of the largest block size ({largest_block})",
        )
        require(self.dtype in DTYPE_NAMES, "dtype", self.dtype, f"choose one of {', '.join(DTYPE_NAMES)}")
        require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", self.num_kv_heads, "must divide num_heads")
        require(self.timed_iters >= 1, "timed_iters", self.timed_iters, "use >= 1")


ConfigStore.instance().store(name="bench_kernels_schema", node=BenchKernelsConfig)

#: what dry_run=true replaces: small enough for Triton's CPU interpreter
DRY_RUN_SHAPES = dict(
    block_sizes=[8, 16],
    batch_sizes=[1, 3],
    context_tokens=[16, 48],
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    dtype="float32",
    warmup_iters=1,
    timed_iters=2,
    plan_iters=1,
    copy_bytes=2**20,
)


def run(cfg: BenchKernelsConfig, hardware, out_dir: Path, command: str) -> dict:
    """Run the sweep and write everything into ``out_dir``; returns the paths written."""
    import pandas as pd
    import torch

    from kvbench.kernelbench.report import COLUMNS, plot_bandwidth, write_calibrations
    from kvbench.kernelbench.sweep import Runner
    from kvbench.kernelbench.timing import copy_bandwidth_bytes_per_s

    # a FIFO, a device or a folder where a result goes: said before the GPU's minutes, not after
    check_targets(
        out_dir, ("results.csv", "meta.json", COMPLETE), "remove it or write elsewhere with hydra.run.dir=<folder>"
    )
    device = torch.device("cpu" if cfg.dry_run else "cuda")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    if device.type == "cuda" and hardware.name.split("-")[0].lower() not in device_name.lower():
        print(
            f"bench-kernels: warning: hardware={hardware.name} but the GPU is {device_name!r}; "
            "efficiencies are fractions of the hardware config's bandwidth",
            file=sys.stderr,
        )
    copy_bytes_per_s = copy_bandwidth_bytes_per_s(device, cfg.copy_bytes)
    print(
        f"bench-kernels: {device_name}; measured copy bandwidth {copy_bytes_per_s / 1e9:.1f} GB/s "
        f"(spec {hardware.hbm_bandwidth_bytes_per_s / 1e9:.0f} GB/s for hardware={hardware.name})"
    )

    from kvbench.app.progress import progress_bar

    runner = Runner(cfg, device)
    points = len(cfg.context_tokens) * len(cfg.batch_sizes)
    with progress_bar(points, "bench-kernels", enabled=True, unit="points") as advance:
        runner.sweep(advance)
    df = pd.DataFrame(runner.rows).reindex(columns=COLUMNS)
    df["achieved_bytes_per_s"] = df["bytes_read"] / df["time_median_s"]
    df["fraction_of_copy_bw"] = df["achieved_bytes_per_s"] / copy_bytes_per_s
    df["efficiency_vs_spec"] = df["achieved_bytes_per_s"] / hardware.hbm_bandwidth_bytes_per_s

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "results.csv"
    write_file(csv_path, lambda tmp: df.to_csv(tmp, index=False))
    meta = dict(
        measured_on=device_name,
        command=command,
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        copy_bandwidth_bytes_per_s=copy_bytes_per_s,
        spec_hbm_bandwidth_bytes_per_s=hardware.hbm_bandwidth_bytes_per_s,
        shape=dict(num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, dtype=cfg.dtype),
        batch_sizes=list(cfg.batch_sizes),
        context_tokens=list(cfg.context_tokens),
        dry_run=cfg.dry_run,
    )
    write_json(out_dir / "meta.json", meta)
    calibrations = write_calibrations(
        df, out_dir / "calibrations", hardware.name, hardware.hbm_bandwidth_bytes_per_s, meta
    )
    plots = plot_bandwidth(df, out_dir)
    if cfg.write_calibration:
        from kvbench.specs.calibration import calibration_path

        for path in calibrations:
            target = calibration_path(hardware.name, path.stem)
            target.parent.mkdir(parents=True, exist_ok=True)
            write_file(target, lambda tmp, source=path: shutil.copyfile(source, tmp))  # the sim never reads half a file
            print(f"bench-kernels: wrote {target}")
    files = [csv_path, out_dir / "meta.json", *calibrations, *plots]
    mark_complete(out_dir, [str(f.relative_to(out_dir)) for f in files])
    counts = df["status"].str.split(":").str[0].value_counts().to_dict()
    print(f"bench-kernels: {len(df)} rows {counts} -> {out_dir}")
    return dict(csv=csv_path, calibrations=calibrations, plots=plots)
