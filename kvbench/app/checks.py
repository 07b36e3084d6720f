"""Checks of a whole run's config that belong to no one section: the seed, keys Hydra's ``+`` adds,
the calibration folder, and whether the run fits in this machine's memory."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kvbench.app.config import INT64_MAX, KvbenchConfig
from kvbench.errors import ConfigError, require


def check_seed(seed) -> None:
    # numpy's generator takes any integer >= 0, but the seed is also an int64 column of the results
    require(
        isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= INT64_MAX,
        "seed",
        seed,
        "use an integer from 0 to 2**63-1",
    )


#: kvbench's resident memory per simulated request, in bytes, by kind of workload: the growth of
#: the peak RSS of a whole ``kvbench`` run (simulation, Parquet, CSV and figures written; W&B
#: disabled) between two sizes, divided by the difference, measured by
#: ``benchmarks/memory_per_request.py`` (benchmarks/results/memory_per_request.md, and
#: memory_per_request-200000-1000000.md for the sizes a million-request run reaches; x86-64 Linux,
#: Python 3.11), each rounded up by about a quarter for what other versions and other workloads of
#: the kind may add:
MEMORY_BYTES_PER_REQUEST = {
    #: a generated workload. Between 200,000 and 1,000,000 requests: lecture_chat with every
    #: request at t = 0, 525 B (292 MB -> 711 MB, 2026-12-04: the requests waiting behind the
    #: queue's head are a count; 923 B when each waited as its own group), sharegpt_like at Poisson
    #: rate 417 B (2026-12-03). Between 20,000 and 100,000 they measured 851 and 223 B (2026-12-03);
    #: 1,776 and 4,340 B while the step table was held (2026-12-01)
    "synthetic": 700,
    #: a replayed trace file, its rows parsed, then simulated: the Azure 2023 trace 393 B between
    #: 200,000 and 1,000,000 requests (331 B between 20,000 and 100,000). A trace may be replayed
    #: all at once too, so it takes the generated workload's bound
    "trace": 700,
    #: a generated workload with a shared prefix under prefix caching (lecture_chat with 256 shared
    #: tokens): the prefix hashes, the cache's block keys and the offline hit-rate bounds, 12,663 B
    #: (12,325 B on 2026-12-01)
    "prefix_cached": 16_000,
    #: a Mooncake trace (hash ids, prompts of about 12,000 tokens) under prefix caching: the same
    #: costs per block of prompt, so far more per request: 128,228 B (112,194 B on 2026-12-01)
    "prefix_cached_trace": 160_000,
}
#: and per branch beyond a request's first (workload.num_branches=4: 1,027 B per request, 176 B
#: above one branch, 59 B per extra branch; 290 B while the step table was held)
MEMORY_BYTES_PER_EXTRA_BRANCH = 400
#: what a kvbench process holds before its first request (Python, numpy, pandas, pyarrow, Hydra,
#: matplotlib: about 170 MB at a run's start; torch is not imported in mode=sim)
MEMORY_BASE_BYTES = 250_000_000


def _cgroup_headroom_bytes(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """What this process's cgroup (a container's or a CI job's memory limit) still allows: its
    limit less its usage; None without a limit. Version 2 (``memory.max``) or version 1
    (``memory.limit_in_bytes``), whichever the process is in."""
    try:
        entries = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for entry in entries:
        parts = entry.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0":  # v2: one unified hierarchy (under unified/ on a hybrid v1 + v2 host)
            base = root / "unified" if (root / "unified").is_dir() else root
            folder, names = base / path.lstrip("/"), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            folder, names = root / "memory" / path.lstrip("/"), ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        try:
            limit_text = (folder / names[0]).read_text().strip()
            usage = int((folder / names[1]).read_text().strip())
        except (OSError, ValueError):
            continue
        # "max" (v2) and a huge number (v1, rounded to pages) both mean no limit
        if limit_text.isdigit() and int(limit_text) < 1 << 60:
            return max(0, int(limit_text) - usage)
    return None


def _available_memory_bytes() -> int | None:
    """Memory the machine can give this run now, the tighter of the kernel's MemAvailable and the
    cgroup's headroom; None where the platform says neither.

    Linux's MemAvailable counts reclaimable page cache too; free pages alone (SC_AVPHYS_PAGES, the
    fallback) would refuse runs that fit on a machine whose cache fills its memory. In a container
    the cgroup limit binds first: MemAvailable is the host's."""
    found = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = int(line.split()[1]) * 1024  # in kB
                break
    except (OSError, ValueError, IndexError):
        pass
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            found = None
    headroom = _cgroup_headroom_bytes()
    if headroom is not None:
        found = headroom if found is None else min(found, headroom)
    return found


def memory_estimate(num_requests: int, *, trace: bool, branches: int, prefix_cached: bool) -> tuple[int, str]:
    """Bytes a run of ``num_requests`` needs, and the arithmetic in words."""
    kind = ("prefix_cached_trace" if trace else "prefix_cached") if prefix_cached else "trace" if trace else "synthetic"
    per = MEMORY_BYTES_PER_REQUEST[kind] + (branches - 1) * MEMORY_BYTES_PER_EXTRA_BRANCH
    what = {
        "synthetic": "a generated request",
        "trace": "a replayed trace request",
        "prefix_cached": "a request with a shared prefix under prefix caching",
        "prefix_cached_trace": "a trace request with prefix hashes under prefix caching",
    }[kind]
    words = f"{MEMORY_BASE_BYTES / 1e6:,.0f} MB + {num_requests:,} x {per:,} B ({what}"
    words += f", {branches} branches" if branches > 1 else ""
    return MEMORY_BASE_BYTES + num_requests * per, words + "; measured)"


def check_memory(source_cls, source_config, allocator, enabled: bool = True) -> None:
    """Refuse up front, before the workload is read or generated, a run that cannot fit in memory,
    rather than exhausting it part-way. A trace's rows are counted first (a fast scan of the file)."""
    if not enabled:
        return
    planned = getattr(source_cls, "planned_requests", None)
    num_requests = planned(source_config) if planned is not None else getattr(source_config, "num_requests", None)
    if num_requests is None:
        return
    branches = int(getattr(source_config, "num_branches", 1) or 1)
    trace = getattr(source_cls, "replays_a_file", False)
    prefix_cached = bool(getattr(allocator.capabilities, "caches_prefixes", False)) and bool(
        getattr(source_cls, "carries_prefix_hashes", lambda config: False)(source_config)
    )
    estimate, words = memory_estimate(int(num_requests), trace=trace, branches=branches, prefix_cached=prefix_cached)
    given = getattr(source_config, "num_requests", None)
    what = (
        f"workload.num_requests={given}"
        if given is not None
        else f"the {int(num_requests):,} rows of workload.path={getattr(source_config, 'path', '?')}"
    )
    if branches > 1:
        what += f" with workload.num_branches={branches}"
    refuse_beyond_memory(estimate, what, words)


def refuse_beyond_memory(estimate_bytes: int, what: str, words: str) -> None:
    """One line, before the work starts, when ``what`` needs more memory than the machine has
    available (``words``: the estimate's arithmetic); nothing where the platform does not say."""
    available = _available_memory_bytes()
    if available is not None and estimate_bytes > available:
        raise ConfigError(
            f"{what} needs about {estimate_bytes / 1e9:,.1f} GB of memory ({words}), more than the "
            f"{available / 1e9:,.1f} GB this machine has available: use fewer requests "
            "(workload.num_requests=<n>), or check_memory=false to run anyway"
        )


def check_real_model_memory(model) -> None:
    """Refuse ``mode=real`` for a model whose weights cannot be built here: transformers creates
    them in float32 (4 bytes per parameter) before kvbench casts them to the run's dtype, so about
    ``4 + dtype bytes`` per parameter are held at once."""
    available = _available_memory_bytes()
    if available is None:
        return
    needed = model.num_params * (4 + model.dtype_bytes)
    if needed > available:
        raise ConfigError(
            f"mode=real builds {model.name}'s {model.num_params / 1e9:,.2f}e9 parameters, about {needed / 1e9:,.1f} GB "
            f"while initialising, more than the {available / 1e9:,.1f} GB this machine has available: pick a "
            "smaller model (model=tiny-llama) or a machine with more memory"
        )


def check_top_level_keys(cfg: DictConfig) -> None:
    """Refuse a top-level key the schema does not have: Hydra's ``+foo=1`` adds one, silently."""
    known = [f.name for f in dataclasses.fields(KvbenchConfig)]
    for key in cfg.keys():
        if key not in known:
            raise ConfigError(
                f"{key}={OmegaConf.select(cfg, str(key))!r} is not a kvbench config key; "
                f"the top-level keys are: {', '.join(known)}"
            )


def calibration_dir_path(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    require(
        path.is_dir(),
        "calibration_dir",
        value,
        "no such folder: give a folder of <hardware>/<kernel>.json files, or null for kvbench's own",
    )
    return path
