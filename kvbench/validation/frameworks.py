"""Each framework's own admission rule, as the overrides that select it in a kvbench run.

``kvbench validate`` replays silicon rows measured on vLLM, SGLang and TRT-LLM. By default every
replay schedules with kvbench's ``chunked`` policy and 8,192 tokens per step, the budget the
three engines share; :func:`scheduler_overrides` names instead the engine preset
(``conf/engine/<preset>.yaml``) whose scheduler decides as that framework's does, with its
default limits (docs/schedulers.md, "Engine presets"):

- ``vllm``: ``engine=vllm_v1``, vLLM V1's token budget with chunked prefill (decodes first, then
  prompt chunks), whole-prompt admission, no watermark; 8,192 tokens and 1,024 sequences on a GPU
  of 70 GiB or more that is not an A100, else 2,048 and 256 (``vllm/engine/arg_utils.py``'s
  defaults for an OpenAI-compatible server);
- ``sglang``: ``engine=sglang``, prefill and decode batches alternating, prompts chunked at
  ``chunked_prefill_size`` (``server_args.py``: 2,048 below 35 GiB, 8,192 below 160 GiB,
  16,384 above), admitted against the new-token ratio's reservation;
- ``trtllm``: ``engine=trtllm``, the GUARANTEED_NO_EVICT capacity scheduler (a prompt is admitted
  only when its whole prompt and output fit beside what running requests still need) and
  ``max_num_tokens`` 8,192 per step shared by context and generation, prompts whole.

The overrides take the place of a replay's ``scheduler=chunked`` and
``scheduler.max_num_batched_tokens``: a preset sets the scheduler itself, and a later
``scheduler=`` on the same command line would override the preset's choice.
"""

from __future__ import annotations

from importlib.resources import files

import yaml

from kvbench.errors import ConfigError
from kvbench.specs import profiles

#: backend (silicon_sample.csv's ``backend``) -> the engine preset that schedules as it does
PRESETS = {"vllm": "vllm_v1", "sglang": "sglang", "trtllm": "trtllm"}
GIB = 1 << 30
#: TRT-LLM's default max_num_tokens (conf/engine/trtllm.yaml)
TRTLLM_MAX_NUM_TOKENS = 8192


def scheduler_overrides(backend: str, system: str | None = None) -> list[str]:
    """The Hydra overrides that select ``backend``'s admission rule with its default limits on
    ``system`` (silicon_sample.csv's name, e.g. ``h100_sxm``; None: the presets' H100/H200 limits)."""
    preset = PRESETS.get(backend)
    if preset is None:
        raise ConfigError(f"backend={backend!r} has no scheduler preset; choose one of {', '.join(PRESETS)}")
    out = [f"engine={preset}"]
    if system is None:
        return out
    memory_bytes = gpu_memory_bytes(system)
    if backend == "vllm" and (memory_bytes < 70 * GIB or "a100" in system):
        out += ["scheduler.max_num_batched_tokens=2048", "scheduler.max_num_seqs=256"]
    elif backend == "sglang" and memory_bytes < 35 * GIB:
        out.append("scheduler.max_num_batched_tokens=2048")
    elif backend == "sglang" and memory_bytes >= 160 * GIB:
        out.append("scheduler.max_num_batched_tokens=16384")
    return out


def gpu_memory_bytes(system: str) -> float:
    """The GPU memory of a silicon ``system``, from kvbench's hardware config of it (the first
    hardware config :data:`kvbench.specs.profiles.SYSTEMS` maps to that system)."""
    names = {}
    for hardware, measured in profiles.SYSTEMS.items():
        names.setdefault(measured, hardware)
    name = names.get(system)
    if name is None:
        raise ConfigError(f"system={system!r} has no hardware config; choose one of {', '.join(names)}")
    spec = yaml.safe_load(files("kvbench.conf").joinpath("hardware", f"{name}.yaml").read_text())
    return float(spec["hbm_bytes"])


def replace_scheduler(overrides: list[str] | tuple[str, ...], backend: str, system: str | None = None) -> list[str]:
    """``overrides`` (a replay's) with kvbench's shared chunked-prefill scheduler swapped for
    ``backend``'s own rule: ``scheduler=`` and ``scheduler.max_num_batched_tokens=`` are dropped
    (the preset sets both) and the preset's overrides come first, so that the replay's other
    ``scheduler.*`` settings (its per-rank ``max_num_seqs``) still apply on top of it."""
    kept = [o for o in overrides if not o.startswith(("scheduler=", "scheduler.max_num_batched_tokens="))]
    preset = scheduler_overrides(backend, system)
    values = dict(o.split("=", 1) for o in overrides if "=" in o)
    prompt_tokens = int(values.get("workload.prompt_tokens", 0))
    if backend == "trtllm" and prompt_tokens > TRTLLM_MAX_NUM_TOKENS:
        # without chunked context TRT-LLM runs a prompt whole in one step: a benchmark that served a
        # longer prompt raised max_num_tokens to it (the engine refuses the request otherwise)
        preset.append(f"scheduler.max_num_batched_tokens={prompt_tokens}")
    return [*preset, *kept]
