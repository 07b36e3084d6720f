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

Disaggregated rows (``mode == disagg``, 1,602 of the 5,221 rows of aiconfigurator-core 0.12.0).
Prefill and decode run on separate workers; the aggregated layout columns are empty and each role
has its own: ``{prefill,decode}_{tp,pp,attention_dp,moe_tp,moe_ep}_size`` (all 1,602 rows),
``{prefill,decode}_num_workers`` and ``{prefill,decode}_batch_size`` (274 rows). The meaning is
aiconfigurator's (``DisaggInferenceSession.run_disagg`` of the ``aiconfigurator`` package, over
``run_static`` of aiconfigurator-core): a role's batch size is per attention-DP rank of one of
its workers (``run_static``: ``global_bs = batch_size x attention_dp_size``), a deployment holds
``prefill_num_workers`` prefill workers and ``decode_num_workers`` decode workers, each worker
``tp x attention_dp`` GPUs, and its concurrency is ``decode_batch_size x decode_attention_dp_size
x decode_num_workers`` (the decode side holds every request in flight). The sample agrees: its
``silicon_concurrency`` equals that product on 267 of the 274 rows that give the workers; the
other 7 (Qwen3 on H100, 4000/1000 tokens) give no ``silicon_concurrency``, and the product is
their client's concurrency. ``prefill_batch_size`` is 1 on all 274. The other 1,328 rows
(the 2026-03-25 and 2026-04-06 source files: DeepSeek-R1, GLM-5, gpt-oss-120b, part of
Kimi-K2.5) give each role's layout and the client's concurrency but no worker counts and no batch
sizes: how many decode workers share the concurrency, so how large a decode batch each runs, is
not recorded, and those rows are refused (``unknown-workers``) rather than guessed.

aiconfigurator's own disagg TTFT is the prefill worker's ``static_ctx`` TTFT at
``prefill_batch_size`` times 1.1 (the CLI's ``DEFAULT_PREFILL_LATENCY_CORRECTION_SCALE``) times
1.8 (``_AUTOSCALE_TTFT_CORRECTION_FACTOR``, "concurrent prefill queueing"); its TPOT is the
decode worker's ``static_gen`` TPOT at ``decode_batch_size`` times 1.08
(``DEFAULT_DECODE_LATENCY_CORRECTION_SCALE``). The KV transfer is not priced, and the worker
counts enter only its throughput (rate matching with 0.9 and 0.92 degradation factors), never
its TTFT or TPOT (:mod:`kvbench.validation.aic` reproduces this with the core's ``run_static``).

A disaggregated row becomes one kvbench run of ``deployment=disagg`` (:func:`disagg_replay`):
the same model, precision, hardware and kernel as an aggregated row, each role's layout
(``deployment.{prefill,decode}.{tp,attention_dp,ep}``), ``deployment.prefill.max_num_seqs =
prefill_batch_size`` with ``max_num_batched_tokens = prefill_batch_size x isl`` (a prefill worker
computes its batch of whole prompts in one step, as aiconfigurator's ``static_ctx`` prices it),
``deployment.decode.max_num_seqs = decode_batch_size``, the KV moved after the prefill over the
link the loop picks (``auto``), requests routed round-robin, and the closed-loop client at the
row's concurrency. Both batch sizes are per attention-DP rank, as ``max_num_seqs`` is in the
engines: a worker with ``attention_dp = n`` is n engines in the deployment (:mod:`kvbench.app.disagg`),
one per rank with its own KV cache and batch, among which the router spreads the requests (the
MoE layers priced at the tokens of all n, as for an aggregated row). The simulated deployment is the row's divided by
``g = gcd(prefill_num_workers, decode_num_workers, concurrency)``: with identical requests and
round-robin routing every worker of a role takes the same share, so g copies of a
``P/g``-prefill, ``D/g``-decode deployment at concurrency ``C/g`` are the row's deployment, and one
copy costs g times less to simulate. A worker is refused (``multinode``) when its ``tp x
attention_dp`` exceeds its system's NVLink domain (:func:`nvlink_domain_gpus`: a GB200/GB300
NVL72 rack's 72 GPUs, whose compute trays of 4 the package's ``num_gpus_per_node`` counts;
8 GPUs on the HGX systems).

Nothing here is fitted to the rows: every number a replay prints comes from the model's config,
the hardware config and the measured kernel tables; the one constant ``kvbench validate`` learns
from them, a per-step host overhead per framework, is added after the replays, held out by group
(:mod:`kvbench.validation.overhead`, :data:`FITTED`).
"""

from __future__ import annotations

import functools
import math
import re
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
#: requests the closed-loop client sends by default, in multiples of its concurrency (``kvbench
#: validate --waves``; :mod:`kvbench.validation.client` says what the client's defaults assume)
WAVES = 5
#: the token budget per step of chunked prefill in the three engines' serving defaults
MAX_NUM_BATCHED_TOKENS = 8192
CSV_NAME = "silicon_sample.csv"
#: the columns of the layout and the experts' precision, read where present (an excerpt written
#: before they were needed lacks them; missing means unset: 1, or the checkpoint's own precision)
LAYOUT_COLUMNS = ("moe_quant_mode", "attention_dp_size", "moe_tp_size", "moe_ep_size")
#: a disaggregated row's layout per role (ROLES), and the client's concurrency inside
#: silicon_data_source; read where present (missing: the row is an aggregated one's excerpt)
ROLES = ("prefill", "decode")
ROLE_FIELDS = ("batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
DISAGG_COLUMNS = ("silicon_data_source", *(f"{role}_{field}" for role in ROLES for field in ROLE_FIELDS))
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
    *DISAGG_COLUMNS,
)
#: how a disaggregated replay moves the KV and routes requests: after the prefill (TRT-LLM's KV
#: cache transceiver and SGLang's PD transfer send a request's KV once its prefill is done) and
#: round-robin (every request is alike, so no router has anything to choose by)
DISAGG_TRANSFER = "after_prefill"
DISAGG_ROUTER = "round_robin"
#: every reason a row is not replayed, one word each, in the order they are checked
REASONS = {
    "unmodelled-model": "the checkpoint has no kvbench model config (MODELS, conf/model/)",
    "unmodelled-gpu": "the GPU has no kvbench hardware config or no measured tables (profiles.SYSTEMS)",
    "unmeasured-engine": "the engine's kernel is not measured on this GPU (KERNELS, the kernel's tables)",
    "incomplete": "a measurement, the concurrency, a length or the TP size (of each role, if disaggregated) is missing",
    "unknown-workers": "a disaggregated row without its worker counts and batch sizes: the deployment is not recorded",
    "pipeline": "pipeline parallelism (pp_size > 1, of either role)",
    "multinode": "more GPUs (tp x attention_dp) than one node of the system holds, beyond what the comm tables "
    "measure; for a disaggregated worker, more than its NVLink domain",
    "layout": "tp x attention_dp differs from moe_tp x moe_ep (of either role), or a dense model with attention DP",
    "precision": "a quant mode kvbench does not map, or a gpt-oss row not in its checkpoint's MXFP4",
}
#: what was learned from the silicon rows (the report prints this statement)
FITTED = (
    "fitted: one per-step host overhead h per framework (vllm, sglang, trtllm), minimising the median "
    "TPOT error of its aggregated rows, clamped at 0 (kvbench.validation.overhead). Held-out: each group "
    "(model, GPU, framework) is priced with the h fitted on the other groups of its framework; in-sample: "
    "one h from all. 'profiled h=0' is the replay itself: priced from the model and hardware configs and "
    "the measured kernel tables alone, nothing learned from the rows."
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
def config_exists(group: str, name: str) -> bool:
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
    optional = (*LAYOUT_COLUMNS, *DISAGG_COLUMNS)
    missing = [c for c in COLUMNS if c not in frame.columns and c not in optional]
    if missing:
        raise ConfigError(f"{path} lacks the columns {', '.join(missing)}: is {root.label} the version kvbench reads?")
    for column in optional:
        if column not in frame.columns:
            frame[column] = math.nan
    return frame, f"{root.label} {CSV_NAME}"


@functools.cache
def nvlink_domain_gpus(system: str) -> int | None:
    """The GPUs one NVLink domain of the package's ``<system>.yaml`` joins
    (:func:`kvbench.specs.profiles.nvlink_domain_gpus`: 72 for GB200/GB300 NVL72, else
    ``num_gpus_per_node``; None without the file)."""
    return profiles.nvlink_domain_gpus(system)


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(float(value)) and float(value) > 0


def silicon_concurrency(row) -> int | None:
    """The client's concurrency that ``silicon_data_source`` records, or None."""
    match = re.search(r"silicon_concurrency=(\d+)", _text(row.get("silicon_data_source")) or "")
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Role:
    """One role of a disaggregated row, as the sample gives it (see the module's docstring)."""

    workers: int  #: {role}_num_workers
    batch: int  #: {role}_batch_size: requests per attention-DP rank of one worker
    tp: int
    attention_dp: int
    moe_tp: int | None  #: None: unset (whatever tp x attention_dp / ep leaves)
    ep: int
    pp: int

    @property
    def gpus(self) -> int:
        return self.tp * self.attention_dp


def role(row, name: str) -> Role:
    """The ``prefill`` or ``decode`` role of a disaggregated row (missing sizes read as 1)."""
    column = lambda field: row.get(f"{name}_{field}")  # noqa: E731
    return Role(
        workers=_size(column("num_workers")),
        batch=_size(column("batch_size")),
        tp=_size(column("tp_size")),
        attention_dp=_size(column("attention_dp_size")),
        moe_tp=_size(column("moe_tp_size")) if _is_set(column("moe_tp_size")) else None,
        ep=_size(column("moe_ep_size")),
        pp=_size(column("pp_size")),
    )


def disagg_concurrency(row) -> int:
    """The deployment's concurrency: the sample's ``silicon_concurrency``, else aiconfigurator's
    ``decode_batch_size x decode_attention_dp_size x decode_num_workers`` (equal on every row that
    gives both)."""
    given = silicon_concurrency(row)
    if given is not None:
        return given
    decode = role(row, "decode")
    return decode.batch * decode.attention_dp * decode.workers


def _disagg_refusal(row, model: str) -> str | None:
    """The reason a disaggregated row is not replayed (after its model, GPU and engine), or None."""
    if not all(_positive(row[c]) for c in ("silicon_ttft_ms", "silicon_tpot_ms", "isl", "osl")) or not all(
        _positive(row.get(f"{name}_tp_size")) for name in ROLES
    ):
        return "incomplete"
    counts = [f"{name}_{field}" for name in ROLES for field in ("num_workers", "batch_size")]
    if not all(_positive(row.get(c)) for c in counts):
        return "unknown-workers"
    roles = [role(row, name) for name in ROLES]
    if any(r.pp != 1 for r in roles):
        return "pipeline"
    domain = nvlink_domain_gpus(row["system"])
    if domain is not None and any(r.gpus > domain for r in roles):
        return "multinode"
    moe = is_moe(model)
    for r in roles:
        if moe and r.gpus != (r.moe_tp if r.moe_tp is not None else r.gpus // r.ep) * r.ep:
            return "layout"
        if not moe and r.attention_dp > 1:
            return "layout"
    if precision(row, moe) is None:
        return "precision"
    return None


def _refusal(row) -> str | None:
    """The one word (a key of REASONS) that says why kvbench cannot replay ``row``, or None."""
    if row["mode"] not in ("agg", "disagg"):
        return "incomplete"
    model = MODELS.get(row["model_path"])
    if model is None or not config_exists("model", model):
        return "unmodelled-model"
    hardware = HARDWARE.get(row["system"])
    if hardware is None or not config_exists("hardware", hardware) or profiles.SYSTEMS.get(hardware) != row["system"]:
        return "unmodelled-gpu"
    if kernel_for(row["backend"], row["system"]) is None:
        return "unmeasured-engine"
    if row["mode"] == "disagg":
        return _disagg_refusal(row, model)
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


def select(
    frame,
    models: list[str] | None,
    systems: list[str] | None,
    backends: list[str] | None,
    limit: int | None,
    modes: list[str] | None = None,
    tps: list[int] | None = None,
):
    if tps:
        # an aggregated row's TP; a disaggregated row's TP is per role, and it has no tp_size
        frame = frame[frame["tp_size"].isin(tps)]
    for column, wanted in (("model_path", models), ("system", systems), ("backend", backends), ("mode", modes)):
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


#: how a replay schedules (``kvbench validate --schedulers``): ``shared`` (the default), kvbench's
#: chunked prefill at 8,192 tokens a step for all three engines, or ``framework``, each engine's own
#: admission rule with its default limits (:mod:`kvbench.validation.frameworks`: vLLM V1's token
#: budget, SGLang's prefill/decode alternation under its new-token ratio, TRT-LLM's
#: GUARANTEED_NO_EVICT capacity scheduler). ``framework`` is not the default: over all rows it
#: halves the TTFT error of TRT-LLM's Llama-3.1-70B groups but triples SGLang's on four groups
#: (docs/engine.md, "Each framework's admission rule")
SCHEDULERS = ("shared", "framework")


def replay(row, clock: str, waves: int = WAVES, schedulers: str = "shared") -> Replay:
    """The run that replays an admitted row: the deployment's client (``batch_size`` per
    attention-DP rank, so ``batch_size x attention_dp`` in all; see the module's docstring),
    sending ``waves`` times its concurrency."""
    if row["mode"] == "disagg":
        return disagg_replay(row, clock, waves)
    per_rank, isl, osl = int(row["batch_size"]), int(row["isl"]), int(row["osl"])
    model = MODELS[row["model_path"]]
    moe = is_moe(model)
    concurrency = per_rank * (_size(row["attention_dp_size"]) if moe else 1)
    overrides = [
        *_engine_overrides(row, model, moe, clock, layout_overrides(row, model)),
        f"scheduler.max_num_seqs={max(per_rank, 1)}",  # per engine: one rank's share is batch_size
        *_client_overrides(concurrency, waves * concurrency, isl, osl),
    ]
    if schedulers == "framework":
        from kvbench.validation.frameworks import replace_scheduler

        overrides = replace_scheduler(overrides, row["backend"], row["system"])
    elif schedulers != "shared":
        raise ConfigError(f"schedulers={schedulers!r}: choose one of {', '.join(SCHEDULERS)}")
    return Replay(str(row["id"]), clock, tuple(_with_gemm(overrides, row, moe, clock)))


def _engine_overrides(row, model: str, moe: bool, clock: str, layout: list[str]) -> list[str]:
    """The model, its precision per part (``layout`` between them), the GPU, the clock's kernel and
    the engines' shared chunked-prefill defaults: what an aggregated and a disaggregated replay share."""
    part = precision(row, moe)
    if part is None:
        raise ConfigError(f"silicon row {row['id']}: its quant modes are not mapped (see silicon.REASONS)")
    kernel = kernel_for(row["backend"], row["system"]) if clock == "profiled" else "torch"
    return [
        f"model={model}",
        f"model.dtype={part.dtype}",
        f"model.kv_dtype={part.kv_dtype}",
        *layout,
        *([f"model.moe_dtype={part.moe_dtype}"] if moe else []),
        f"hardware={HARDWARE[row['system']]}",
        "hardware.kv_budget_bytes=null",
        f"kernel={kernel}",
        "scheduler=chunked",
        f"scheduler.max_num_batched_tokens={MAX_NUM_BATCHED_TOKENS}",
    ]


def _client_overrides(concurrency: int, num_requests: int, isl: int, osl: int) -> list[str]:
    """The closed-loop client of exactly ``isl`` + ``osl`` tokens, and a run that writes nothing."""
    return [
        "workload=closed_loop",
        f"workload.max_concurrency={concurrency}",
        f"workload.num_requests={num_requests}",
        f"workload.prompt_tokens={isl}",
        f"workload.output_tokens={osl}",
        f"workload.s_max_tokens={isl + osl}",
        "progress=false",
        "output.write=false",
        "wandb.mode=disabled",
    ]


def _with_gemm(overrides: list[str], row, moe: bool, clock: str) -> list[str]:
    """The profiled clock's GEMM table in the dense weights' precision (last, as always)."""
    return [*overrides, f"kernel.gemm={precision(row, moe).gemm}"] if clock == "profiled" else overrides


def _role_overrides(name: str, r: Role, moe: bool) -> list[str]:
    """``deployment.<role>.*``: the layout (attention DP and EP for a MoE model only, as for an
    aggregated row) and the per-rank sequence cap."""
    out = [f"deployment.{name}.tp={r.tp}"]
    if moe:
        out += [f"deployment.{name}.attention_dp={r.attention_dp}", f"deployment.{name}.ep={r.ep}"]
    return [*out, f"deployment.{name}.max_num_seqs={r.batch}"]


def disagg_replay(row, clock: str, waves: int = WAVES) -> Replay:
    """The ``deployment=disagg`` run that replays an admitted disaggregated row: its workers, each
    role's layout and batch, and its client, divided by the gcd of the worker counts and the
    concurrency (see the module's docstring)."""
    isl, osl = int(row["isl"]), int(row["osl"])
    model = MODELS[row["model_path"]]
    moe = is_moe(model)
    prefill, decode = role(row, "prefill"), role(row, "decode")
    concurrency = disagg_concurrency(row)
    copies = math.gcd(prefill.workers, decode.workers, concurrency)
    overrides = [
        *_engine_overrides(row, model, moe, clock, []),
        "deployment=disagg",
        f"deployment.prefill_workers={prefill.workers // copies}",
        f"deployment.decode_workers={decode.workers // copies}",
        f"deployment.transfer={DISAGG_TRANSFER}",
        "deployment.link=auto",
        *_role_overrides("prefill", prefill, moe),
        # the prefill worker's batch of whole prompts is one step (aiconfigurator's static_ctx)
        f"deployment.prefill.max_num_batched_tokens={prefill.batch * isl}",
        *_role_overrides("decode", decode, moe),
        f"router={DISAGG_ROUTER}",
        *_client_overrides(concurrency // copies, waves * concurrency // copies, isl, osl),
    ]
    return Replay(str(row["id"]), clock, tuple(_with_gemm(overrides, row, moe, clock)))
