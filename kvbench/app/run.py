"""One run: turn a composed config into plugins, run the engine, summarize. No Hydra in here."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig, OmegaConf

from kvbench.app.config import MODES, OutputConfig, SchedulerConfig, SloConfig, WandbConfig, plugin_config, require, to_dataclass
from kvbench.exec.costmodel import CostModel
from kvbench.engine import Engine
from kvbench.errors import ConfigError
from kvbench.specs.hardware import HardwareSpec
from kvbench.metrics.summary import summarize
from kvbench.specs.model import ModelConfig, ModelSpec, model_spec
from kvbench.plugins import lookup
from kvbench.output.results import RunResult


@dataclass
class RunSetup:
    """Everything a run is made of, validated and instantiated."""

    model: ModelSpec
    hardware: HardwareSpec
    budget_bytes: int
    allocator: object
    kernel: object
    policy: object
    workload_source: object
    scheduler: SchedulerConfig
    slo: SloConfig
    output: OutputConfig
    wandb: WandbConfig


def _instantiate(group: str, node, **kwargs):
    if node is None or "name" not in node:
        raise ConfigError(f"{group}.name is missing: pick one with {group}=<name>")
    cls = lookup(group, node["name"])
    return cls(plugin_config(cls, node, group), **kwargs)


def setup(cfg: DictConfig) -> RunSetup:
    """Validate every value once, here at the edge, and build the run's objects."""
    require(cfg.mode in MODES, "mode", cfg.mode, f"choose one of {', '.join(MODES)}")
    if cfg.mode == "real":
        raise ConfigError(
            "mode='real' is not available yet: the real executor (a transformer forward pass on a CUDA GPU) "
            "is not built; use mode=sim"
        )
    model = model_spec(to_dataclass(ModelConfig, cfg.model, "model"))
    hardware = to_dataclass(HardwareSpec, cfg.hardware, "hardware")
    budget_bytes = hardware.kv_budget(model.weight_bytes)
    allocator = _instantiate("allocator", cfg.allocator, budget_bytes=budget_bytes, kv_bytes_per_token=model.kv_bytes_per_token)
    return RunSetup(
        model=model,
        hardware=hardware,
        budget_bytes=budget_bytes,
        allocator=allocator,
        kernel=_instantiate("kernel", cfg.kernel),
        policy=_instantiate("preemption", cfg.preemption),
        workload_source=_instantiate("workload", cfg.workload),
        scheduler=to_dataclass(SchedulerConfig, cfg.scheduler, "scheduler"),
        slo=to_dataclass(SloConfig, cfg.slo, "slo"),
        output=to_dataclass(OutputConfig, cfg.output, "output"),
        wandb=to_dataclass(WandbConfig, cfg.wandb, "wandb"),
    )


def labels(cfg: DictConfig, s: RunSetup, choices: dict | None = None) -> dict:
    """The columns that say what a result row is (so rows from different runs can be compared).

    ``choices`` are the config-group options picked (Hydra's runtime choices): a preset such as
    ``workload=lecture_chat`` or ``allocator=orca_max`` is reported by that name.
    """
    choices = choices or {}
    return {
        "mode": cfg.mode,
        "model": s.model.name,
        "hardware": s.hardware.name,
        "allocator": choices.get("allocator", s.allocator.name),
        "block_size_tokens": s.allocator.block_size_tokens,
        "kernel": s.kernel.name,
        "preemption": s.policy.name,
        "workload": choices.get("workload", s.workload_source.name),
        "seed": int(cfg.seed),
    }


def execute(cfg: DictConfig, choices: dict | None = None) -> RunResult:
    """Run the config (already composed by Hydra or by :func:`kvbench.compose`) and summarize it."""
    s = setup(cfg)
    efficiency = s.kernel.decode_efficiency(s.hardware.name, s.allocator.block_size_tokens, s.allocator.contiguous)
    workload = s.workload_source.generate(np.random.default_rng(int(cfg.seed)))
    engine = Engine(
        s.allocator,
        s.policy,
        CostModel(s.model, s.hardware, efficiency.efficiency),
        s.scheduler,
        show_progress=bool(cfg.progress),
    )
    record = engine.run(workload)
    summary = labels(cfg, s, choices)
    summary.update(
        kv_budget_bytes=s.budget_bytes,
        kv_bytes_per_token=s.model.kv_bytes_per_token,
        weight_bytes=s.model.weight_bytes,
        decode_efficiency=efficiency.efficiency,
        calibration=efficiency.source,
    )
    summary.update(
        summarize(
            record.requests,
            record.steps,
            budget_bytes=s.budget_bytes,
            kv_bytes_per_token=s.model.kv_bytes_per_token,
            slo=s.slo,
        )
    )
    summary.update(_refusal_summary(record.refusals, engine))
    summary["sim_wall_s"] = record.sim_wall_s
    summary["simulated_requests_per_wall_s"] = workload.num_requests / record.sim_wall_s
    return RunResult(
        config=OmegaConf.to_container(cfg, resolve=True),
        summary=summary,
        requests=record.requests,
        steps=record.steps,
        refusals=record.refusals,
    )


def _refusal_summary(refusals, engine: Engine) -> dict:
    """Admission refusals, and those at a moment when enough memory was free: fragmentation, observed."""
    headroom = engine.watermark_bytes if engine.allocator.uses_watermark else 0
    fragmented = refusals["free_bytes"] - headroom >= refusals["reservation_bytes"]
    return {
        # a request at the head of the queue is refused once per step until it fits
        "num_refusal_steps": int(len(refusals)),
        "num_fragmentation_refusals": int(fragmented.sum()),
        "num_requests_refused_by_fragmentation": int(refusals.loc[fragmented, "request_id"].nunique()),
    }
