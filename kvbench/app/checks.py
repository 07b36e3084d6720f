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
    require(isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= INT64_MAX, "seed", seed,
            "use an integer from 0 to 2**63-1")  # fmt: skip


#: kvbench's resident memory per simulated request, in bytes: the largest of three workloads,
#: measured as the growth of the peak RSS (``ru_maxrss``) of a whole ``kvbench`` run (simulation,
#: Parquet, CSV and figures written; wandb disabled) from 10^4 to 10^5 requests, divided by 90,000:
#: workload=lecture_chat 1,626 B (1,994 B from 10^5 to 10^6), exercise2_mix 1,977 B, sharegpt_like
#: (Poisson arrivals, many more steps) 4,181 B (x86-64 Linux, Python 3.11, numpy 2, pandas 2).
MEMORY_BYTES_PER_REQUEST = 4181
#: and per branch beyond a request's first: lecture_chat with workload.num_branches=4 measured the
#: same way takes 2,920 B per request, (2,920 - 1,626) / 3 = 431 B per extra branch
MEMORY_BYTES_PER_EXTRA_BRANCH = 431


def _available_memory_bytes() -> int | None:
    """Memory the machine can give this run now; None where the platform does not say.

    Linux's MemAvailable counts reclaimable page cache too; free pages alone (SC_AVPHYS_PAGES, the
    fallback) would refuse runs that fit on a machine whose cache fills its memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(workload_source) -> None:
    """Refuse up front a run that cannot fit in memory, rather than exhausting it part-way."""
    num_requests = getattr(workload_source.config, "num_requests", None)
    available = _available_memory_bytes()
    if num_requests is None or available is None:
        return
    branches = int(getattr(workload_source.config, "num_branches", 1) or 1)
    estimate = num_requests * (MEMORY_BYTES_PER_REQUEST + (branches - 1) * MEMORY_BYTES_PER_EXTRA_BRANCH)
    if estimate > available:
        what, per = f"workload.num_requests={num_requests}", f"{MEMORY_BYTES_PER_REQUEST:,} B per simulated request"
        if branches > 1:
            what += f" with workload.num_branches={branches}"
            per += f" + {MEMORY_BYTES_PER_EXTRA_BRANCH:,} B per extra branch"
        raise ConfigError(
            f"{what} needs about {estimate / 1e9:,.1f} GB of memory ({per}, measured), more than the "
            f"{available / 1e9:,.1f} GB this machine has available: use fewer requests"
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
            raise ConfigError(f"{key}={OmegaConf.select(cfg, str(key))!r} is not a kvbench config key; "
                              f"the top-level keys are: {', '.join(known)}")  # fmt: skip


def calibration_dir_path(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    require(path.is_dir(), "calibration_dir", value,
            "no such folder: give a folder of <hardware>/<kernel>.json files, or null for kvbench's own")  # fmt: skip
    return path
