"""aiconfigurator-core's own TTFT/TPOT estimate for silicon rows, run on the CPU, to show beside kvbench's.

What it calls. ``aiconfigurator-core`` (NVIDIA, Apache-2.0; imported as ``aiconfigurator_core``) ships
its estimator SDK, perf tables measured per (GPU, framework, framework version) and a compiled Rust
step engine, and needs neither a GPU nor the network. The upper ``aiconfigurator`` package's
``cli estimate`` in agg mode is a thin driver over that SDK, and this module drives the same SDK
calls in the same order, without that package:

1. ``config_builders.build_model_config`` (parallelism and the row's quant modes, the others left
   unset) and ``apply_nextn(0)`` (no speculative decoding);
2. ``perf_database.get_database_view(system, backend, version, database_mode="SILICON")``;
3. ``models.resolve_context_fmha_by_data``, ``resolve_dsv4_moe_arch`` and
   ``resolve_nvfp4_for_system``, which settle what was left unset from the checkpoint config and
   the perf data, as the CLI does before the model is built;
4. ``models.get_model`` (the op graph from the HF config the package has cached) and
   ``backends.factory.get_backend``;
5. ``backend.run_agg(model, database, RuntimeConfig(isl, osl, batch_size), ctx_tokens=isl)``, the
   continuous-batching estimate of one operating point. It returns TTFT and TPOT in ms and an
   OOM verdict. Like the CLI, a row whose weights do not fit is an error (``oom: ...``). A row
   whose KV cache goes over the budget still gets its estimate, with a note in ``aic_note``.

Objects 2 and 4 are built once per (model, system, backend, version, quant modes, parallelism),
together with the compiled engine, and are kept across calls (``clear_cache`` drops them). Rows
that differ only in isl/osl/concurrency reuse them.

How a silicon row maps to those inputs:

* ``model_path``: the HF config the package caches under ``model_configs/``. ``MODEL_ALIASES`` maps
  a row's checkpoint to the cached config with the same architecture when the row's own name is
  not cached: ``meta-llama/Llama-3.1-8B-Instruct`` and ``nvidia/Llama-3.1-8B-Instruct-FP8`` both
  map to ``meta-llama/Meta-Llama-3.1-8B``, and ``meta-llama/Llama-3.1-70B`` maps to
  ``meta-llama/Meta-Llama-3.1-70B``. Nothing is downloaded: a model with no cached config gets a
  status instead.
* ``system`` and ``backend``: passed as they are.
* ``backend_version``: the package only answers queries for its queryable versions (the
  "current"/"previous"/"next" slots in ``systems/query_versions.yaml``). Older directories hold
  fragments used to fill gaps. The row's version is mapped to the nearest queryable one, compared
  (major, minor, micro, pre/post) component by component; a missing version gets "current", which
  is the CLI's default. Column ``aic_backend_version`` records the version used.
* ``precision``: where the package caches the checkpoint a precision is served from
  (``PRECISION_CHECKPOINTS``: GLM-5's FP8 and NVFP4 releases, the NVFP4 releases of Qwen3.5,
  MiniMax-M2.5 and Kimi-K2.5), that config is the model, so its quantization config settles the
  modes the row leaves open (the KV cache's among them).
* ``gemm_quant_mode`` (and ``moe_quant_mode`` for MoE models): passed by name, except for gpt-oss
  (``INFERRED_QUANT``: its rows say nvfp4 for MXFP4 experts, so both modes are inferred from its
  checkpoint: bf16 GEMMs, ``w4a16_mxfp4`` experts) and an ``int4_wo`` GEMM mode (Kimi-K2.5: its
  checkpoint quantizes the experts only; the GEMM mode is inferred, bf16). NaN means unset, so
  the mode is inferred from the checkpoint config. For the admitted dense checkpoints that means
  bfloat16, which is what NaN stands for in the sample (its precision column is NaN on the same
  rows). KV-cache, FMHA and comm modes are never given: aiconfigurator infers them from the
  checkpoint config (no KV quantization there means a bfloat16 KV cache, which is also what the
  runtimes' default ``kv_cache_dtype=auto`` gives). The modes the estimate ran with go to
  ``aic_quant``.
* ``isl``, ``osl``; ``batch_size`` (the client concurrency) is the agg batch size. The context-token
  budget per step is ``isl``, the CLI's default, unless ``ctx_tokens`` is passed.
* ``tp_size``, ``pp_size`` and ``attention_dp_size`` (missing means 1); ``moe_tp_size`` and
  ``moe_ep_size`` (missing or 0: resolved by the SDK's ``ModelConfig.resolve_moe_parallelism``)
  count for MoE models only. ``batch_size`` is per attention-DP rank, the SDK's own convention
  (``run_agg`` reports ``concurrency = batch_size x attention_dp_size``).

Each row's exceptions are caught and turned into a one-line ``aic_status``, and its predictions are
then NaN.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

#: a row's checkpoint -> the cached HF config of the same architecture, used when the row's own
#: name has no cached config (the Instruct / FP8 checkpoints share the base model's shapes; the
#: FP8 checkpoint's quantization comes from the row's gemm_quant_mode instead)
MODEL_ALIASES: dict[str, str] = {
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    # NVIDIA's NVFP4 checkpoints and GLM-5 under its former organisation name: the same shapes as
    # the cached config; the row's gemm/moe_quant_mode give the precision
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "zhipuai/GLM-5": "zai-org/GLM-5",
}
#: (row's checkpoint, row's precision) -> the cached config of the checkpoint that precision is
#: served from, where the package caches it: its quantization config then sets what the row's quant
#: columns leave open (the KV cache's precision among them), as for a CLI run on that checkpoint
PRECISION_CHECKPOINTS: dict[tuple[str, str], str] = {
    ("zhipuai/GLM-5", "fp8"): "zai-org/GLM-5-FP8",
    ("zhipuai/GLM-5", "fp4"): "nvidia/GLM-5-NVFP4",
    ("Qwen/Qwen3.5-397B-A17B", "fp4"): "nvidia/Qwen3.5-397B-A17B-NVFP4",
    ("MiniMaxAI/MiniMax-M2.5", "fp4"): "nvidia/MiniMax-M2.5-NVFP4",
    ("moonshotai/Kimi-K2.5", "fp4"): "nvidia/Kimi-K2.5-NVFP4",
}
#: checkpoints whose quant columns the estimate does not take: gpt-oss's rows say nvfp4/nvfp4 (the
#: precision family) for a checkpoint whose experts are MXFP4 and whose other weights are bf16, so
#: its modes are inferred from its cached config (mxfp4: gemm bfloat16, MoE w4a16_mxfp4), as kvbench
#: replays it
INFERRED_QUANT = frozenset({"openai/gpt-oss-120b"})
#: a gemm_quant_mode the estimate leaves to the checkpoint: Kimi-K2.5's int4 rows label both parts
#: int4_wo, but its compressed-tensors config quantizes the routed experts only (the attention and
#: shared weights stay bf16), which is what aiconfigurator infers when the GEMM mode is unset
GEMM_FROM_CHECKPOINT = frozenset({"int4_wo"})

#: the columns estimate_rows returns, in order
OUTPUT_COLUMNS = ("aic_ttft_ms", "aic_tpot_ms", "aic_status", "aic_backend_version", "aic_quant", "aic_note")

#: the aiconfigurator CLI's disagg estimate (the ``aiconfigurator`` package 0.12.0, which this module
#: does not import): the latency correction scales its ``cli/api.py`` sets on the session
#: (DEFAULT_PREFILL/DECODE_LATENCY_CORRECTION_SCALE) and the TTFT factor its run_disagg applies
#: for "concurrent prefill queueing" (``sdk/picking.py`` _AUTOSCALE_TTFT_CORRECTION_FACTOR). They
#: are aiconfigurator's own constants, reproduced so its estimate is shown as it gives it; kvbench's
#: replays use none of them
DISAGG_PREFILL_SCALE = 1.1
DISAGG_DECODE_SCALE = 1.08
DISAGG_TTFT_QUEUEING = 1.8

_LOGGER_NAME = "aiconfigurator_core"
#: (model, system, backend, version, gemm, moe, tp, pp, dp, moe_tp, moe_ep) -> what the estimate needs,
#: or why it could not be built (so a failing configuration is not rebuilt for each of its rows)
_WORKERS: dict[tuple, _Worker | str] = {}
_STATUS_MAX = 200


def silicon_sample_path() -> Path:
    """The installed package's ``systems/silicon_sample.csv``."""
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"


@functools.cache
def aic_available() -> str | None:
    """None when aiconfigurator_core imports and can estimate one small point here, else the reason (one line)."""
    try:
        _sdk()
    except Exception as exc:  # any import failure is a reason, not a crash
        return _one_line(f"aiconfigurator_core does not import: {type(exc).__name__}: {exc}")
    smoke = pd.DataFrame(
        [
            {
                "model_path": "meta-llama/Meta-Llama-3.1-8B",
                "system": "h100_sxm",
                "backend": "trtllm",
                "backend_version": None,
                "isl": 128,
                "osl": 8,
                "batch_size": 1,
                "tp_size": 1,
            }
        ]
    )
    try:
        out = estimate_rows(smoke).iloc[0]
    except Exception as exc:
        return _one_line(f"aiconfigurator_core estimator failed: {type(exc).__name__}: {exc}")
    if out["aic_status"] != "ok":
        return _one_line(f"aiconfigurator_core estimator failed: {out['aic_status']}")
    if not (math.isfinite(out["aic_ttft_ms"]) and out["aic_ttft_ms"] > 0):
        return "aiconfigurator_core estimator returned a non-positive TTFT"
    return None


def estimate_rows(rows: pd.DataFrame, *, ctx_tokens: int | None = None, quiet: bool = True) -> pd.DataFrame:
    """aiconfigurator-core's agg-mode estimate for each silicon row.

    ``rows`` needs the silicon_sample.csv columns model_path, system, backend, isl, osl, batch_size and
    tp_size. backend_version, gemm_quant_mode, moe_quant_mode, pp_size, attention_dp_size,
    moe_tp_size and moe_ep_size are optional, and NaN means unset. Returns a frame with the same index
    and ``OUTPUT_COLUMNS``: ``aic_ttft_ms`` and ``aic_tpot_ms`` (NaN unless ``aic_status == "ok"``),
    ``aic_status``, ``aic_backend_version`` (the perf-data version used), ``aic_quant`` (the
    gemm/kv/fmha modes the estimate ran with) and ``aic_note`` (a KV-cache budget warning, else "").
    ``ctx_tokens`` overrides the per-step context-token budget; None uses each row's isl, as the
    aiconfigurator CLI does. ``quiet`` holds the package's log output below ERROR while this runs.
    """
    out = pd.DataFrame(index=rows.index, columns=list(OUTPUT_COLUMNS), dtype=object)
    out["aic_ttft_ms"] = math.nan
    out["aic_tpot_ms"] = math.nan
    out["aic_note"] = ""
    try:
        sdk = _sdk()
    except Exception as exc:
        out["aic_status"] = _one_line(f"aiconfigurator_core does not import: {type(exc).__name__}: {exc}")
        return _typed(out)

    with _quiet_logs(quiet):
        for index, row in rows.iterrows():
            try:
                result = _estimate_one(sdk, _WORKERS, row, ctx_tokens)
            except Exception as exc:  # one row's failure must not stop the rest
                result = {"aic_status": _one_line(f"{type(exc).__name__}: {exc}")}
            for key, value in result.items():
                out.at[index, key] = value
    return _typed(out)


def clear_cache() -> None:
    """Drop the cached models, perf-database views and compiled engines (they are kept across calls)."""
    _WORKERS.clear()


# -- one row ----------------------------------------------------------------------------------------


@dataclass
class _Worker:
    """What one (model, system, backend, version, quant, parallelism) needs: built once, reused per row."""

    model: Any
    database: Any
    backend: Any
    version: str


def _estimate_one(sdk: _Sdk, workers: dict, row: pd.Series, ctx_tokens: int | None) -> dict[str, Any]:
    model_path = _text(row.get("model_path"))
    system = _text(row.get("system"))
    backend_name = _text(row.get("backend"))
    if not model_path or not system or not backend_name:
        return {"aic_status": "row lacks model_path, system or backend"}
    mode = _text(row.get("mode"))
    if mode is not None and mode not in ("agg", "disagg"):
        return {"aic_status": f"mode {mode} is not estimated (agg and disagg only)"}
    aic_model = _cached_model(sdk, model_path, _text(row.get("precision")))
    if aic_model is None:
        return {"aic_status": f"no cached model config for {model_path} (offline; nothing is downloaded)"}
    if backend_name not in sdk.backend_names:
        return {"aic_status": f"unknown backend {backend_name}"}

    requested_version = _text(row.get("backend_version"))
    version, why = _nearest_version(sdk, system, backend_name, requested_version)
    if version is None:
        return {"aic_status": why}

    isl, osl = _int(row.get("isl")), _int(row.get("osl"))
    batch = _int(row.get("batch_size")) if mode != "disagg" else 1
    if not isl or not osl or not batch or isl <= 0 or osl <= 0 or batch <= 0:
        return {"aic_status": "isl, osl and batch_size must be positive integers", "aic_backend_version": version}

    is_moe = sdk.check_is_moe(aic_model)
    gemm_mode, moe_mode = row.get("gemm_quant_mode"), row.get("moe_quant_mode")
    if model_path in INFERRED_QUANT:
        gemm_mode = moe_mode = None
    elif _text(gemm_mode) in GEMM_FROM_CHECKPOINT:
        gemm_mode = None
    gemm = _quant_name(gemm_mode, sdk.gemm_modes, "gemm_quant_mode")
    moe = _quant_name(moe_mode, sdk.moe_modes, "moe_quant_mode") if is_moe else None

    def worker_of(prefix: str) -> _Worker | str:
        layout = _layout(row, prefix, is_moe)
        key = (aic_model, system, backend_name, version, gemm, moe, *layout)
        worker = workers.get(key)
        if worker is None:
            try:
                worker = _build_worker(sdk, aic_model, system, backend_name, version, gemm, moe, *layout)
            except Exception as exc:  # remembered, so the same config is not rebuilt per row
                worker = _one_line(f"{type(exc).__name__}: {exc}")
            workers[key] = worker
        return worker

    if mode == "disagg":
        return _estimate_disagg(sdk, row, worker_of, isl, osl, version)
    worker = worker_of("")
    if isinstance(worker, str):
        return {"aic_status": worker, "aic_backend_version": version}
    tp, pp = _layout(row, "", is_moe)[:2]

    runtime = sdk.RuntimeConfig(isl=isl, osl=osl, batch_size=batch)
    summary = worker.backend.run_agg(
        worker.model, worker.database, runtime, ctx_tokens=int(ctx_tokens) if ctx_tokens else isl
    )
    result = summary.get_result_dict()
    base = {"aic_backend_version": version}
    if result is None:
        return {**base, "aic_status": "estimator returned no result"}
    base["aic_quant"] = f"gemm={result['gemm']} kv={result['kvcache']} fmha={result['fmha']}"
    if summary.check_oom():
        memory = summary.get_memory().get("total", math.nan)
        return {**base, "aic_status": _one_line(f"oom: {memory:.1f} GiB per GPU does not fit (tp={tp}, pp={pp})")}
    ttft, tpot = float(result["ttft"]), float(result["tpot"])
    if not (math.isfinite(ttft) and math.isfinite(tpot)):
        return {**base, "aic_status": "estimator returned a non-finite TTFT or TPOT"}
    note = ""
    if summary.check_kv_cache_oom():
        note = f"batch {batch} exceeds the estimated KV-cache capacity: the runtime would queue requests"
    return {**base, "aic_ttft_ms": ttft, "aic_tpot_ms": tpot, "aic_status": "ok", "aic_note": note}


def _layout(row: pd.Series, prefix: str, is_moe: bool) -> tuple[int, int, int, int | None, int | None]:
    """(tp, pp, attention_dp, moe_tp, moe_ep) of the row, or of its ``prefill_``/``decode_`` role."""
    tp = _int(row.get(f"{prefix}tp_size")) or 1
    pp = _int(row.get(f"{prefix}pp_size")) or 1
    dp = _int(row.get(f"{prefix}attention_dp_size")) or 1
    moe_tp = (_int(row.get(f"{prefix}moe_tp_size")) or None) if is_moe else None
    moe_ep = (_int(row.get(f"{prefix}moe_ep_size")) or None) if is_moe else None
    return tp, pp, dp, moe_tp, moe_ep


def _estimate_disagg(sdk: _Sdk, row: pd.Series, worker_of, isl: int, osl: int, version: str) -> dict[str, Any]:
    """A disaggregated row, as the aiconfigurator CLI's disagg estimate computes it (its
    ``DisaggInferenceSession.run_disagg``): TTFT is the prefill worker's ``static_ctx`` TTFT at
    ``prefill_batch_size`` times DISAGG_PREFILL_SCALE and DISAGG_TTFT_QUEUEING; TPOT the decode
    worker's ``static_gen`` TPOT at ``decode_batch_size`` times DISAGG_DECODE_SCALE. The worker
    counts and the KV transfer do not enter either."""
    base: dict[str, Any] = {"aic_backend_version": version}
    results = {}
    for prefix, mode, scale in (
        ("prefill_", "static_ctx", DISAGG_PREFILL_SCALE),
        ("decode_", "static_gen", DISAGG_DECODE_SCALE),
    ):
        batch = _int(row.get(f"{prefix}batch_size"))
        if not batch or batch <= 0:
            return {**base, "aic_status": f"{prefix}batch_size must be a positive integer"}
        worker = worker_of(prefix)
        if isinstance(worker, str):
            return {**base, "aic_status": f"{prefix.rstrip('_')}: {worker}"}
        runtime = sdk.RuntimeConfig(isl=isl, osl=osl, batch_size=batch)
        summary = worker.backend.run_static(
            worker.model, worker.database, runtime, mode=mode, latency_correction_scale=scale
        )
        result = summary.get_result_dict()
        if result is None:
            return {**base, "aic_status": f"{prefix.rstrip('_')}: estimator returned no result"}
        if summary.check_oom():
            memory = summary.get_memory().get("total", math.nan)
            return {**base, "aic_status": _one_line(f"oom: {prefix.rstrip('_')} worker needs {memory:.1f} GiB per GPU")}
        results[prefix] = (result, summary.check_kv_cache_oom())
    (ctx, ctx_kv_oom), (gen, gen_kv_oom) = results["prefill_"], results["decode_"]
    base["aic_quant"] = f"gemm={gen['gemm']} kv={gen['kvcache']} fmha={ctx['fmha']}"
    ttft, tpot = float(ctx["ttft"]) * DISAGG_TTFT_QUEUEING, float(gen["tpot"])
    if not (math.isfinite(ttft) and math.isfinite(tpot) and ttft > 0 and tpot > 0):
        return {**base, "aic_status": "estimator returned a non-finite or zero TTFT or TPOT"}
    note = "the decode batch exceeds the estimated KV-cache capacity" if gen_kv_oom or ctx_kv_oom else ""
    return {**base, "aic_ttft_ms": ttft, "aic_tpot_ms": tpot, "aic_status": "ok", "aic_note": note}


def _build_worker(
    sdk: _Sdk,
    model_path: str,
    system: str,
    backend_name: str,
    version: str,
    gemm: str | None,
    moe: str | None,
    tp: int,
    pp: int,
    dp: int,
    moe_tp: int | None,
    moe_ep: int | None,
) -> _Worker:
    database = sdk.get_database_view(system, backend_name, version, database_mode="SILICON")
    if database is None:
        raise LookupError(f"no perf data for {backend_name} {version} on {system}")
    if sdk.check_is_moe(model_path):
        moe_tp, moe_ep = sdk.ModelConfig(
            tp_size=tp, attention_dp_size=dp, moe_tp_size=moe_tp, moe_ep_size=moe_ep
        ).resolve_moe_parallelism()
    config = sdk.build_model_config(tp, pp, dp, moe_tp, moe_ep, gemm, None, None, moe, None)
    sdk.apply_nextn(config, 0)
    sdk.resolve_context_fmha_by_data(config, model_path, database, backend_name, is_context_role=True)
    sdk.resolve_dsv4_moe_arch(config, model_path, system_name=system, backend_name=backend_name)
    sdk.resolve_nvfp4_for_system(config, system, model_path)
    model = sdk.get_model(model_path, config, backend_name)
    return _Worker(model=model, database=database, backend=sdk.get_backend(backend_name), version=version)


# -- mapping helpers --------------------------------------------------------------------------------


def _cached_model(sdk: _Sdk, model_path: str, precision: str | None = None) -> str | None:
    """The cached HF config name for a row's checkpoint, or None (nothing is ever downloaded)."""
    served = PRECISION_CHECKPOINTS.get((model_path, precision or ""))
    if served in sdk.cached_models:
        return served
    if model_path in sdk.cached_models:
        return model_path
    alias = MODEL_ALIASES.get(model_path)
    return alias if alias in sdk.cached_models else None


def _nearest_version(sdk: _Sdk, system: str, backend: str, requested: str | None) -> tuple[str | None, str]:
    """(version to query, "") or (None, why not): the queryable version nearest to ``requested``."""
    queryable = sdk.queryable_versions(system, backend)
    if not queryable:
        wanted = f"{backend} {requested}" if requested else backend
        return None, f"no perf data for {wanted} on {system}"
    if requested in queryable.values():
        return requested, ""
    if not requested:
        return queryable.get("current") or next(iter(queryable.values())), ""
    target = _version_key(requested)
    best = min(queryable.values(), key=lambda v: (_version_distance(_version_key(v), target), v))
    return best, ""


def _version_key(version: str) -> tuple[int, ...]:
    """(major, minor, micro, pre-release rank, pre-release number, post) as integers."""
    text = version.strip().lower().lstrip("v")
    parts = [int(p) for p in re.findall(r"\d+", text.split("rc")[0].split(".post")[0].split(".dev")[0])[:3]]
    parts += [0] * (3 - len(parts))
    rc = re.search(r"rc(\d+)", text)
    dev = re.search(r"\.dev(\d+)", text)
    post = re.search(r"\.post(\d+)", text)
    if dev:
        pre = (0, int(dev.group(1)))
    elif rc:
        pre = (1, int(rc.group(1)))
    else:
        pre = (2, 0)
    return (*parts, *pre, int(post.group(1)) if post else 0)


def _version_distance(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(abs(x - y) for x, y in zip(a, b))


def _quant_name(value: Any, valid: frozenset[str], what: str) -> str | None:
    name = _text(value)
    if name is None:
        return None
    if name not in valid:
        raise ValueError(f"unsupported {what} {name!r}")
    return name


def _text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip()
    return text or None


def _int(value: Any) -> int | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number) or number != int(number):
        return None
    return int(number)


def _one_line(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= _STATUS_MAX else line[: _STATUS_MAX - 3] + "..."


def _typed(out: pd.DataFrame) -> pd.DataFrame:
    out["aic_ttft_ms"] = pd.to_numeric(out["aic_ttft_ms"], errors="coerce").astype(float)
    out["aic_tpot_ms"] = pd.to_numeric(out["aic_tpot_ms"], errors="coerce").astype(float)
    out["aic_status"] = out["aic_status"].fillna("not estimated").astype(str)
    for column in ("aic_backend_version", "aic_quant", "aic_note"):
        out[column] = out[column].where(out[column].notna(), "").astype(str)
    return out


@contextlib.contextmanager
def _quiet_logs(quiet: bool) -> Iterator[None]:
    """The package logs a warning per fallback table it loads; hold its logger at ERROR meanwhile."""
    if not quiet:
        yield
        return
    logger = logging.getLogger(_LOGGER_NAME)
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)


# -- the SDK, imported once -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sdk:
    build_model_config: Any
    apply_nextn: Any
    get_database_view: Any
    get_version_slots: Any
    resolve_context_fmha_by_data: Any
    resolve_dsv4_moe_arch: Any
    resolve_nvfp4_for_system: Any
    check_is_moe: Any
    get_model: Any
    get_backend: Any
    RuntimeConfig: Any
    ModelConfig: Any
    cached_models: frozenset[str]
    backend_names: frozenset[str]
    gemm_modes: frozenset[str]
    moe_modes: frozenset[str]

    def queryable_versions(self, system: str, backend: str) -> dict[str, str]:
        """{"current": v, ...}: the versions the package answers queries for; {} when it has none."""
        return dict(_queryable_versions(system, backend))


@functools.cache
def _queryable_versions(system: str, backend: str) -> tuple[tuple[str, str], ...]:
    try:
        slots = _sdk().get_version_slots(system, backend)
    except Exception:  # an unknown system is "no perf data", not a crash
        return ()
    return tuple((slots or {}).items())


@functools.cache
def _sdk() -> _Sdk:
    from aiconfigurator_core.sdk import common, perf_database
    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import ModelConfig, RuntimeConfig
    from aiconfigurator_core.sdk.config_builders import apply_nextn, build_model_config
    from aiconfigurator_core.sdk.models import (
        check_is_moe,
        get_model,
        resolve_context_fmha_by_data,
        resolve_dsv4_moe_arch,
        resolve_nvfp4_for_system,
    )

    return _Sdk(
        build_model_config=build_model_config,
        apply_nextn=apply_nextn,
        get_database_view=perf_database.get_database_view,
        get_version_slots=perf_database.get_version_slots,
        resolve_context_fmha_by_data=resolve_context_fmha_by_data,
        resolve_dsv4_moe_arch=resolve_dsv4_moe_arch,
        resolve_nvfp4_for_system=resolve_nvfp4_for_system,
        check_is_moe=functools.cache(check_is_moe),
        get_model=get_model,
        get_backend=get_backend,
        RuntimeConfig=RuntimeConfig,
        ModelConfig=ModelConfig,
        cached_models=frozenset(common.DefaultHFModels),
        backend_names=frozenset(b.name for b in common.BackendName),
        gemm_modes=frozenset(m.name for m in common.GEMMQuantMode),
        moe_modes=frozenset(m.name for m in common.MoEQuantMode),
    )
