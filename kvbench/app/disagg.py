"""One disaggregated run (``deployment=disagg``): build the workers from the config, run the
deployment's loop, and summarize it as one run whose request table follows each request through
both workers.

Each worker is built as an aggregated run would be (:func:`kvbench.app.run.setup`), from the run's
config with its role's layout (``deployment.prefill`` / ``deployment.decode``: TP, attention DP,
EP and the scheduler's limits). A worker with attention data parallelism ``D`` is D engines, one
per rank, each with its own KV cache and batch; the router picks a rank, as SGLang's DP attention
controller does, and the MoE layers are priced at D ranks' tokens as for an aggregated run.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
from omegaconf import DictConfig, OmegaConf

from kvbench.app.config import plugin_config, to_dataclass
from kvbench.app.progress import progress_bar
from kvbench.core.request import requests_from_workload
from kvbench.core.sequence import EVENT_COLUMNS
from kvbench.deploy.config import DeploymentConfig, role_config
from kvbench.deploy.interfaces import Router
from kvbench.deploy.links import link_for
from kvbench.deploy.loop import PATH_COLUMNS, Deployment, DeploymentRecord, kv_in_flight
from kvbench.deploy.worker import Worker
from kvbench.errors import ConfigError
from kvbench.exec.sim import SimExecutor
from kvbench.io.table import ColumnTable
from kvbench.metrics.kv_kinds import kv_kinds
from kvbench.metrics.step_totals import StepTotals
from kvbench.metrics.summary import summarize
from kvbench.output.provenance import provenance
from kvbench.output.results import RunResult
from kvbench.plugins import lookup
from kvbench.workload.arrivals import check_arrival_span

ROLES = ("prefill", "decode")
#: the request-table columns that add up over the two workers a request went through
ADDED_COLUMNS = ("num_computed_tokens", "num_recomputed_tokens", *EVENT_COLUMNS)
#: the TTFT's four parts, summing to it: (column, words)
TTFT_PARTS = (
    ("ttft_prefill_queue_s", "prefill queue"),
    ("ttft_prefill_s", "prefill"),
    ("ttft_transfer_s", "KV transfer"),
    ("ttft_first_decode_s", "first decode step"),
)


def execute_disagg(cfg: DictConfig, choices: dict | None, setup, labels) -> RunResult:
    """Run ``cfg`` as a disaggregated deployment and summarize it (see the module docstring).
    ``setup`` and ``labels`` are :mod:`kvbench.app.run`'s, which builds each worker as it builds a
    run (handed in: that module calls this one, and two modules never import each other)."""
    config = to_dataclass(DeploymentConfig, cfg.deployment, "deployment")
    config.validate()
    if cfg.mode != "sim":
        raise ConfigError("deployment=disagg runs in mode=sim only: real mode runs one engine on one GPU")
    setups = {role: [setup(role_config(cfg, config, role))] for role in ROLES}
    ranks = {role: setups[role][0].model.attention_dp for role in ROLES}
    counts = {"prefill": config.prefill_workers, "decode": config.decode_workers}
    num_engines = {role: counts[role] * ranks[role] for role in ROLES}
    for role in ROLES:  # one engine per attention-DP rank of every worker, each its own memory
        setups[role] += [another_engine(setups[role][0]) for _ in range(num_engines[role] - 1)]
    first = setups["prefill"][0]
    workload = first.workload_source.generate(np.random.default_rng(int(cfg.seed)))
    check_arrival_span(workload.arrival_s, "raise workload.rate_per_s or workload.rate_scale, or replay fewer requests")
    requests = requests_from_workload(workload, int(cfg.seed))
    for role in ROLES:
        setups[role][0].scheduler.check_fits(requests)
    gpus = {role: setups[role][0].model.tp for role in ROLES}  # per engine: one rank's TP group
    links = [
        link_for(
            first.hardware,
            config,
            prefill_gpus=gpus["prefill"] * ranks["prefill"],  # a whole worker: its ranks' GPUs
            decode_gpus=gpus["decode"] * ranks["decode"],
            prefill_tp=gpus["prefill"],
            decode_tp=gpus["decode"],
        )
        for _ in range(num_engines["prefill"])
    ]
    event_driven = bool(cfg.event_driven)
    workers = {
        role: [Worker(s.scheduler, SimExecutor(s.cost), role=role, event_driven=event_driven) for s in setups[role]]
        for role in ROLES
    }
    router = build_router(cfg.router)
    with progress_bar(workload.num_requests, "simulating", enabled=bool(cfg.progress), unit="requests") as advance:
        record = Deployment(
            workers["prefill"],
            workers["decode"],
            router,
            links,
            transfer=config.transfer,
            num_layers=first.model.num_layers,
            max_in_flight=workload.max_concurrency,
            on_finished=advance,
        ).run(requests)
    return _result(cfg, config, labels(cfg, first, choices), setups, gpus, links, record, workload.max_concurrency)


def another_engine(s):
    """A second engine like ``s`` (a :class:`~kvbench.app.run.RunSetup` not run yet): its own
    scheduler, allocator, queue and swap pool, the same clock, model and hardware. Copied, not built
    again: building a profiled clock reads its tables (most of a second each), and the copy is the
    same objects a second ``setup`` would build."""
    shared = (s.cost, s.model, s.hardware, s.efficiency, s.kernel, s.workload_source, s.model_config)
    scheduler = copy.deepcopy(s.scheduler, {id(obj): obj for obj in shared})
    return dataclasses.replace(s, scheduler=scheduler, allocator=scheduler.allocator)


def merged_requests(record: DeploymentRecord) -> ColumnTable:
    """One row per request: the decode worker's row (its output, its decode's preemptions), with the
    client's arrival, the prefill worker's queueing and compute, the counts of both added, the
    request's path (:data:`~kvbench.deploy.loop.PATH_COLUMNS`) and its TTFT's parts."""
    prefill, decode = _stacked(record.prefill), _stacked(record.decode)
    paths = record.paths
    ids = np.asarray(paths["request_id"], dtype=np.int64)
    for name, table in (("prefill", prefill), ("decode", decode)):
        if not np.array_equal(np.asarray(table["request_id"], dtype=np.int64), ids):
            raise RuntimeError(f"the {name} workers' request tables do not hold every request once")
    columns = {name: np.asarray(decode[name]) for name in decode.columns}
    columns["arrival_s"] = np.asarray(paths["arrival_s"], dtype=np.float64)
    for name in ("boundary_s", "admitted_s", "prefill_compute_s", "cached_prompt_tokens"):
        if name in prefill.columns:
            columns[name] = np.asarray(prefill[name])
    for name in ADDED_COLUMNS:
        if name in decode.columns:
            columns[name] = np.asarray(decode[name]) + np.asarray(prefill[name])
    for name in PATH_COLUMNS[1:]:
        if name != "arrival_s":
            columns[name] = np.asarray(paths[name])
    arrival = columns["arrival_s"]
    start, end = columns["prefill_start_s"], columns["prefill_end_s"]
    landed, first = columns["transfer_end_s"], columns["first_token_s"]
    columns["ttft_prefill_queue_s"] = start - arrival
    columns["ttft_prefill_s"] = end - start
    columns["ttft_transfer_s"] = landed - end  # the exposed part: waiting for decode memory, the link, the copy
    columns["ttft_first_decode_s"] = first - landed
    columns["transfer_s"] = landed - columns["transfer_start_s"]
    return ColumnTable(columns)


def _stacked(records) -> ColumnTable:
    """The request tables of several workers as one, in request order."""
    tables = [r.request_columns for r in records]
    names = tables[0].columns
    joined = {name: np.concatenate([np.asarray(t[name]) for t in tables]) for name in names}
    order = np.argsort(joined["request_id"], kind="stable")
    return ColumnTable({name: values[order] for name, values in joined.items()})


def _in_flight_summary(paths: ColumnTable, duration_s: float) -> dict:
    times, in_flight = kv_in_flight(paths)
    if not len(times):
        return {"kv_in_flight_peak_bytes": 0, "kv_in_flight_mean_bytes": 0.0}
    held_s = np.diff(times)
    mean = math.fsum((held_s * in_flight[:-1]).tolist()) / duration_s if duration_s > 0 else math.nan
    return {"kv_in_flight_peak_bytes": int(in_flight.max()), "kv_in_flight_mean_bytes": mean}


def worker_rows(setups: dict[str, list], record: DeploymentRecord, duration_s: float) -> list[dict]:
    """One row per engine: its role and index, its memory over the run and how busy it was."""
    rows = []
    for role, records in (("prefill", record.prefill), ("decode", record.decode)):
        for k, (s, rec) in enumerate(zip(setups[role], records)):
            totals = StepTotals(s.budget_bytes, s.model.kv_bytes_per_token, kv_kinds(s.model))
            steps = rec.step_columns
            totals.add({name: np.asarray(steps[name]) for name in steps.columns})
            memory = totals.summary()
            busy_s = math.fsum(np.asarray(steps["duration_s"], dtype=np.float64).tolist())
            rows.append(
                {
                    "worker": f"{role}{k}",
                    "role": role,
                    "gpus": s.model.tp,
                    "kv_budget_bytes": s.budget_bytes,
                    "num_requests": len(rec.request_columns["request_id"]),
                    "busy_fraction": busy_s / duration_s if duration_s > 0 else math.nan,
                    "utilization_mean": memory.get("utilization_mean", math.nan),
                    "block_utilization_mean": memory.get("block_utilization_mean", math.nan),
                    "peak_allocated_bytes": memory.get("peak_allocated_bytes", math.nan),
                    "peak_token_bytes": memory.get("peak_token_bytes", math.nan),
                    "mean_concurrency": memory.get("mean_concurrency", math.nan),
                    "peak_concurrency": memory.get("peak_concurrency", math.nan),
                }
            )
    return rows


def _result(cfg, config: DeploymentConfig, summary: dict, setups, gpus, links, record, max_concurrency) -> RunResult:
    first = setups["prefill"][0]
    requests = merged_requests(record)
    summary.update(
        summarize(
            requests,
            None,
            budget_bytes=first.budget_bytes,
            kv_bytes_per_token=first.model.kv_bytes_per_token,
            slo=first.slo,
            max_concurrency=max_concurrency,
        )
    )
    num_gpus = sum(gpus[role] * len(setups[role]) for role in ROLES)
    duration_s = summary["duration_s"]
    summary.update(
        deployment="disagg",
        prefill_workers=config.prefill_workers,
        decode_workers=config.decode_workers,
        prefill_engines=len(setups["prefill"]),
        decode_engines=len(setups["decode"]),
        prefill_gpus_per_engine=gpus["prefill"],
        decode_gpus_per_engine=gpus["decode"],
        num_gpus=num_gpus,
        router=cfg.router["name"],
        transfer=config.transfer,
        link=links[0].kind,
        link_bytes_per_s=links[0].bytes_per_s,
        link_latency_s=links[0].latency_s,
        link_source=links[0].source,
        goodput_requests_per_s_per_gpu=summary["goodput_requests_per_s"] / num_gpus,
        throughput_tokens_per_s_per_gpu=summary["throughput_tokens_per_s"] / num_gpus,
    )
    done = np.asarray(requests["finish_s"]) >= 0
    for column, _ in TTFT_PARTS:
        values = np.asarray(requests[column], dtype=np.float64)[done]
        summary[f"{column[:-2]}_mean_s"] = math.fsum(values.tolist()) / len(values) if len(values) else math.nan
    summary.update(_in_flight_summary(record.paths, duration_s))
    rows = worker_rows(setups, record, duration_s)
    for row in rows:
        for key in ("kv_budget_bytes", "busy_fraction", "utilization_mean", "peak_allocated_bytes", "mean_concurrency"):
            summary[f"{row['worker']}_{key}"] = row[key]
    summary.update(provenance())
    steps = _worker_steps(record)
    return RunResult(
        config=OmegaConf.to_container(cfg, resolve=True),
        summary=summary,
        requests=requests,
        steps=steps,
        refusals=_stacked_refusals(record),
    )


def _worker_steps(record: DeploymentRecord) -> ColumnTable:
    """Every engine's step table, one after another, with the engine named in ``worker`` and the
    deployment's KV in flight on the links when the step starts (``kv_in_flight_bytes``)."""
    parts = [(f"prefill{k}", r.step_columns) for k, r in enumerate(record.prefill)]
    parts += [(f"decode{k}", r.step_columns) for k, r in enumerate(record.decode)]
    names = parts[0][1].columns
    columns = {"worker": np.concatenate([np.full(len(t[names[0]]), w, dtype=object) for w, t in parts])}
    for name in names:
        columns[name] = np.concatenate([np.asarray(t[name]) for _, t in parts])
    # the KV on the links when each step (or run of steps) starts: the deployment's, on every row
    times, in_flight = kv_in_flight(record.paths)
    at = np.searchsorted(times, np.asarray(columns["start_s"], dtype=np.float64), side="right") - 1
    columns["kv_in_flight_bytes"] = np.where(at >= 0, in_flight[np.maximum(at, 0)] if len(times) else 0, 0)
    return ColumnTable(columns)


def _stacked_refusals(record: DeploymentRecord) -> ColumnTable:
    tables = [r.refusal_columns for r in (*record.prefill, *record.decode)]
    names = tables[0].columns
    return ColumnTable({name: np.concatenate([np.asarray(t[name]) for t in tables]) for name in names})


def build_router(node) -> Router:
    """The router ``node`` (the composed ``router`` group) names, with its options checked."""
    if node is None or "name" not in node:
        raise ConfigError("router.name is missing: pick one with router=<name>")
    cls = lookup("router", node["name"])
    return cls(plugin_config(cls, node, "router"))
