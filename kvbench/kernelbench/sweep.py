"""The kernel benchmark's sweep: one row per (kernel, layout, block size, batch, context).

For each (batch, context) it allocates one random cache (:class:`~kvbench.kernelbench.timing.BenchCache`),
views it at every block size, and times every kernel plugin on it; see :mod:`kvbench.kernelbench.bench`
for the command and :mod:`kvbench.kernelbench.timing` for the method. A point that fails (an error, an
unavailable kernel, the time budget) becomes a row with that status instead of ending the sweep.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from kvbench.errors import ConfigError

#: max |kernel - reference| accepted per dtype at long contexts (outputs are averages of V rows)
OUTPUT_TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}


@dataclass(frozen=True)
class Point:
    """One (batch, context) of the sweep and the bytes a decode step over it must read."""

    batch: int
    context_tokens: int
    kv_cache_bytes: int
    #: every K and V row of every sequence, and the query
    bytes_read: int


def _kernel_instance(name: str, options: dict):
    """The registered kernel ``name`` with conf/kernel/<name>.yaml's options plus ``options``."""
    import kvbench.conf
    from kvbench.app.config import plugin_config
    from kvbench.plugins import lookup

    cls = lookup("kernel", name)
    path = Path(kvbench.conf.__path__[0]) / "kernel" / f"{name}.yaml"
    node = OmegaConf.load(path) if path.is_file() else OmegaConf.create({})
    node = OmegaConf.merge(node, options or {})
    return cls(plugin_config(cls, node, "kernel"))


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


class Runner:
    """Runs the sweep; one row per (kernel, layout, block size, batch, context)."""

    def __init__(self, cfg, device) -> None:
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

    def row(self, kernel, layout: str, block_size: int, point: Point, status: str, **measured) -> dict:
        cfg = self.cfg
        options = getattr(kernel, "config", None)
        row = dict(
            kernel=getattr(kernel, "name", kernel),
            layout=layout,
            block_size_tokens=block_size,
            batch=point.batch,
            context_tokens=point.context_tokens,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            dtype=cfg.dtype,
            status=status,
            bytes_read=point.bytes_read,
            kernel_config=" ".join(f"{k}={v}" for k, v in vars(options).items()) if options is not None else "",
        )
        row.update(measured)
        self.rows.append(row)
        return row

    def measure(self, run, plan=None) -> dict:
        """Times ``run`` (and ``plan``, which returns a fresh ``run``, when given)."""
        from kvbench.kernelbench.timing import time_iterations_s, time_once_s

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
        from kvbench.kernels.reference import paged_decode_reference

        query, key_cache, value_cache, block_tables, seq_lens = args
        idx = sorted({0, query.shape[0] - 1})
        ref = paged_decode_reference(query[idx], key_cache, value_cache, block_tables[idx], seq_lens[idx])
        err = float((out[idx].float() - ref.float()).abs().max())
        return dict(max_abs_err=err, output_ok=bool(err <= OUTPUT_TOLERANCE[self.cfg.dtype]))

    def time_kernel(self, kernel, layout: str, block_size: int, point: Point, args) -> None:
        cfg = self.cfg
        reason = kernel.unavailable_reason(self.device.type)
        if reason:
            self.row(kernel, layout, block_size, point, f"skipped: {reason}")
            return
        if kernel.name == "torch" and point.kv_cache_bytes > cfg.torch_max_kv_cache_bytes:
            self.row(kernel, layout, block_size, point, "skipped: torch_max_kv_cache_bytes")
            return
        if self.over_budget():
            self.row(kernel, layout, block_size, point, "skipped: time budget")
            return
        try:
            plan = lambda: kernel.plan_decode(*args)  # noqa: E731
            run = plan()
            out = run()
            checked = self.check(out, args)
            self.row(kernel, layout, block_size, point, "ok", **self.measure(run, plan), **checked)
        except ConfigError as exc:
            self.row(kernel, layout, block_size, point, f"skipped: {exc}")
        except Exception as exc:  # noqa: BLE001 - one failing point must not end the sweep
            self.row(kernel, layout, block_size, point, f"error: {_first_line(exc)}")
            if self.device.type == "cuda":
                import torch

                torch.cuda.empty_cache()

    def time_sdpa(self, point: Point, cache) -> None:
        import torch
        import torch.nn.functional as F

        if self.over_budget():
            self.row("sdpa", "contiguous", point.context_tokens, point, "skipped: time budget")
            return
        q, k, v = cache.sdpa_operands()
        gqa = self.cfg.num_heads != self.cfg.num_kv_heads
        try:
            with torch.no_grad():
                run = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)  # noqa: E731
                run()
                self.row("sdpa", "contiguous", point.context_tokens, point, "ok", **self.measure(run))
        except Exception as exc:  # noqa: BLE001
            self.row("sdpa", "contiguous", point.context_tokens, point, f"error: {_first_line(exc)}")

    def skip_point(self, point: Point, reason: str) -> None:
        """Record every measurement of ``point`` as skipped, without allocating its cache."""
        for block_size in sorted(self.cfg.block_sizes):
            for kernel in self.kernels:
                self.row(kernel, "paged", block_size, point, f"skipped: {reason}")
        for kernel in self.kernels if self.cfg.contiguous else ():
            self.row(kernel, "contiguous", point.context_tokens, point, f"skipped: {reason}")
        if self.cfg.sdpa_baseline:
            self.row("sdpa", "contiguous", point.context_tokens, point, f"skipped: {reason}")

    def sweep(self, advance: Callable[[int], None] = lambda n: None) -> None:
        """Every point, smallest first; ``advance(1)`` after each (progress: a bar or a log's line)."""
        import torch

        from kvbench.kernelbench.timing import BenchCache

        cfg = self.cfg
        elem_bytes = self.dtype.itemsize
        # contexts and batches ascending: if the time budget runs out, the small points are done for
        # every kernel and block size, and the largest allocation comes last
        for context in sorted(cfg.context_tokens):
            for batch in sorted(cfg.batch_sizes):
                kv_bytes = 2 * batch * context * cfg.num_kv_heads * cfg.head_dim * elem_bytes
                point = Point(batch, context, kv_bytes, kv_bytes + batch * cfg.num_heads * cfg.head_dim * elem_bytes)
                if kv_bytes > cfg.max_kv_cache_bytes:
                    self.skip_point(point, "max_kv_cache_bytes")
                    advance(1)
                    continue
                if self.over_budget():
                    self.skip_point(point, "time budget")
                    advance(1)
                    continue
                cache = BenchCache.random(
                    batch,
                    context,
                    cfg.num_heads,
                    cfg.num_kv_heads,
                    cfg.head_dim,
                    self.dtype,
                    self.device,
                    seed=cfg.seed,
                )
                for block_size in sorted(cfg.block_sizes):
                    args = cache.paged(block_size, cfg.shuffle_blocks, seed=cfg.seed)
                    for kernel in self.kernels:
                        self.time_kernel(kernel, "paged", block_size, point, args)
                if cfg.contiguous:
                    for kernel in self.kernels:
                        self.time_kernel(kernel, "contiguous", context, point, cache.contiguous())
                if cfg.sdpa_baseline:
                    self.time_sdpa(point, cache)
                print(
                    f"bench-kernels: B={batch} ctx={context} done at {time.perf_counter() - self.started_s:.0f}s",
                    flush=True,
                )
                advance(1)
                del cache, args
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
