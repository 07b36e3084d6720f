"""Public end-to-end measurements of real engines, and the kvbench run that replays each one.

aiconfigurator-core's ``systems/silicon_sample.csv`` holds TTFT and TPOT measured on real vLLM,
SGLang and TRT-LLM deployments (one row per model, GPU, engine and version, precision per part,
prompt and output length ``isl``/``osl``, client concurrency ``batch_size`` and the layout
``tp_size``, ``attention_dp_size``, ``moe_tp_size``, ``moe_ep_size``). kvbench replays every
aggregated row (prefill and decode on the same GPUs) whose model has a kvbench config, whose GPU
has a hardware config and measured tables, and whose engine has a measured kernel there; every
other row is counted by a one-word reason (:data:`REASONS`).

A row becomes one kvbench run:

* the layout: ``model.tp = tp_size``, ``model.attention_dp = attention_dp_size`` and
  ``model.ep = moe_ep_size`` (missing or 0: 1), the contract of :mod:`kvbench.specs` being
  aiconfigurator's: ``tp x attention_dp = moe_tp x moe_ep`` GPUs (a MoE row that breaks it is
  refused as ``layout``; a dense model's MoE columns mean nothing and are not read);
* the precision per part (:func:`precision`): ``gemm_quant_mode`` -> ``model.dtype`` (the weights
  outside the routed experts) and the GEMM table, ``moe_quant_mode`` -> ``model.moe_dtype`` (an
  fp8 label on a block-scaled FP8 checkpoint is fp8_block: :data:`BLOCK_FP8_CHECKPOINTS`), and
  the KV cache in FP8 exactly where the checkpoint declares it (NVIDIA's per-tensor FP8 and NVFP4
  releases: :data:`FP8_KV_GEMMS`), else in bf16, as the engines' ``kv_cache_dtype=auto`` and
  aiconfigurator's inference both do;
* the engine's measured kernel (:data:`KERNELS`), the closed-loop client of ``vllm bench serve
  --max-concurrency`` (each request of exactly ``isl`` prompt and ``osl`` output tokens), and the
  engines' shared scheduling defaults: chunked prefill with 8,192 tokens per step and no cap on
  sequences below the concurrency.

Attention data parallelism. ``batch_size`` is the concurrency PER RANK, as aiconfigurator
defines it (``run_agg`` reports ``concurrency = batch_size x attention_dp_size``) and as the
sample records it: its ``silicon_data_source`` gives the client's ``silicon_concurrency``, equal
to ``batch_size x attention_dp_size`` on 168 of the 169 aggregated DP rows of aiconfigurator-core
0.12.0. The replay's client is the deployment's: ``batch_size x attention_dp_size`` requests in
flight, ``WAVES`` times that many sent; kvbench simulates one rank, which takes its round-robin
share (:mod:`kvbench.workload.dp_split`: ``batch_size`` in flight), and prices the MoE layers at
the tokens of all ranks.

The client sends ``WAVES`` times the concurrency and every request counts, as ``vllm bench
serve`` counts them (no warm-up): the sample does not record how many requests each benchmark
sent, and the mean TTFT depends on it (the first wave arrives at once and queues behind its own
prompts; later requests join a running batch).

Nothing here is fitted to the rows: every number a replay prints comes from the model's config,
the hardware config and the measured kernel tables (:data:`FITTED`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources

import yaml

from kvbench.errors import ConfigError
from kvbench.specs import profiles

#: the silicon rows' checkpoint -> kvbench's model config. The NVFP4/FP8 checkpoints of a model
#: share its architecture (their precision comes from the row's quant columns), and
#: ``nvidia/DeepSeek-V3.1-NVFP4`` replays on ``deepseek-v3``: V3.1 keeps V3's config.json shapes
#: (61 layers, 256 routed experts of 2,048, MLA with kv_lora_rank 512); only its training differs.
MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama3.1-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama3.1-8b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "nvidia/Qwen3-32B-NVFP4": "qwen3-32b",
    "meta-llama/Llama-3.1-70B": "llama3.1-70b",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1": "deepseek-r1",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-r1",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "Qwen/Qwen3.5-397B-A17B": "qwen3.5-397b-a17b",
    "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5",
    "moonshotai/Kimi-K2.5": "kimi-k2.5",
    "zhipuai/GLM-5": "glm-5",
}
#: the package's system -> kvbench's hardware config (the same GPU as measured)
HARDWARE = {
    "a100_sxm": "a100-80gb",
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200-sxm",
    "b300_sxm": "b300-sxm",
    "gb200": "gb200",
    "gb300": "gb300",
}
#: engine -> kvbench's measured kernel on each system. A row is replayed only where that kernel's
#: tables cover the system (``measured.sources``); on Blackwell the contract's names are used, so a
#: row waits (``unmeasured-engine``) until the kernel plugin lists the system
BLACKWELL = ("b200_sxm", "b300_sxm", "gb200", "gb300")
KERNELS = {
    "vllm": {
        "a100_sxm": "vllm_fa2",
        "h100_sxm": "vllm_fa3",
        "h200_sxm": "vllm_fa3",
        **dict.fromkeys(BLACKWELL, "vllm_fa3"),
    },
    "sglang": {"h100_sxm": "sglang_fa3", "h200_sxm": "sglang_fa3", **dict.fromkeys(BLACKWELL, "sglang_fa3")},
    "trtllm": {"a100_sxm": "trtllm", "h100_sxm": "trtllm", "h200_sxm": "trtllm", **dict.fromkeys(BLACKWELL, "trtllm")},
}
#: requests the closed-loop client sends, in multiples of its concurrency
WAVES = 5
#: the token budget per step of chunked prefill in the three engines' serving defaults
MAX_NUM_BATCHED_TOKENS = 8192
CSV_NAME = "silicon_sample.csv"
#: the columns of the layout and the experts' precision, read where present (an excerpt written
#: before they were needed lacks them; missing means unset: 1, or the checkpoint's own precision)
LAYOUT_COLUMNS = ("moe_quant_mode", "attention_dp_size", "moe_tp_size", "moe_ep_size")
#: the columns a replay reads (the excerpt kvbench ships keeps only these)
COLUMNS = (
    "id",
    "backend",
    "backend_version",
    "model_path",
    "system",
    "precision",
    "mode",
    "isl",
    "osl",
    "gemm_quant_mode",
    "batch_size",
    "tp_size",
    "pp_size",
    "silicon_ttft_ms",
    "silicon_tpot_ms",
    *LAYOUT_COLUMNS,
)
#: every reason a row is not replayed, one word each, in the order they are checked
REASONS = {
    "disaggregated": "prefill and decode on separate workers (mode disagg): the next issue",
    "unmodelled-model": "the checkpoint has no kvbench model config (MODELS, conf/model/)",
    "unmodelled-gpu": "the GPU has no kvbench hardware config or no measured tables (profiles.SYSTEMS)",
    "unmeasured-engine": "the engine's kernel is not measured on this GPU (KERNELS, the kernel's tables)",
    "incomplete": "a measurement, the concurrency, a length or the TP size is missing",
    "pipeline": "pipeline parallelism (pp_size > 1)",
    "multinode": "more GPUs (tp x attention_dp) than one node of the system holds, beyond what the comm tables measure",
    "layout": "tp x attention_dp differs from moe_tp x moe_ep, or a dense model with attention DP",
    "precision": "a quant mode kvbench does not map, or a gpt-oss row not in its checkpoint's MXFP4",
}
#: what was learned from the silicon rows: nothing (the report prints this statement)
FITTED = (
    "fitted: nothing. No constant in kvbench's clocks is learned from the silicon rows; each "
    "replay is priced from the model and hardware configs and the measured kernel tables alone."
)

#: the row's gemm_quant_mode -> model.dtype (the weights outside the routed experts) and the GEMM
#: table; int4_wo (Kimi-K2.5's compressed-tensors checkpoint) quantizes the experts only
GEMM_DTYPES = {
    "bfloat16": ("bfloat16", "bfloat16"),
    "fp8": ("float8", "fp8"),
    "fp8_block": ("fp8_block", "fp8_block"),
    "nvfp4": ("nvfp4", "nvfp4"),
    "int4_wo": ("bfloat16", "bfloat16"),
}
#: the row's moe_quant_mode -> model.moe_dtype
MOE_DTYPES = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4", "int4_wo": "int4"}
#: checkpoints that declare an FP8 KV cache: NVIDIA's ModelOpt per-tensor FP8 and NVFP4 releases
#: (``kv_cache_quant_algo: FP8`` in their hf_quant_config.json). A block-scaled FP8 checkpoint
#: (DeepSeek's, Qwen's, MiniMax's, GLM's own) declares no KV quantization, nor do mxfp4, int4 or
#: bf16 ones: the engines' ``kv_cache_dtype=auto`` then keeps the KV cache in bf16, as does
#: aiconfigurator's inference (its default when the checkpoint names no KV algorithm)
FP8_KV_GEMMS = ("fp8", "nvfp4")
#: checkpoints whose FP8 weights are block-scaled: their config.json's quantization_config has
#: ``weight_block_size: [128, 128]`` (as the package caches them: DeepSeek-V3/R1, Qwen3-235B-A22B-FP8,
#: MiniMax-M2.5, GLM-5-FP8), so the engines run block-scaled GEMMs and experts on them whatever the
#: row's fp8 label says (the sample labels most of their rows plain fp8)
BLOCK_FP8_CHECKPOINTS = frozenset(
    {
        "deepseek-ai/DeepSeek-V3",
        "deepseek-ai/DeepSeek-R1",
        "Qwen/Qwen3-235B-A22B-FP8",
        "MiniMaxAI/MiniMax-M2.5",
        "zhipuai/GLM-5",
    }
)
#: gpt-oss's checkpoint stores its routed experts in MXFP4 and the rest in bf16; the sample labels
#: its fp4 rows nvfp4/nvfp4, which is the precision column's family, not the format that runs
MXFP4_MODELS = ("openai/gpt-oss-120b",)


@dataclass(frozen=True)
class Precision:
    """One row's precision per part, as kvbench's overrides name it."""

    dtype: str  #: model.dtype: the attention, dense and shared-expert weights
    gemm: str  #: kernel.gemm: the GEMM table of those weights
    moe_dtype: str | None  #: model.moe_dtype: the routed experts (None for a dense model)
    kv_dtype: str  #: model.kv_dtype


def _text(value) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip()
    return text or None


def _is_set(value) -> bool:
    try:
        return float(value) >= 1
    except (TypeError, ValueError):
        return False


def _size(value) -> int:
    """A layout column as a GPU count: missing or 0 means 1 (unset in the sample)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 1
    return 1 if math.isnan(number) or number < 1 else int(number)


def precision(row, moe: bool) -> Precision | None:
    """The row's precision per part, or None when kvbench does not map its quant modes."""
    # no gemm_quant_mode: the checkpoint's own precision (bf16, or per-tensor fp8 where the row says fp8)
    gemm_mode = _text(row.get("gemm_quant_mode")) or ("fp8" if str(row.get("precision")) == "fp8" else "bfloat16")
    moe_mode = _text(row.get("moe_quant_mode")) or gemm_mode
    if row["model_path"] in MXFP4_MODELS:
        if str(row.get("precision")) != "fp4":
            return None
        return Precision("bfloat16", "bfloat16", "mxfp4", "bfloat16")
    if row["model_path"] in BLOCK_FP8_CHECKPOINTS:
        gemm_mode, moe_mode = (("fp8_block" if m == "fp8" else m) for m in (gemm_mode, moe_mode))
    if gemm_mode not in GEMM_DTYPES or (moe and moe_mode not in MOE_DTYPES):
        return None
    dtype, gemm = GEMM_DTYPES[gemm_mode]
    kv = "float8" if gemm_mode in FP8_KV_GEMMS else "bfloat16"
    return Precision(dtype, gemm, MOE_DTYPES[moe_mode] if moe else None, kv)


@functools.cache
def _config_exists(group: str, name: str) -> bool:
    return resources.files("kvbench.conf").joinpath(group, f"{name}.yaml").is_file()


@functools.cache
def architecture(model: str) -> str:
    """The architecture of a kvbench model config, from its ModelSpec: dense, moe, mla-moe,
    mla-sparse-moe, window-sinks-moe or linear-hybrid-moe (``-moe`` dropped for a dense one)."""
    from kvbench.api import compose, model_spec_of

    return model_spec_of(compose([f"model={model}"])[0]).architecture


@functools.cache
def is_moe(model: str) -> bool:
    return architecture(model) != "dense"


@functools.cache
def _kernel_systems(kernel: str) -> frozenset[str]:
    """The systems a measured kernel's tables cover (empty for an unknown kernel)."""
    from kvbench.plugins import registry

    cls = registry("kernel").get(kernel)
    measured = getattr(cls, "measured", None)
    return frozenset(measured.sources) if measured is not None else frozenset()


@functools.cache
def gpus_per_node(system: str) -> int | None:
    """``num_gpus_per_node`` of the package's ``<system>.yaml`` (None without the file)."""
    path = profiles.table_root().systems_dir / f"{system}.yaml"
    if not path.is_file():
        return None
    node = yaml.safe_load(path.read_text()).get("node") or {}
    return int(node.get("num_gpus_per_node", 0)) or None


def kernel_for(backend: str, system: str) -> str | None:
    """The measured kernel that replays ``backend`` on ``system``, or None where none is measured."""
    name = KERNELS.get(backend, {}).get(system)
    return name if name is not None and system in _kernel_systems(name) else None


def read_silicon():
    """The measurements (pandas DataFrame) and the words that name their source."""
    import pandas as pd

    root = profiles.table_root()
    path = root.systems_dir / CSV_NAME if not root.excerpt else profiles.EXCERPT_DIR / CSV_NAME
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    missing = [c for c in COLUMNS if c not in frame.columns and c not in LAYOUT_COLUMNS]
    if missing:
        raise ConfigError(f"{path} lacks the columns {', '.join(missing)}: is {root.label} the version kvbench reads?")
    for column in LAYOUT_COLUMNS:
        if column not in frame.columns:
            frame[column] = math.nan
    return frame, f"{root.label} {CSV_NAME}"


def _refusal(row) -> str | None:
    """The one word (a key of REASONS) that says why kvbench cannot replay ``row``, or None."""
    if row["mode"] != "agg":
        return "disaggregated"
    model = MODELS.get(row["model_path"])
    if model is None or not _config_exists("model", model):
        return "unmodelled-model"
    hardware = HARDWARE.get(row["system"])
    if hardware is None or not _config_exists("hardware", hardware) or profiles.SYSTEMS.get(hardware) != row["system"]:
        return "unmodelled-gpu"
    if kernel_for(row["backend"], row["system"]) is None:
        return "unmeasured-engine"
    needed = ("silicon_ttft_ms", "silicon_tpot_ms", "batch_size", "isl", "osl", "tp_size")
    if any(
        not (isinstance(row[c], (int, float)) and math.isfinite(float(row[c])) and float(row[c]) > 0) for c in needed
    ):
        return "incomplete"
    if _size(row["pp_size"]) != 1:
        return "pipeline"
    tp, dp, ep = int(row["tp_size"]), _size(row["attention_dp_size"]), _size(row["moe_ep_size"])
    node = gpus_per_node(row["system"])
    if node is not None and tp * dp > node:
        return "multinode"
    moe = is_moe(model)
    if moe:
        # an unset moe_tp_size (missing or 0) is whatever the GPUs leave: tp x attention_dp / ep
        moe_tp = _size(row["moe_tp_size"]) if _is_set(row["moe_tp_size"]) else tp * dp // ep
        if tp * dp != moe_tp * ep:
            return "layout"
    elif dp > 1:
        return "layout"
    if precision(row, moe) is None:
        return "precision"
    return None


def admitted(frame):
    """The rows kvbench replays, and a count of the others by reason (a pandas Series, REASONS'
    order)."""
    import pandas as pd

    reasons = frame.apply(_refusal, axis=1) if len(frame) else pd.Series([], dtype=object)
    counts = pd.Series(reasons.dropna()).value_counts()
    counts = counts.reindex([r for r in REASONS if r in counts.index])
    counts.name = "rows"
    return frame[reasons.isna()].copy(), counts


def select(frame, models: list[str] | None, systems: list[str] | None, backends: list[str] | None, limit: int | None):
    for column, wanted in (("model_path", models), ("system", systems), ("backend", backends)):
        if wanted:
            unknown = sorted(set(wanted) - set(frame[column]))
            if unknown:
                raise ConfigError(
                    f"--{column.split('_')[0]} {unknown[0]!r} matches no admitted row: "
                    f"choose from {', '.join(sorted(set(frame[column])))}"
                )
            frame = frame[frame[column].isin(wanted)]
    if limit is not None:
        frame = frame.head(limit)
    return frame


@dataclass(frozen=True)
class Replay:
    """The kvbench overrides that replay one silicon row on one clock."""

    row_id: str
    clock: str  #: profiled (the engine's measured kernel) or roofline (kernel=torch)
    overrides: tuple[str, ...]


def layout_overrides(row, model: str) -> list[str]:
    """``model.tp``, and for a MoE model ``model.attention_dp`` and ``model.ep`` (a dense model's
    config has no use for them, and leaving them out keeps its overrides what they always were)."""
    out = [f"model.tp={int(row['tp_size'])}"]
    if is_moe(model):
        out += [f"model.attention_dp={_size(row['attention_dp_size'])}", f"model.ep={_size(row['moe_ep_size'])}"]
    return out


def replay(row, clock: str) -> Replay:
    """The run that replays an admitted row: the deployment's client (``batch_size`` per
    attention-DP rank, so ``batch_size x attention_dp`` in all; see the module's docstring)."""
    per_rank, isl, osl = int(row["batch_size"]), int(row["isl"]), int(row["osl"])
    model = MODELS[row["model_path"]]
    moe = is_moe(model)
    concurrency = per_rank * (_size(row["attention_dp_size"]) if moe else 1)
    part = precision(row, moe)
    if part is None:
        raise ConfigError(f"silicon row {row['id']}: its quant modes are not mapped (see silicon.REASONS)")
    kernel = kernel_for(row["backend"], row["system"]) if clock == "profiled" else "torch"
    overrides = [
        f"model={model}",
        f"model.dtype={part.dtype}",
        f"model.kv_dtype={part.kv_dtype}",
        *layout_overrides(row, model),
        *([f"model.moe_dtype={part.moe_dtype}"] if moe else []),
        f"hardware={HARDWARE[row['system']]}",
        "hardware.kv_budget_bytes=null",
        f"kernel={kernel}",
        "scheduler=chunked",
        f"scheduler.max_num_batched_tokens={MAX_NUM_BATCHED_TOKENS}",
        f"scheduler.max_num_seqs={max(per_rank, 1)}",  # per engine: one rank's share is batch_size
        "workload=closed_loop",
        f"workload.max_concurrency={concurrency}",
        f"workload.num_requests={WAVES * concurrency}",
        f"workload.prompt_tokens={isl}",
        f"workload.output_tokens={osl}",
        f"workload.s_max_tokens={isl + osl}",
        "progress=false",
        "output.write=false",
        "wandb.mode=disabled",
    ]
    if clock == "profiled":
        overrides.append(f"kernel.gemm={part.gemm}")
    return Replay(str(row["id"]), clock, tuple(overrides))
