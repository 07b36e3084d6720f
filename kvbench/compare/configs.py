"""Resolved configs as compared: flattened to dotted keys, less the keys that cannot change a number."""

from __future__ import annotations

import json
from typing import Any

#: config keys (and everything under them) that change only the display, where files go or the
#: logging: two runs differing only in these computed the same numbers
IGNORED_KEYS = ("progress", "check_memory", "output", "wandb", "hydra")


#: keys added to kvbench's config after results were first written, with the value that does
#: what runs did before the key existed: a folder written without the key compares as having it
#: at this value (so a gate across kvbench versions still matches its jobs)
ADDED_KEY_DEFAULTS: dict[str, Any] = {
    "engine.name": "kvbench",
    "engine.version": None,
    "engine.null_block": False,
    "engine.cache_duplicate_blocks": False,
    # null: the calibration's per-step overhead, as every run before the key
    "engine.step_overhead_s": None,
    "scheduler.queue": "fcfs",
    "scheduler.watermark_in_blocks": False,
    "scheduler.full_prompt_admission": False,
    "scheduler.long_prefill_token_threshold": 0,
    "scheduler.decodes_in_budget": False,
    "scheduler.step_seq_cap": False,
    "scheduler.head_only_chunking": False,
    # the paged allocator's (on another allocator's config both sides get it alike: no difference)
    "allocator.cache_generated_blocks": False,
    "allocator.cache_duplicate_blocks": False,
    # the paged allocator's host tier for evicted prefix blocks: off
    "allocator.host_cache_bytes": 0,
    "allocator.host_reload": "overlapped",
    # the synthetic source's closed loop: the whole first wave at t=0
    "workload.first_wave_window_s": 0.0,
    # one engine, as every run was before deployment=disagg
    "deployment.name": "aggregated",
}

#: keys only a disaggregated run reads (its workers, router and KV link): an aggregated run's
#: numbers cannot depend on them, so they are left out of its comparison (and a folder written
#: before they existed still matches a fresh run)
DISAGG_ONLY_KEYS = (
    "router",
    "deployment.prefill_workers",
    "deployment.decode_workers",
    "deployment.transfer",
    "deployment.link",
    "deployment.link_bytes_per_s",
    "deployment.link_latency_s",
    "deployment.prefill",
    "deployment.decode",
    "hardware.nvlink_bytes_per_s",
    "hardware.nvlink_latency_s",
    "hardware.nvlink_domain_gpus",
    "hardware.network_bytes_per_s",
    "hardware.network_latency_s",
)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: configs compared key by key."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def is_ignored(key: str, ignored: tuple[str, ...] = IGNORED_KEYS) -> bool:
    return any(key == prefix or key.startswith(f"{prefix}.") for prefix in ignored)


def comparable(config: dict[str, Any], ignored: tuple[str, ...] = IGNORED_KEYS) -> dict[str, Any]:
    """The flattened config without the ignored keys, values as ``config.json`` spells them."""
    flat = flatten(json.loads(json.dumps(config, default=str)))
    if any(key.startswith("scheduler.") for key in flat):  # a run's config
        for key, value in ADDED_KEY_DEFAULTS.items():
            flat.setdefault(key, value)
        if flat["deployment.name"] == "aggregated":
            flat = {k: v for k, v in flat.items() if not is_ignored(k, DISAGG_ONLY_KEYS)}
    return {k: v for k, v in flat.items() if not is_ignored(k, ignored)}


def differing_keys(a: dict[str, Any], b: dict[str, Any], ignored: tuple[str, ...] = IGNORED_KEYS) -> list[str]:
    """Every comparable key whose value differs (or that one side lacks), sorted."""
    fa, fb = comparable(a, ignored), comparable(b, ignored)
    return [k for k in sorted(set(fa) | set(fb)) if fa.get(k, "-") != fb.get(k, "-")]


def config_differences(a: dict[str, Any], b: dict[str, Any], ignored: tuple[str, ...] = IGNORED_KEYS) -> list[str]:
    """``key: a -> b`` for every comparable key that differs (absent on one side: ``-``)."""
    fa, fb = comparable(a, ignored), comparable(b, ignored)
    return [f"{k}: {fa.get(k, '-')} -> {fb.get(k, '-')}" for k in differing_keys(a, b, ignored)]
