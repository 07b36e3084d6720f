"""``kvbench bench-kernels``: time every decode kernel across block sizes, batches and contexts.

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
simulator reads them. Methodology: :mod:`kvbench.kernels.timing`; aggregation:
:mod:`kvbench.kernels.bench_report`.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kvbench.config import require, to_dataclass
from kvbench.errors import ConfigError

DTYPE_NAMES = ("float32", "float16", "bfloat16")
#: max |kernel - reference| accepted per dtype at long contexts (outputs are averages of V rows)
OUTPUT_TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}


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
    block_sizes=[8, 16], batch_sizes=[1, 3], context_tokens=[16, 48], num_heads=4, num_kv_heads=2, head_dim=64,
    dtype="float32", warmup_iters=1, timed_iters=2, plan_iters=1, copy_bytes=2**20,
)  # fmt: skip


def _kernel_instance(name: str, options: dict):
    """The registered kernel ``name`` with conf/kernel/<name>.yaml's options plus ``options``."""
    import kvbench.conf
    from kvbench.config import plugin_config
    from kvbench.plugins import lookup

    cls = lookup("kernel", name)
    path = Path(kvbench.conf.__path__[0]) / "kernel" / f"{name}.yaml"
    node = OmegaConf.load(path) if path.is_file() else OmegaConf.create({})
    node = OmegaConf.merge(node, options or {})
    return cls(plugin_config(cls, node, "kernel"))


def _unavailable(kernel, device_type: str) -> str | None:
    reason = getattr(kernel, "unavailable_reason", None)
    if reason is not None:
        return reason(device_type)
    if kernel.requires_cuda and device_type != "cuda":
        return f"kernel={kernel.name} needs a CUDA GPU"
    return None


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


class Runner:
    """Runs the sweep; one row per (kernel, layout, block size, batch, context)."""

    def __init__(self, cfg: BenchKernelsConfig, device) -> None:
        import torch

        self.cfg = cfg
        self.device = device
        self.dtype = getattr(torch, cfg.dtype)
        self.rows: list[dict] = []
        self.started_s = time.perf_counter()
        self.kernels = [_kernel_instance(n, cfg.kernel_options.get(n, {})) for n in cfg.kernels]

    def over_budget(self) -> bool:
        budget_s = self.cfg.time_budget_s
        return budget_s > 0 and time.perf_counter() - self.started_s > budget_s

    def row(self, kernel: str, layout: str, block_size: int, cache, status: str, **measured) -> dict:
        cfg = self.cfg
        row = dict(
            kernel=kernel, layout=layout, block_size_tokens=block_size, batch=cache.batch,
            context_tokens=cache.context_tokens, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim, dtype=cfg.dtype, status=status, bytes_read=cache.bytes_read(),
        )  # fmt: skip
        row.update(measured)
        self.rows.append(row)
        return row

    def measure(self, run, plan=None) -> dict:
        """Times ``run`` (and ``plan``, which returns a fresh ``run``, when given)."""
        from kvbench.kernels.timing import time_iterations_s, time_once_s

        cfg = self.cfg
        plan_s = math.nan
        if plan is not None:
            plan()  # the first plan may load modules or compile: not what the metadata costs per step
            plan_times = [time_once_s(plan, self.device)[1] for _ in range(cfg.plan_iters)]
            plan_s = sorted(plan_times)[len(plan_times) // 2]
        times_s = time_iterations_s(
            run, self.device, warmup_iters=cfg.warmup_iters, timed_iters=cfg.timed_iters, flush_bytes=cfg.flush_l2_bytes
        )
        times_s.sort()
        return dict(plan_s=plan_s, time_median_s=times_s[len(times_s) // 2], time_min_s=times_s[0])

    def check(self, out, args) -> dict:
        """Max |out - reference| over sequences 0 and B-1 (the reference on the whole batch is too big)."""
        if not self.cfg.check_outputs:
            return {}
        from kvbench_plugins.kernels.torch_ref import paged_decode_reference

        query, key_cache, value_cache, block_tables, seq_lens = args
        idx = sorted({0, query.shape[0] - 1})
        ref = paged_decode_reference(query[idx], key_cache, value_cache, block_tables[idx], seq_lens[idx])
        err = float((out[idx].float() - ref.float()).abs().max())
        return dict(max_abs_err=err, output_ok=bool(err <= OUTPUT_TOLERANCE[self.cfg.dtype]))

    def time_kernel(self, kernel, layout: str, block_size: int, cache, args) -> None:
        cfg = self.cfg
        reason = _unavailable(kernel, self.device.type)
        if reason:
            self.row(kernel.name, layout, block_size, cache, f"skipped: {reason}")
            return
        if kernel.name == "torch" and cache.kv_cache_bytes > cfg.torch_max_kv_cache_bytes:
            self.row(kernel.name, layout, block_size, cache, "skipped: torch_max_kv_cache_bytes")
            return
        if self.over_budget():
            self.row(kernel.name, layout, block_size, cache, "skipped: time budget")
            return
        try:
            if hasattr(kernel, "plan_decode"):
                plan = lambda: kernel.plan_decode(*args)  # noqa: E731
                run = plan()
            else:  # a plugin without a separate planning step: everything is kernel time
                plan, run = None, lambda: kernel.decode(*args)  # noqa: E731
            out = run()
            checked = self.check(out, args)
            self.row(kernel.name, layout, block_size, cache, "ok", **self.measure(run, plan), **checked)
        except ConfigError as exc:
            self.row(kernel.name, layout, block_size, cache, f"skipped: {exc}")
        except Exception as exc:  # noqa: BLE001 - one failing point must not end the sweep
            self.row(kernel.name, layout, block_size, cache, f"error: {_first_line(exc)}")
            if self.device.type == "cuda":
                import torch

                torch.cuda.empty_cache()

    def time_sdpa(self, cache) -> None:
        import torch
        import torch.nn.functional as F

        if self.over_budget():
            self.row("sdpa", "contiguous", cache.context_tokens, cache, "skipped: time budget")
            return
        q, k, v = cache.sdpa_operands()
        gqa = self.cfg.num_heads != self.cfg.num_kv_heads
        try:
            with torch.no_grad():
                run = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)  # noqa: E731
                run()
                self.row("sdpa", "contiguous", cache.context_tokens, cache, "ok", **self.measure(run))
        except Exception as exc:  # noqa: BLE001
            self.row("sdpa", "contiguous", cache.context_tokens, cache, f"error: {_first_line(exc)}")

    def sweep(self) -> None:
        import torch

        from kvbench.kernels.timing import BenchCache

        cfg = self.cfg
        # contexts and batches ascending: if the time budget runs out, the small points are done for
        # every kernel and block size, and the largest allocation comes last
        for context in sorted(cfg.context_tokens):
            for batch in sorted(cfg.batch_sizes):
                kv_bytes = 2 * batch * context * cfg.num_kv_heads * cfg.head_dim * self.dtype.itemsize
                if kv_bytes > cfg.max_kv_cache_bytes:
                    print(f"bench-kernels: skip B={batch} ctx={context}: {kv_bytes / 1e9:.1f} GB > max_kv_cache_bytes")
                    continue
                cache = BenchCache.random(batch, context, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, self.dtype,
                                          self.device, seed=cfg.seed)  # fmt: skip
                for block_size in sorted(cfg.block_sizes):
                    args = cache.paged(block_size, cfg.shuffle_blocks, seed=cfg.seed)
                    for kernel in self.kernels:
                        self.time_kernel(kernel, "paged", block_size, cache, args)
                if cfg.contiguous:
                    for kernel in self.kernels:
                        self.time_kernel(kernel, "contiguous", context, cache, cache.contiguous())
                if cfg.sdpa_baseline:
                    self.time_sdpa(cache)
                print(f"bench-kernels: B={batch} ctx={context} done at {time.perf_counter() - self.started_s:.0f}s",
                      flush=True)  # fmt: skip
                del cache, args
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()


def run(cfg: BenchKernelsConfig, hardware, out_dir: Path, command: str) -> dict:
    """Run the sweep and write everything into ``out_dir``; returns the paths written."""
    import pandas as pd
    import torch

    from kvbench.kernels.bench_report import COLUMNS, plot_bandwidth, write_calibrations
    from kvbench.kernels.timing import copy_bandwidth_bytes_per_s

    device = torch.device("cpu" if cfg.dry_run else "cuda")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    if device.type == "cuda" and hardware.name.split("-")[0].lower() not in device_name.lower():
        print(f"bench-kernels: warning: hardware={hardware.name} but the GPU is {device_name!r}; "
              "efficiencies are fractions of the hardware config's bandwidth", file=sys.stderr)  # fmt: skip
    copy_bytes_per_s = copy_bandwidth_bytes_per_s(device, cfg.copy_bytes)
    print(f"bench-kernels: {device_name}; measured copy bandwidth {copy_bytes_per_s / 1e9:.1f} GB/s "
          f"(spec {hardware.hbm_bandwidth_bytes_per_s / 1e9:.0f} GB/s for hardware={hardware.name})")  # fmt: skip

    runner = Runner(cfg, device)
    runner.sweep()
    df = pd.DataFrame(runner.rows).reindex(columns=COLUMNS)
    df["achieved_bytes_per_s"] = df["bytes_read"] / df["time_median_s"]
    df["fraction_of_copy_bw"] = df["achieved_bytes_per_s"] / copy_bytes_per_s
    df["efficiency_vs_spec"] = df["achieved_bytes_per_s"] / hardware.hbm_bandwidth_bytes_per_s

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "results.csv"
    df.to_csv(csv_path, index=False)
    meta = dict(
        measured_on=device_name, command=command, date=time.strftime("%Y-%m-%d %H:%M:%S"),
        copy_bandwidth_bytes_per_s=copy_bytes_per_s, spec_hbm_bandwidth_bytes_per_s=hardware.hbm_bandwidth_bytes_per_s,
        shape=dict(num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, dtype=cfg.dtype),
        batch_sizes=list(cfg.batch_sizes), context_tokens=list(cfg.context_tokens), dry_run=cfg.dry_run,
    )  # fmt: skip
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    calibrations = write_calibrations(
        df, out_dir / "calibrations", hardware.name, hardware.hbm_bandwidth_bytes_per_s, meta
    )
    plots = plot_bandwidth(df, out_dir)
    if cfg.write_calibration:
        from kvbench.calibration import calibration_path

        for path in calibrations:
            target = calibration_path(hardware.name, path.stem)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            print(f"bench-kernels: wrote {target}")
    counts = df["status"].str.split(":").str[0].value_counts().to_dict()
    print(f"bench-kernels: {len(df)} rows {counts} -> {out_dir}")
    return dict(csv=csv_path, calibrations=calibrations, plots=plots)


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="bench_kernels")
def _hydra_main(node: DictConfig) -> None:
    from kvbench.hardware import HardwareSpec

    try:
        data = OmegaConf.to_container(node, resolve=True)
        hardware = to_dataclass(HardwareSpec, data.pop("hardware"), "hardware")
        if data.get("dry_run"):
            data.update(DRY_RUN_SHAPES)
        cfg = to_dataclass(BenchKernelsConfig, data, "bench_kernels")
        if not cfg.dry_run:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(
                    "kvbench bench-kernels needs a CUDA GPU (torch sees none); "
                    "dry_run=true runs tiny shapes on CPU to test the output path"
                )
        command = " ".join(["kvbench bench-kernels", *sys.argv[1:]])
        run(cfg, hardware, Path(HydraConfig.get().runtime.output_dir), command)
    except ConfigError as exc:
        print(f"kvbench bench-kernels: error: {exc}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """Entry point for ``kvbench bench-kernels`` (``sys.argv[1:]`` holds only Hydra overrides)."""
    _hydra_main()


if __name__ == "__main__":
    main()
