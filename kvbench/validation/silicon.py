"""Public end-to-end measurements of real engines, and the kvbench run that replays each one.

aiconfigurator-core's ``systems/silicon_sample.csv`` holds TTFT and TPOT measured on real vLLM,
SGLang and TRT-LLM deployments (one row per model, GPU, engine and version, precision, prompt
and output length ``isl``/``osl``, client concurrency ``batch_size`` and tensor parallelism). kvbench
replays the rows it can model: aggregated serving (prefill and decode on the same GPUs), no
pipeline parallelism, a dense model it has a config for, a GPU with measured tables, TP 1-8.

A row becomes one kvbench run: the model at the row's precision (``fp8``: FP8 weights, the GEMM
kind the row names, and an FP8 KV cache, as the FP8 checkpoints of these models quantize it),
the engine's measured kernel, the closed-loop client of ``vllm bench serve --max-concurrency``
(``batch_size`` requests in flight, each of exactly ``isl`` prompt and ``osl`` output tokens),
and the engines' shared scheduling defaults: chunked prefill with 8,192 tokens per step and no
cap on sequences below the concurrency. The client sends ``WAVES`` times the concurrency and
every request counts, as ``vllm bench serve`` counts them (no warm-up): the sample does not
record how many requests each benchmark sent, and the mean TTFT depends on it (the first wave
arrives at once and queues behind its own prompts; later requests join a running batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.errors import ConfigError
from kvbench.specs import profiles

#: the silicon rows' model -> kvbench's model config and how its weights are stored
MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama3.1-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama3.1-8b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "meta-llama/Llama-3.1-70B": "llama3.1-70b",
}
#: the package's system -> kvbench's hardware config
HARDWARE = {system: name for name, system in profiles.SYSTEMS.items()}
#: engine -> kvbench's measured kernel on each system (its FlashAttention build there)
KERNELS = {
    "vllm": {"a100_sxm": "vllm_fa2", "h100_sxm": "vllm_fa3", "h200_sxm": "vllm_fa3"},
    "sglang": {"h100_sxm": "sglang_fa3", "h200_sxm": "sglang_fa3"},
    "trtllm": {"a100_sxm": "trtllm", "h100_sxm": "trtllm", "h200_sxm": "trtllm"},
}
#: requests the closed-loop client sends, in multiples of its concurrency
WAVES = 5
#: the token budget per step of chunked prefill in the three engines' serving defaults
MAX_NUM_BATCHED_TOKENS = 8192
CSV_NAME = "silicon_sample.csv"
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
)


def read_silicon():
    """The measurements (pandas DataFrame) and the words that name their source."""
    import pandas as pd

    root = profiles.table_root()
    path = root.systems_dir / CSV_NAME if not root.excerpt else profiles.EXCERPT_DIR / CSV_NAME
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError(f"{path} lacks the columns {', '.join(missing)}: is {root.label} the version kvbench reads?")
    return frame, f"{root.label} {CSV_NAME}"


def _refusal(row) -> str | None:
    """Why kvbench cannot replay ``row``, or None."""
    if row["mode"] != "agg":
        return "disaggregated serving"
    if row["model_path"] not in MODELS:
        return "model without a kvbench config (MoE or other)"
    if row["system"] not in HARDWARE:
        return "GPU without measured tables here"
    if row["backend"] not in KERNELS or row["system"] not in KERNELS[row["backend"]]:
        return "engine not measured on this GPU"
    if not (row["pp_size"] == 1 and row["tp_size"] in range(1, 9)):
        return "pipeline parallelism or TP beyond 8"
    if str(row["precision"]) not in ("fp8", "bf16", "nan"):
        return f"precision {row['precision']}"
    if any(math.isnan(float(row[c])) for c in ("silicon_ttft_ms", "silicon_tpot_ms", "batch_size", "isl", "osl")):
        return "incomplete measurement"
    return None


def admitted(frame):
    """The rows kvbench replays, and a count of the others by reason (a pandas Series)."""
    import pandas as pd

    reasons = frame.apply(_refusal, axis=1)
    return frame[reasons.isna()].copy(), pd.Series(reasons.dropna()).value_counts()


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


def replay(row, clock: str) -> Replay:
    concurrency, isl, osl, tp = int(row["batch_size"]), int(row["isl"]), int(row["osl"]), int(row["tp_size"])
    fp8 = str(row["precision"]) == "fp8"
    gemm = {"fp8": "fp8", "fp8_block": "fp8_block"}.get(str(row["gemm_quant_mode"]), "fp8" if fp8 else "bfloat16")
    kernel = KERNELS[row["backend"]][row["system"]] if clock == "profiled" else "torch"
    overrides = [
        f"model={MODELS[row['model_path']]}",
        f"model.dtype={'float8' if fp8 else 'bfloat16'}",
        f"model.kv_dtype={'float8' if fp8 else 'bfloat16'}",
        f"model.tp={tp}",
        f"hardware={HARDWARE[row['system']]}",
        "hardware.kv_budget_bytes=null",
        f"kernel={kernel}",
        "scheduler=chunked",
        f"scheduler.max_num_batched_tokens={MAX_NUM_BATCHED_TOKENS}",
        f"scheduler.max_num_seqs={max(concurrency, 1)}",
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
        overrides.append(f"kernel.gemm={gemm}")
    return Replay(str(row["id"]), clock, tuple(overrides))
