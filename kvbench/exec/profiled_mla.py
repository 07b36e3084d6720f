"""Multi-head latent attention (MLA) and DeepSeek sparse attention (DSA) priced from measured tables.

Two ways the tables measure an MLA layer, and which framework has which:

- **Module tables** (``mla/<fw>/<ver>/mla_generation_module_perf`` and ``mla_context_module_perf``,
  vLLM and TRT-LLM): the whole attention block of one layer (the q/kv down- and up-projections,
  the absorbed BMMs, the attention kernel and the output projection) timed together, by batch
  size and context length (``step``) for decode and by prompt length (``isl``) for prefill, at
  ``num_heads`` per GPU, the projections' GEMM dtype (``gemm_type``) and the KV dtype. They were
  measured on DeepSeek-V3's projection shapes (hidden 7168, q_lora 1536, kv_lora 512, rope 64,
  nope 128, v 128), so they price a model with those dimensions (DeepSeek-V3/R1, Kimi-K2.5) and
  nothing else. Sparse attention is measured the same way
  (``sparse_attention/<fw>/<ver>/dsa_generation_module_perf`` and ``dsa_context_module_perf``,
  the indexer and its top-k included) per model (DeepSeek-V3.2, GLM-5).
- **Kernel tables** (SGLang: ``generation_mla_perf`` and ``context_mla_perf``, the attention
  kernel alone, by the same axes): kvbench adds the projection GEMMs from the GEMM table and, for
  decode, the two absorbed BMMs from ``mla_bmm/<fw>/<ver>/mla_bmm_perf`` (``mla_gen_pre``: q_nope
  times W_UK, ``mla_gen_post``: the latent output times W_UV, by tokens and heads per GPU).

The grids are :class:`kvbench.exec.profiled.DecodeAttentionGrid` and
:class:`~kvbench.exec.profiled.PrefillAttentionCurve` over these rows, so decode and prefill
interpolate and extrapolate (counted) as dense attention does.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import ConfigError
from kvbench.specs import profiles

#: DeepSeek-V3's MLA projection shapes, on which the module tables were measured
MODULE_SHAPE = dict(
    hidden_size=7168, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128
)

#: the attention kernel each framework runs by default, in order of preference, where a table
#: measured several (another measured kernel is taken only when none of these is)
PREFERRED_MLA_KERNELS = (
    "FLASHMLA",
    "FLASHINFER_MLA",
    "default",
    "flash_attention",
    "trtllm_mla",
    "FLASH_ATTN_MLA",
    "FLASH_ATTN",
    "FLASHMLA_SPARSE",
    "sglang_dsa_indexer_flashmla_kv",
    "sglang_dsa_indexer_fa3",
    "sglang_dsa_indexer_trtllm",
)


@dataclass(frozen=True)
class MLARows:
    """The decode and prefill rows of one MLA (or DSA) layer on one GPU, and what they include."""

    label: str
    decode: object  #: pandas DataFrame with batch_size, step, latency (ms)
    prefill: object  #: pandas DataFrame with batch_size, isl, latency (ms)
    #: True when the rows time the whole attention block (projections and BMMs included)
    includes_projections: bool


def _pick_kernel(frame) -> str:
    present = frame["kernel_source"].value_counts()
    for source in PREFERRED_MLA_KERNELS:
        if source in present.index:
            return source
    return sorted(present.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def _pick_prefill_kernel(frame) -> str:
    """The prefill kernel: of the kernels that measured the longest prompts at this shape, the one
    :func:`_pick_kernel` prefers. A module table also names the decode kernel on its shortest
    prompts (vLLM runs a query of up to a few hundred tokens through the decode backend: FLASHMLA to
    isl 128, FLASH_ATTN_MLA to 512 on Hopper, FLASHINFER_MLA at isl 1 on Blackwell) and SGLang's
    dense-MHA path below the indexer's top-k (to isl 2048); priced from those rows a real prompt
    would be extrapolated at every length, so the kernel measured over full prompts is taken
    (vLLM's prefill backend: FLASH_ATTN, or TRTLLM_RAGGED for an FP8 prefill)."""
    longest = frame.groupby("kernel_source")["isl"].max()
    return _pick_kernel(frame[frame["kernel_source"].isin(longest[longest == longest.max()].index)])


def _filter(frame, **columns):
    for column, value in columns.items():
        if column in frame.columns:
            frame = frame[frame[column] == value]
    return frame


def _refuse(where: str, what: str, frame, asked: dict) -> ConfigError:
    """One line naming what the table measured for the first column that ruled every row out."""
    rows = frame
    for column, value in asked.items():
        if column not in rows.columns:
            continue
        kept = rows[rows[column] == value]
        if kept.empty:
            measured = sorted({str(v) for v in rows[column].unique()})
            hint = f" ({profiles.INSTALL_HINT} for the full tables)" if profiles.table_root().excerpt else ""
            return ConfigError(f"{where} has no {what} for {column}={value}: measured {', '.join(measured)}{hint}")
        rows = kept
    return ConfigError(f"{where} has no {what} for {asked}")


def _newest(system: str, op: str, framework: str, table: str) -> str | None:
    found = profiles.versions(system, op, framework, table)
    return found[-1] if found else None


def module_matches(mla) -> bool:
    """Whether an MLA shape is the one the module tables measured (DeepSeek-V3's projections)."""
    return all(getattr(mla, k, None) == v for k, v in MODULE_SHAPE.items() if k != "hidden_size")


def select_module(
    system: str,
    framework: str,
    op: str,
    tables: tuple[str, str],
    *,
    heads_per_gpu: int,
    gemm_type: str,
    kv_dtype: str,
    model_id: str | None = None,
) -> MLARows | None:
    """Module rows (``op`` = ``mla`` or ``sparse_attention``) at this shape, None when the framework
    has no module table on this GPU; a one-line ConfigError for a shape or precision not measured."""
    gen_table, ctx_table = tables
    version = _newest(system, op, framework, gen_table)
    if version is None or version not in profiles.versions(system, op, framework, ctx_table):
        return None
    where = f"{profiles.table_root().label} {system}/{op}/{framework}/{version}"
    frames = []
    for table in (gen_table, ctx_table):
        frame = profiles.read_table(system, op, framework, version, table)
        asked = dict(num_heads=heads_per_gpu, gemm_type=gemm_type, kv_cache_dtype=kv_dtype, mla_dtype="bfloat16")
        if model_id is not None:
            asked = {"model": model_id, **asked}
        rows = _filter(frame, **asked)
        if rows.empty:
            raise _refuse(where, f"{table} rows", frame, asked)
        frames.append(rows)
    decode, prefill = frames
    decode = decode[decode["kernel_source"] == _pick_kernel(decode)]
    prefill = prefill[prefill["kernel_source"] == _pick_prefill_kernel(prefill)]
    label = f"{op} module {decode['kernel_source'].iloc[0]}/{prefill['kernel_source'].iloc[0]} {gemm_type} {version}"
    return MLARows(label, decode, prefill, includes_projections=True)


def select_kernel_rows(system: str, framework: str, *, heads_per_gpu: int, kv_dtype: str) -> MLARows:
    """The MLA attention kernel's own rows (SGLang's tables): projections and BMMs priced apart."""
    version = profiles.newest_version(system, "mla", framework, "generation_mla_perf", "MLA attention")
    where = f"{profiles.table_root().label} {system}/mla/{framework}/{version}"
    frames = []
    for table in ("generation_mla_perf", "context_mla_perf"):
        frame = profiles.read_table(system, "mla", framework, version, table)
        asked = dict(num_heads=heads_per_gpu, kv_cache_dtype=kv_dtype, mla_dtype="bfloat16")
        rows = _filter(frame, **asked)
        if rows.empty:
            raise _refuse(where, f"{table} rows", frame, asked)
        # the same heads per GPU may be measured at several TP sizes: the smallest TP's
        rows = rows[rows["tp_size"] == rows["tp_size"].min()]
        frames.append(rows[rows["kernel_source"] == _pick_kernel(rows)])
    decode, prefill = frames
    return MLARows(f"mla {decode['kernel_source'].iloc[0]} {version}", decode, prefill, includes_projections=False)


def select_bmm(system: str, framework: str, *, heads_per_gpu: int, bmm_dtype: str):
    """The absorbed BMMs of MLA decode (pre: q_nope x W_UK, post: latent x W_UV), by tokens."""
    version = profiles.newest_version(system, "mla_bmm", framework, "mla_bmm_perf", "MLA BMMs")
    frame = profiles.read_table(system, "mla_bmm", framework, version, "mla_bmm_perf")
    where = f"{profiles.table_root().label} {system}/mla_bmm/{framework}/{version}"
    out = []
    for op_name in ("mla_gen_pre", "mla_gen_post"):
        asked = dict(op_name=op_name, bmm_dtype=bmm_dtype, num_heads=heads_per_gpu)
        rows = _filter(frame, **asked)
        if rows.empty:
            raise _refuse(where, "MLA BMM rows", frame, asked)
        out.append(rows)
    return out[0], out[1], f"mla_bmm {bmm_dtype} {version}"


def granular_gemm_shapes(mla, num_heads: int, hidden_size: int, tp: int) -> tuple[list, list]:
    """The projection GEMMs (n, k) per GPU that a kernel-table MLA layer adds, for decode (the
    kv up-projection absorbed into the BMMs) and for prefill (kv up-projection run as a GEMM)."""
    heads = num_heads // tp
    q_width = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.q_lora_rank:
        down = [
            (mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim, hidden_size),
            (heads * q_width, mla.q_lora_rank),
        ]
    else:
        down = [(mla.kv_lora_rank + mla.qk_rope_head_dim, hidden_size), (heads * q_width, hidden_size)]
    out_proj = (hidden_size, heads * mla.v_head_dim)
    kv_up = (heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank)
    return [*down, out_proj], [*down, kv_up, out_proj]
