"""One run: turn a composed config into plugins, run the engine, summarize. No Hydra in here."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from kvbench.app.checks import (
    calibration_dir_path,
    check_memory,
    check_real_model_memory,
    check_seed,
    check_top_level_keys,
)
from kvbench.app.config import (
    MODES,
    EngineConfig,
    OutputConfig,
    WandbConfig,
    plugin_config,
    to_dataclass,
)
from kvbench.app.disagg import build_router, execute_disagg
from kvbench.app.progress import current_job, phase_progress, progress_bar
from kvbench.core.request import Request, requests_from_workload
from kvbench.core.step import Executor
from kvbench.deploy.config import DeploymentConfig
from kvbench.engine import Engine
from kvbench.errors import ConfigError, require
from kvbench.errors.extras import install_hint
from kvbench.exec.costmodel import CostModel
from kvbench.exec.sim import SimExecutor
from kvbench.io.table import ColumnTable
from kvbench.memory.allocator import Allocator
from kvbench.memory.host_pool import HostSwapPool
from kvbench.memory.paged_config import model_block_size_tokens
from kvbench.metrics.host_tier import host_tier_summary
from kvbench.metrics.kv_kinds import kv_kinds
from kvbench.metrics.prefix_bounds import cached_prefix_cache_bounds
from kvbench.metrics.recorder import RunRecord
from kvbench.metrics.step_totals import StepTotals
from kvbench.metrics.summary import SloConfig, summarize
from kvbench.output.provenance import provenance
from kvbench.output.results import RunResult
from kvbench.output.step_files import StepFiles
from kvbench.plugins import lookup, registry
from kvbench.sched.scheduler import Scheduler
from kvbench.specs.calibration import DecodeEfficiency, calibration_digest, load_fitted_terms
from kvbench.specs.hardware import HardwareSpec
from kvbench.specs.model import ModelConfig, ModelSpec, model_spec
from kvbench.workload.arrivals import check_arrival_span
from kvbench.workload.dp_split import rank_share
from kvbench.workload.source import Workload

#: a subfolder of a sweep's folder, where its jobs keep what they compute once for all of them (the
#: comparison reads only the numbered job folders)
BOUNDS_CACHE = ".cache"


@dataclass
class RunSetup:
    """Everything a run is made of, validated and instantiated."""

    model: ModelSpec
    hardware: HardwareSpec
    budget_bytes: int
    allocator: Allocator
    kernel: object
    efficiency: DecodeEfficiency
    cost: CostModel
    scheduler: Scheduler
    workload_source: object
    #: the model's config fields (what mode=real builds its model from)
    model_config: ModelConfig
    slo: SloConfig
    output: OutputConfig
    wandb: WandbConfig
    #: the engine whose conventions the run follows (engine=<preset>)
    engine: EngineConfig
    #: one engine (aggregated) or prefill and decode workers (deployment=disagg)
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)


def _instantiate(group: str, node, **kwargs):
    if node is None or "name" not in node:
        raise ConfigError(f"{group}.name is missing: pick one with {group}=<name>")
    cls = lookup(group, node["name"])
    return cls(plugin_config(cls, node, group), **kwargs)


def _allocator(cfg: DictConfig, model: ModelSpec, budget_bytes: int, engine: EngineConfig) -> Allocator:
    """The allocator ``cfg.allocator`` names. A paged one, for a model with sliding-window layers in
    a simulation, keeps one block table per KV-cache group and frees what leaves a window
    (``hybrid_paged``, the same options); every other allocator keeps every token of every layer.
    ``engine.cache_duplicate_blocks`` turns on the paged allocator's own option where its prefix
    cache is on (``hybrid_paged`` keeps one block per key). A paged allocator's
    ``block_size_tokens: null`` is the model's kernels' block size (:func:`model_block_size_tokens`).
    A model with linear-attention layers hands every allocator its state per request; one that
    cannot hold it is refused in one line."""
    node = cfg.allocator
    if node is not None and node.get("name") == "paged" and node.get("block_size_tokens") is None:
        node = OmegaConf.create(
            {**OmegaConf.to_container(node, resolve=True), "block_size_tokens": model_block_size_tokens(model)}
        )
    if model.kv_groups and cfg.mode == "sim" and node is not None and node.get("name") == "paged":
        cls = lookup("allocator", "hybrid_paged")
        config = plugin_config(cls, node, "allocator")
        return cls(
            config, budget_bytes=budget_bytes, kv_bytes_per_token=model.kv_bytes_per_token, kv_groups=model.kv_groups
        )
    if (
        engine.cache_duplicate_blocks
        and node is not None
        and node.get("name") == "paged"
        and node.get("prefix_caching") is True
    ):
        node = {**OmegaConf.to_container(node, resolve=True), "cache_duplicate_blocks": True}
    state = {}
    if model.state_bytes_per_request:
        _require_state_holding(node, model)
        state = {"state_bytes_per_request": model.state_bytes_per_request}
    return _instantiate(
        "allocator", node, budget_bytes=budget_bytes, kv_bytes_per_token=model.kv_bytes_per_token, **state
    )


def _require_state_holding(node, model: ModelSpec) -> None:
    """An allocator whose constructor takes no ``state_bytes_per_request`` would leave the model's
    linear-attention state out of its budget: refused, naming those that hold it."""
    import inspect

    if node is None or "name" not in node:
        return  # (the missing name is _instantiate's line)
    params = inspect.signature(lookup("allocator", node["name"])).parameters.values()
    # (a constructor passing **sizes on to its base takes it where the base does: naive's)
    if not any(p.name == "state_bytes_per_request" or p.kind is p.VAR_KEYWORD for p in params):
        raise ConfigError(
            f"allocator={node['name']} cannot hold the per-request state of {model.name}'s linear-attention "
            f"layers ({model.state_bytes_per_request:,d} bytes per request); use allocator=naive, per_request or paged"
        )


def _check_allocator_layers(node, model: ModelSpec) -> None:
    """An allocator that keeps per-layer buffers (vAttention: a K and a V buffer per layer) takes
    the model's layer count from the model's config; another count would change its page geometry,
    and so every result, while the model says otherwise. Refused, not silently used."""
    if node is None or node.get("num_layers") is None:
        return
    layers = node.get("num_layers")
    if isinstance(layers, int) and not isinstance(layers, bool) and layers != model.num_layers:
        raise ConfigError(
            f"allocator.num_layers={layers} but {model.name} has {model.num_layers} layers: the allocator's "
            "buffers are the model's layers; leave allocator.num_layers out (it follows the model)"
        )


def check_engine_choice(cfg: DictConfig, choices: dict | None) -> None:
    """``engine.name`` is a label that a preset (``engine=<preset>``) sets together with the settings
    that make kvbench decide as that engine does. The name given alone would label the run with an
    engine whose settings it does not have: refused, naming the preset to pick instead."""
    chosen = (choices or {}).get("engine")
    node = cfg.get("engine")
    name = node.get("name") if node is not None else None
    if chosen is None or not isinstance(name, str) or name == chosen:
        return
    from importlib.resources import files

    folder = files("kvbench.conf").joinpath("engine")  # kvbench's own presets (a plugin's may add more)
    presets = sorted(e.name.removesuffix(".yaml") for e in folder.iterdir() if e.name.endswith(".yaml"))
    if name in presets:
        fix = (
            f"pick the preset with engine={name} (not engine.name={name}), which sets its scheduler and preemption too"
        )
    else:
        fix = f"pick an engine preset with engine=<preset> ({', '.join(presets)}) and leave engine.name as it sets it"
    raise ConfigError(f"engine.name={name} would label the run {name} but it runs engine={chosen}'s settings; {fix}")


def _queue(node):
    """The admission queue ``scheduler.queue`` names (a queue plugin), built empty."""
    name = node.get("queue", "fcfs") if node is not None else "fcfs"
    classes = registry("queue")
    if not isinstance(name, str) or name not in classes:
        raise ConfigError(
            f"scheduler.queue={name!r} is not a registered queue; choose one of: {', '.join(sorted(classes))}"
        )
    return classes[name]()


def setup(cfg: DictConfig) -> RunSetup:
    """Validate every value once, here at the edge, and build the run's objects."""
    check_top_level_keys(cfg)
    require(cfg.mode in MODES, "mode", cfg.mode, f"choose one of {', '.join(MODES)}")
    check_seed(cfg.seed)
    model_config = to_dataclass(ModelConfig, cfg.model, "model")
    model = model_spec(model_config)
    hardware = to_dataclass(HardwareSpec, cfg.hardware, "hardware")
    domain = hardware.nvlink_domain_gpus
    # a tensor-parallel group all-reduces twice a layer: kvbench prices it inside one NVLink domain only
    require(
        model.tp <= domain,
        "model.tp",
        model.tp,
        f"use 1 to {domain} GPUs: one tensor-parallel group spans at most one NVLink domain of "
        f"hardware={hardware.name} (hardware.nvlink_domain_gpus={domain})",
    )
    engine = to_dataclass(EngineConfig, cfg.get("engine") or {}, "engine")
    deployment = to_dataclass(DeploymentConfig, cfg.get("deployment") or {}, "deployment")
    build_router(cfg.get("router") or {"name": "round_robin"})  # a misspelled router fails every run alike
    budget_bytes = hardware.kv_budget(model.weight_bytes)
    _check_allocator_layers(cfg.allocator, model)
    allocator = _allocator(cfg, model, budget_bytes, engine)
    if engine.null_block:  # one block of the pool is never handed out: the budget holds one fewer
        budget_bytes -= getattr(allocator, "page_bytes", allocator.block_size_tokens * model.kv_bytes_per_token)
        allocator = _allocator(cfg, model, budget_bytes, engine)
    kernel = _instantiate("kernel", cfg.kernel)
    if cfg.mode == "real":
        if model.kv_groups:  # the real kernels attend to every cached token: a window would be ignored
            raise ConfigError(
                f"mode=real cannot run {model.name} yet: its sliding-window layers are simulated only "
                "(use mode=sim, or model.hf_config.sliding_window=null for its full-attention twin)"
            )
        _check_real_mode_installed()
        reason = type(kernel).unavailable_reason(_real_device())
        if reason:
            raise ConfigError(f"mode={cfg.mode!r} cannot run here: {reason}; pick kernel=torch")
        check_real_model_memory(model)
    efficiency, cost = _clock(cfg, model, model_config, hardware, allocator, kernel)
    if engine.step_overhead_s is not None:  # the engine's own host work per step replaces a calibration's
        object.__setattr__(cost, "step_overhead_s", float(engine.step_overhead_s))
    policy = _instantiate("preemption", cfg.preemption)
    host_pool = HostSwapPool(int(hardware.host_swap_bytes))
    scheduler = _instantiate(
        "scheduler",
        cfg.scheduler,
        allocator=allocator,
        policy=policy,
        cost=cost,
        host_pool=host_pool,
        queue=_queue(cfg.scheduler),
    )
    if engine.null_block and scheduler.config.watermark_in_blocks and scheduler.watermark_bytes:
        # vLLM counts its watermark in blocks of the whole pool, the null block included
        block_bytes = allocator.block_size_tokens * model.kv_bytes_per_token
        num_blocks = budget_bytes // block_bytes + 1
        scheduler.watermark_bytes = int(scheduler.config.watermark_fraction * num_blocks) * block_bytes
    if cfg.workload is None or "name" not in cfg.workload:
        raise ConfigError("workload.name is missing: pick one with workload=<name>")
    source_cls = lookup("workload", cfg.workload["name"])
    source_config = plugin_config(source_cls, cfg.workload, "workload")
    # before the source reads its file or draws its requests: a run too big for memory is one line now
    check_memory(source_cls, source_config, allocator, enabled=bool(cfg.get("check_memory", True)))
    workload_source = source_cls(source_config)
    return RunSetup(
        model=model,
        hardware=hardware,
        budget_bytes=budget_bytes,
        allocator=allocator,
        kernel=kernel,
        efficiency=efficiency,
        cost=cost,
        scheduler=scheduler,
        workload_source=workload_source,
        model_config=model_config,
        slo=to_dataclass(SloConfig, cfg.slo, "slo"),
        output=to_dataclass(OutputConfig, cfg.output, "output"),
        wandb=to_dataclass(WandbConfig, cfg.wandb, "wandb"),
        engine=engine,
        deployment=deployment,
    )


def _clock(cfg, model, model_config, hardware, allocator, kernel) -> tuple[DecodeEfficiency, CostModel]:
    """The run's cost model: the profiled one for a measured kernel (its tables price every
    step), else the roofline with the kernel's calibration file, if any."""
    measured = getattr(type(kernel), "measured", None)
    tables = None
    if measured is not None:
        from kvbench.exec.profiled import load_tables, table_kv_dtype  # a measured kernel's only
        from kvbench.specs.profiles import hardware_system

        system = hardware_system(hardware.name)
        try:
            tables = load_tables(measured, system, model, kernel.gemm_dtype(model_config.dtype), table_kv_dtype(model))
        except ConfigError as exc:
            raise ConfigError(f"kernel={kernel.name}: {exc}") from None
        label = tables.label
    elif cfg.mode == "sim" and (found := _transfer_tables(cfg, model, model_config, hardware, kernel)) is not None:
        tables, label = found, found.label
    elif cfg.mode == "sim" and needs_measured_clock(model):
        found = _measured_stand_in(model, model_config, hardware)
        if found is not None:
            stand_in, tables = found
            label = f"kernel={stand_in.name}'s tables (stand-in): {tables.label}"
    if tables is not None:
        from kvbench.exec.profiled import ProfiledCostModel

        cost = ProfiledCostModel(model, hardware, tables=tables)
        return DecodeEfficiency(cost.decode_bandwidth_fraction, label), cost
    calibration_dir = calibration_dir_path(cfg.get("calibration_dir"))
    where = {} if calibration_dir is None else {"calibration_dir": calibration_dir}  # older plugins: no keyword
    efficiency = kernel.decode_efficiency(
        hardware.name, allocator.block_size_tokens, allocator.capabilities.contiguous_layout, **where
    )
    # the same file's fitted prefill efficiency and per-step overhead (kvbench calibrate), if any
    prefill_flops_efficiency, step_overhead_s = load_fitted_terms(hardware.name, kernel.name, calibration_dir)
    return efficiency, CostModel(model, hardware, efficiency.efficiency, prefill_flops_efficiency, step_overhead_s)


def _transfer_tables(cfg, model, model_config, hardware, kernel):
    """The profiled tables of kvbench's own ``triton`` or ``flashinfer`` kernel on a GPU where the
    transfer prices it (:mod:`kvbench.exec.transfer`): its decode attention transferred, the rest of
    the step SGLang's tables on that GPU. None where a calibration file exists for the hardware and
    kernel (a GPU's own measurement wins), for another kernel or GPU, for a model the transfer
    does not price (MoE, MLA, windows, linear attention: their own clocks), or for a shape the
    tables never measured."""
    from kvbench.exec import transfer
    from kvbench.specs.calibration import calibration_path
    from kvbench.specs.profiles import SYSTEMS

    system = SYSTEMS.get(hardware.name)
    if not transfer.applies(kernel.name, system) or needs_measured_clock(model) or model.kv_groups:
        return None
    if calibration_path(hardware.name, kernel.name, calibration_dir_path(cfg.get("calibration_dir"))).exists():
        return None
    from kvbench.exec.profiled import load_tables, table_kv_dtype

    rest = lookup("kernel", transfer.REST_OF_STEP)
    kv_dtype = table_kv_dtype(model)
    gemm_dtype = MODEL_GEMM_DTYPES.get(model_config.dtype, "bfloat16")
    try:
        decode = transfer.decode_for_run(kernel.name, system, model, kv_dtype)
        return load_tables(rest.measured, system, model, gemm_dtype, kv_dtype, decode=decode)
    except ConfigError:
        # a shape no table measured (a toy model's 16-wide heads): the uncalibrated roofline, as
        # on a GPU the transfer does not price, and its rows say `uncalibrated`
        return None


#: model.dtype -> the GEMM table's dtype of the rest of a transferred kernel's step (as a measured
#: kernel's kernel.gemm=auto picks it)
MODEL_GEMM_DTYPES = {"float8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}


#: the measured kernels tried, in order, to price a model the roofline has no terms for (routed
#: experts, MLA, linear-attention state) when the run's kernel was never measured: vLLM's first, as
#: kvbench's scheduler defaults follow vLLM's
STAND_IN_KERNELS = ("vllm_fa3", "sglang_fa3", "trtllm")


def needs_measured_clock(model: ModelSpec) -> bool:
    """Whether the roofline lacks the terms this model's step needs: its time then comes from
    measured tables wherever the GPU has them (the roofline prices dense attention and GEMMs only)."""
    return model.moe is not None or model.mla is not None or model.linear is not None


def _measured_stand_in(model: ModelSpec, model_config, hardware):
    """The first of :data:`STAND_IN_KERNELS` whose tables price ``model`` on ``hardware``, with
    those tables (loaded once: the run prices from them); None
    for a GPU without tables (it keeps the roofline, as a dense model's run does). A GPU with
    tables none of which price the model (a precision or layout never measured) is one line."""
    from kvbench.exec.profiled import load_tables, table_kv_dtype
    from kvbench.specs.profiles import SYSTEMS

    system = SYSTEMS.get(hardware.name)
    if system is None:
        return None
    refusals = []
    for name in STAND_IN_KERNELS:
        stand_in = _instantiate("kernel", {"name": name})
        try:
            tables = load_tables(
                type(stand_in).measured, system, model, stand_in.gemm_dtype(model_config.dtype), table_kv_dtype(model)
            )
        except ConfigError as exc:
            refusals.append(f"kernel={name}: {str(exc).splitlines()[0]}")
            continue
        return stand_in, tables
    raise ConfigError(
        f"model={model.name} needs measured tables on hardware={hardware.name} (the roofline has no expert, "
        f"latent or state terms) and none prices it; {refusals[0]}"
    )


def labels(cfg: DictConfig, s: RunSetup, choices: dict | None = None) -> dict:
    """The columns that say what a result row is (so rows from different runs can be compared).

    ``choices`` are the config-group options picked (Hydra's runtime choices): a preset such as
    ``workload=lecture_chat`` or ``allocator=orca_max`` is reported by that name.
    """
    choices = choices or {}
    return {
        "mode": cfg.mode,
        "engine": s.engine.name,
        "model": s.model.name,
        "hardware": s.hardware.name,
        "allocator": choices.get("allocator", s.allocator.name),
        "block_size_tokens": s.allocator.block_size_tokens,
        "kernel": s.kernel.name,
        "scheduler": choices.get("scheduler", s.scheduler.name),
        "preemption": choices.get("preemption", s.scheduler.policy.name),
        "victim": s.scheduler.policy.config.victim,
        "workload": choices.get("workload", s.workload_source.name),
        "seed": int(cfg.seed),
    }


def execute(cfg: DictConfig, choices: dict | None = None, steps_dir: Path | None = None) -> RunResult:
    """Run the config (already composed by Hydra or by :func:`kvbench.api.compose`) and summarize it.

    ``steps_dir``: write the step table to ``steps.parquet`` and ``steps.csv`` there while the run
    goes, and add up its summary as the rows pass, instead of holding it (a long run's table is most
    of its memory); the result's ``steps`` is then None and its ``steps_file`` the Parquet file."""
    check_engine_choice(cfg, choices)
    if (cfg.get("deployment") or {}).get("name") == "disagg":  # several workers, each its own engine
        return execute_disagg(cfg, choices, setup, labels)
    s = setup(cfg)
    # under attention data parallelism the run is one rank's: its share of the requests (round robin)
    workload = rank_share(s.workload_source.generate(np.random.default_rng(int(cfg.seed))), s.model.attention_dp)
    check_arrival_span(workload.arrival_s, "raise workload.rate_per_s or workload.rate_scale, or replay fewer requests")
    _check_positions(workload, s.model)
    requests = requests_from_workload(workload, int(cfg.seed))
    real = cfg.mode == "real"
    executor = _real_executor(s, requests, int(cfg.seed)) if real else SimExecutor(s.cost)
    step_totals = step_files = step_sink = None
    if steps_dir is not None:
        step_totals = StepTotals(s.budget_bytes, s.model.kv_bytes_per_token, kv_kinds(s.model))
        step_files = StepFiles(steps_dir)

        def step_sink(batch: dict[str, np.ndarray]) -> None:
            step_files(batch)
            step_totals.add(batch)

    try:
        with progress_bar(
            workload.num_requests, "running" if real else "simulating", enabled=bool(cfg.progress), unit="requests"
        ) as advance:
            # a real step's tokens depend on the previous step's: real mode takes steps one by one
            engine = Engine(
                s.scheduler,
                executor,
                event_driven=bool(cfg.event_driven) and not real,
                on_finished=advance,
                max_in_flight=workload.max_concurrency,
                step_sink=step_sink,
            )
            record = engine.run(requests)
        result = _result(cfg, s, choices, workload, requests, executor, record, step_totals)
    except BaseException:
        if step_files is not None:  # a run that failed or was interrupted leaves no step table
            step_files.discard()
        raise
    if step_files is not None:  # the run is over and summarized: its step table takes its names
        step_files.commit()
        result.steps_file = step_files.parquet_path
    return result


def _result(
    cfg: DictConfig,
    s: RunSetup,
    choices: dict | None,
    workload: Workload,
    requests: Sequence[Request],
    executor: Executor,
    record: RunRecord,
    step_totals: StepTotals | None,
) -> RunResult:
    """The run's summary and tables, from what its loop recorded (``step_totals``: its step table's
    sums, when the table went to its files)."""
    real = cfg.mode == "real"
    if real:
        from kvbench.exec.real import prediction_error

        # one list of generated token ids per branch (a fan-out's branches in seq_id order)
        first_seq_ids = np.cumsum([0] + [r.num_branches for r in requests[:-1]])
        record.request_columns["output_token_ids"] = [
            [executor.generated(int(first) + b) for b in range(r.num_branches)]
            for first, r in zip(first_seq_ids, requests)
        ]
    summary = labels(cfg, s, choices)
    summary.update(
        kv_budget_bytes=s.budget_bytes,
        kv_bytes_per_token=s.model.kv_bytes_per_token,
        weight_bytes=s.model.weight_bytes,
        decode_efficiency=s.efficiency.efficiency,
        prefill_flops_efficiency=s.cost.prefill_flops_per_s / s.hardware.dense_flops_per_s,
        step_overhead_s=s.cost.step_overhead_s,
        clock=("transfer" if s.efficiency.source.startswith("transfer:") else "profiled")
        if _profiled(s.cost)
        else "roofline",
        attention_dp_ranks=s.model.attention_dp,
        calibration=s.efficiency.source,
        calibration_sha256=calibration_digest(s.hardware.name, s.kernel.name, cfg.get("calibration_dir")),
    )
    summary.update(
        summarize(
            record.request_columns,
            record.step_columns if step_totals is None else step_totals,
            budget_bytes=s.budget_bytes,
            kv_bytes_per_token=s.model.kv_bytes_per_token,
            slo=s.slo,
            max_concurrency=workload.max_concurrency,
            kv_kinds=kv_kinds(s.model),
        )
    )
    if real:
        predicted_s, measured_s = zip(*executor.step_times_s) if executor.step_times_s else ((), ())
        summary.update(prediction_error(predicted_s, measured_s))
        summary["measured_on"] = executor.measured_on  # a CPU's times must never calibrate a GPU
    summary.update(_refusal_summary(record.refusal_columns))
    summary.update(_trace_summary(s.workload_source))
    if not s.allocator.capabilities.contiguous_layout:
        # the prefix-cache ceiling and what the best eviction could do at this budget, offline, for a
        # block allocator ({} when the workload says nothing of prompt content); seconds on a long
        # trace, so a sweep's jobs share them through its folder (the same requests, block size and
        # capacity give the same bounds whatever else a job sweeps), unless it writes no files
        block_bytes = s.model.kv_bytes_per_token * s.allocator.block_size_tokens
        job = current_job()
        cache_dir = job.sweep_dir / BOUNDS_CACHE if job is not None and s.output.write else None
        bounds = cached_prefix_cache_bounds(
            requests,
            s.allocator.block_size_tokens,
            s.budget_bytes // block_bytes,
            cache_dir=cache_dir,
            progress=phase_progress(bool(cfg.progress)),
        )
        if any(g.window_tokens for g in getattr(s.allocator, "kv_groups", ())):
            # a sliding-window model: its cache holds a prefix's last window per window group, not
            # whole-model blocks, so the LRU and Belady bounds of a cache of C whole-model blocks
            # bound nothing it does; the ceiling (no eviction at all) still bounds its hit rate
            bounds = {k: v for k, v in bounds.items() if k not in WHOLE_MODEL_BOUNDS}
        summary.update(bounds)
        # a host tier for evicted prefix blocks: its hits, traffic and bounds ({} without one)
        summary.update(
            host_tier_summary(
                s.scheduler,
                record.request_columns,
                requests,
                cache_dir=cache_dir,
                progress=phase_progress(bool(cfg.progress)),
            )
        )
    caps = s.allocator.capabilities
    summary["swap_pool_peak_bytes"] = s.scheduler.host_pool.peak_bytes
    summary["swap_break_even_kv_tokens"] = s.cost.swap_break_even_kv_tokens(
        None if caps.contiguous_layout else s.allocator.block_size_tokens
    )
    summary.update(_kv_group_summary(s.allocator))
    if _profiled(s.cost):
        summary["profile_extrapolated_lookups"] = s.cost.extrapolated
    summary.update(provenance())  # which kvbench computed these numbers
    summary["sim_wall_s"] = record.sim_wall_s
    # the whole loop: sim_wall_s plus making the requests and writing the tables' rows as it goes
    summary["loop_wall_s"] = record.loop_wall_s
    summary["simulated_requests_per_wall_s"] = workload.num_requests / record.sim_wall_s
    return RunResult(
        config=recorded_config(cfg),
        summary=summary,
        requests=record.request_columns,
        steps=record.step_columns,
        refusals=record.refusal_columns,
    )


#: the offline bounds at a capacity of whole-model blocks (not reported for a sliding-window model)
WHOLE_MODEL_BOUNDS = ("prefix_hit_rate_lru_offline", "prefix_hit_rate_belady")


def recorded_config(cfg: DictConfig) -> dict:
    """The config as a run records it (``config.json``, what a resumed sweep and ``kvbench compare``
    match jobs by): a paged allocator's ``block_size_tokens: null`` is the block size the model
    gave it, so that a run records the one it ran with."""
    config = OmegaConf.to_container(cfg, resolve=True)
    node = config.get("allocator") or {}
    if node.get("name") == "paged" and node.get("block_size_tokens") is None:
        try:
            model = model_spec(to_dataclass(ModelConfig, cfg.model, "model"))
        except ConfigError:
            return config  # (the run itself says what is wrong with the model)
        node["block_size_tokens"] = model_block_size_tokens(model)
    return config


def _kv_group_summary(allocator: Allocator) -> dict:
    """A hybrid allocator's KV-cache groups and what its windows freed ({} for any other)."""
    groups = getattr(allocator, "kv_groups", None)
    if groups is None:
        return {}
    windows = [g.window_tokens for g in groups if g.window_tokens]
    state_groups = getattr(allocator, "state_groups", ())
    summary = {
        "num_kv_groups": len(groups) + len(state_groups),
        "num_window_groups": len(windows),
        "sliding_window_tokens": min(windows, default=0),
        "kv_page_bytes": allocator.page_bytes,
        "window_slid_bytes": allocator.num_window_slid_blocks * allocator.page_bytes,
    }
    if state_groups:  # linear-attention layers: a state per sequence per group, in whole blocks
        summary["num_state_groups"] = len(state_groups)
        summary["state_blocks_per_request"] = allocator.states.blocks_per_state
    return summary


def _profiled(cost: CostModel) -> bool:
    """Whether ``cost`` is the profiled clock (a measured kernel's); its module, and the tables it
    reads, are imported only by a run that uses it."""
    module = sys.modules.get("kvbench.exec.profiled")
    return module is not None and isinstance(cost, module.ProfiledCostModel)


def _check_real_mode_installed() -> None:
    """mode=real builds a transformers model in torch tensors: both come with an extra."""
    import importlib.util

    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"mode=real runs a model with torch and transformers ({' and '.join(missing)} not installed): "
            f"{install_hint('real')}, or use mode=sim"
        )


def _real_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _real_executor(s: RunSetup, requests, seed: int):
    """The model and the executor of a ``mode=real`` run: the real weights of a local folder when
    ``model.config_path`` names one that holds them, else random weights drawn from ``seed``."""
    import json
    from pathlib import Path

    from kvbench.exec.real import RealExecutor
    from kvbench.exec.real.model import build_model, has_weights, load_model
    from kvbench.specs.model import resolve_architecture

    resolve_architecture(s.model_config)  # the same checks as sim, one line each
    folder = Path(s.model_config.config_path).expanduser() if s.model_config.config_path else None
    if folder is not None and folder.is_file():
        folder = folder.parent
    if folder is not None and has_weights(folder):
        model = load_model(folder, s.model_config.dtype, _real_device())
    else:
        hf_config = json.loads((folder / "config.json").read_text()) if folder else dict(s.model_config.hf_config)
        model = build_model(hf_config, s.model_config.dtype, seed, _real_device())
    return RealExecutor(model, s.allocator, s.kernel, s.cost, seed=seed, requests=requests)


def _check_positions(workload, model: ModelSpec) -> None:
    """Every request's declared S_max (and so its prompt and output) within the model's positions."""
    if workload.num_requests and model.max_positions:
        longest = int(workload.s_max_tokens.max())
        if longest > model.max_positions:
            raise ConfigError(
                f"the workload declares S_max up to {longest} tokens, beyond model {model.name!r}'s "
                f"{model.max_positions} positions: lower the workload's S_max or pick a longer-context model"
            )


def _trace_summary(source) -> dict:
    """What a trace replay left out or shortened (its ``too_long`` policy), counted; {} otherwise."""
    if not hasattr(source, "num_dropped"):
        return {}
    return {
        "num_trace_rows_read": int(source.num_read),
        "num_trace_requests_dropped": int(source.num_dropped),
        "num_trace_requests_clipped": int(source.num_clipped),
    }


def _refusal_summary(refusals: ColumnTable) -> dict:
    """Admission refusals by the allocator's own classification; ``fragmented`` is external
    fragmentation, observed: enough free bytes, no hole that holds the request."""
    num_steps = np.asarray(refusals["num_steps"], dtype=np.int64)
    fragmented = np.asarray(refusals["reason"]) == "fragmented"
    return {
        # a request at the head of the queue is refused once per step until it fits
        "num_refusal_steps": int(num_steps.sum()),
        "num_fragmentation_refusals": int(num_steps[fragmented].sum()),
        "num_requests_refused_by_fragmentation": len(set(refusals["request_id"][fragmented].tolist())),
    }
